"""Every statement of the portable SQL workflow store, each under a name.

Kept apart from :mod:`.sql` (the store's behaviour) so each statement can be
read, compiled and EXPLAINed on its own, and found by name
(:meth:`Statements.named`): tests, EXPLAIN checks and traces say
``"claim"``, never an attribute. What a dialect does differently lives in its
subclass (:mod:`.statements_postgres`, :mod:`.statements_mysql`). Times are
epoch milliseconds on the database's clock (the ``clock`` each dialect
passes in); a pass that must use one 'now' for several rows binds ``p_now``,
read earlier in its transaction.

The statements are built by family, each family in its own module
(:mod:`.statements_runs`, :mod:`.statements_claims`, :mod:`.statements_pass`,
:mod:`.statements_sweep`), written in the terms of :mod:`.statements_terms`;
:class:`Statements` puts them together under their names.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from .statements_claims import ClaimStatements
from .statements_pass import PassStatements
from .statements_prune import prune_statements
from .statements_runs import LIST_SHAPES, RUN_FILTERS, RunStatements
from .statements_sweep import SweepStatements
from .statements_terms import _p


class Statements(RunStatements, ClaimStatements, PassStatements, SweepStatements):
    """Every statement the portable store runs, built once per dialect's clock."""

    def __init__(self, clock: ColumnElement[int]) -> None:
        now = clock
        at = _p("now", sa.BigInteger())  # a DB-clock 'now' read earlier in the transaction
        self.now = sa.select(now)
        self._runs(now, at)
        self._steps(now, at)
        self._claims(now, at)
        self._outcomes(now, at)
        self._pass_writes(now, at)
        self._pass_view(now)
        self._sweep(now, at)
        self._in_flight()

    def named(self) -> dict[str, sa.ClauseElement]:
        """Every statement by name; a family built per shape (``list_runs``,
        a dialect's pass) under ``name[shape]``, each shape built here."""
        found: dict[str, sa.ClauseElement] = {}
        for name, value in vars(self).items():
            if isinstance(value, sa.ClauseElement):
                found[name] = value
            elif isinstance(value, dict):
                for key, member in value.items():
                    if isinstance(member, sa.ClauseElement):
                        found[f"{name}[{key}]"] = member
        for flags in itertools.product((False, True), repeat=5):
            shape = ",".join(f for f, on in zip(LIST_SHAPES, flags, strict=True) if on)
            found[f"list_runs[{shape}]"] = self.list_runs(*flags)
        for flags in itertools.product((False, True), repeat=3):
            shape = ",".join(f for f, on in zip(RUN_FILTERS[1:], flags, strict=True) if on)
            found[f"count_runs[{shape}]"] = self.count_runs(*flags)
            found[f"count_runs_capped[{shape}]"] = self.count_runs_capped(*flags)
        found.update(self._families())
        found.update(prune_statements().named())  # retention's, ``prune_*``
        return found

    def _families(self) -> Iterator[tuple[str, sa.ClauseElement]]:
        """A dialect's statement families, named by shape (none here)."""
        return iter(())
