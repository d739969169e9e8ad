"""Names, keys and payloads at the boundary, property-based, on every SQL dialect.

Idempotency keys, step names and signal names land in ``VARCHAR(255)``
columns; payloads (run input, step result, signal payload) in JSON text. For
any Unicode text (NUL, lone surrogates, leading and trailing spaces, case
variants, lengths 0 to 10,000 with a bias to the 255 boundary) the engine
over :class:`SQLWorkflowStore` on SQLite, PostgreSQL and MariaDB must either

* refuse a name with :class:`PayloadError` saying what is wrong, having
  written nothing, exactly when :func:`pikku_celery.names.check_name` rules
  it out (empty, too long, a NUL, a lone surrogate); or
* store it and read it back exactly, a name differing only by trailing
  spaces or case being another name.

Payloads (any JSON of such strings, as values and as keys) must read back
exactly, equal and with the same JSON types, or, when a string holds a
surrogate code point (not Unicode text), be refused with nothing written.
Names travel in a run's input as lists of code points, so a name is judged
by the name checks alone, not by what the payload checks make of a lone
surrogate.

Every example starts from empty tables and a fresh engine over the backend's
store, so examples never see each other's runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from pikku_celery.engine import Context, WorkflowEngine
from pikku_celery.errors import IdempotencyKeyReusedError, PayloadError
from pikku_celery.model.values import JSON, RunState, RunStatus, StepState
from pikku_celery.sql.schema import run_table, signal_table, step_table
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.store.conftest import wipe

SQL_BACKENDS = ["sqlite", "postgres", "mariadb"]

NAME_LIMIT = 255
SIGNAL_NAME_LIMIT = 248  # the wait is recorded as the step "signal:<name>"

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- the rules the boundary is expected to apply -----------------------------


def problems(value: str, limit: int) -> list[str]:
    """Why ``check_name`` must refuse ``value`` (every reason that applies)."""
    found: list[str] = []
    if not value:
        found.append("empty")
    if len(value) > limit:
        found.append("too long")
    if "\x00" in value:
        found.append("NUL")
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        found.append("lone surrogate")
    return found


def classify(value: str, reasons: list[str]) -> None:
    """Label the example for ``--hypothesis-show-statistics``: verdict and length band."""
    event("refused: " + ", ".join(reasons) if reasons else "accepted")
    n = len(value)
    band = "0" if n == 0 else "1-239" if n < 240 else "240-262" if n <= 262 else "263+"
    event(f"length {band}")


# Words a message must use to say what is wrong (any reason that applies).
REASON_WORDS: dict[str, tuple[str, ...]] = {
    "empty": ("empty",),
    "too long": ("long", "limit", "length"),
    "NUL": ("nul",),
    "lone surrogate": ("surrogate",),
}


def assert_says(message: str, subject: str, reasons: list[str]) -> None:
    """The message names what was refused (``subject``) and one reason that applies."""
    low = message.lower()
    assert subject in low, f"the message does not say it is about the {subject}: {message!r}"
    words = [w for r in reasons for w in REASON_WORDS[r]]
    assert any(w in low for w in words), f"the message says none of {reasons}: {message!r}"


def shape(value: JSON) -> Any:
    """The JSON types of ``value``, recursively (so ``True`` read back as ``1`` shows)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def assert_same_json(actual: JSON, expected: JSON, what: str) -> None:
    assert actual == expected, f"{what} read back differs: {actual!r} != {expected!r}"
    assert shape(actual) == shape(expected), f"{what} read back with other JSON types"


# --- strategies ----------------------------------------------------------------

ANY_CHAR = st.characters(codec=None)  # every code point, lone surrogates included
UNICODE_CHAR = st.characters(codec="utf-8")  # every code point but the surrogates
STORABLE_CHAR = st.characters(codec="utf-8", exclude_characters="\x00")
ASCII_LETTER = st.characters(codec="ascii", categories=("Lu", "Ll", "Nd"))

TRICKY = [
    "\x00",
    " ",
    "  ",
    "\t",
    "\n",
    "\u00a0",  # no-break space
    "\u3000",  # ideographic space
    "\ud800",
    "\udbff",
    "\udc00",
    "\udfff",
    "\ud83d\ude00",  # a high and a low surrogate: two code points, not U+1F600
    "\U0001f600",
    "\U0010ffff",
    "\u00df",  # sharp s: upper() is "SS"
    "\u1e9e",  # capital sharp s
    "\u0130",  # dotted capital I
    "\u0131",  # dotless i
    "\ufb00",  # ff ligature
    "\u00c5",  # A with ring, composed
    "A\u030a",  # A with ring, decomposed
    "'",
    '"',
    "\\",
    "%",
    "_",
]
PADS = st.sampled_from(["", " ", "  ", "\t", "\u00a0"])


def has_surrogate(value: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in value)


ALPHABETS: dict[str, tuple[st.SearchStrategy[str], list[str], list[str]]] = {
    # name: (characters, tricky fragments, units to repeat when the core is empty)
    "any": (ANY_CHAR, TRICKY, ["x", " ", "\x00", "\udc80"]),
    "unicode": (UNICODE_CHAR, [t for t in TRICKY if not has_surrogate(t)], ["x", " ", "\x00"]),
    "storable": (STORABLE_CHAR, [t for t in TRICKY if not problems(t, 10)], ["x", " "]),
}


@st.composite
def texts(
    draw: st.DrawFn,
    alphabet: str = "any",
    *,
    boundary: tuple[int, int] = (240, 262),
    long_max: int = 10_000,
) -> str:
    """Text of any kind: short, near the 255 boundary, or long (up to ``long_max``).

    ``alphabet``: "any" (lone surrogates and NUL too), "unicode" (NUL, no
    surrogates) or "storable" (neither). Long text repeats a drawn unit
    (Hypothesis cannot draw 10,000 characters one by one); cutting it to
    length may split a surrogate pair, which is wanted. Leading and trailing
    padding is kept whatever the length.
    """
    chars, tricky, units = ALPHABETS[alphabet]
    fragment = st.one_of(
        st.text(ASCII_LETTER, min_size=1, max_size=6),
        st.text(chars, min_size=1, max_size=6),
        st.sampled_from(tricky),
    )
    lead, trail = draw(PADS), draw(PADS)
    core = "".join(draw(st.lists(fragment, max_size=6)))
    kind = draw(st.sampled_from(["short", "boundary", "long"]))
    if kind == "short":
        return lead + core + trail
    low, high = boundary
    target = draw(st.integers(low, high) if kind == "boundary" else st.integers(0, long_max))
    room = max(0, target - len(lead) - len(trail))
    unit = core or draw(st.sampled_from(units))
    body = (unit * (room // len(unit) + 1))[:room]
    return lead + body + trail


ANY_NAME = texts()
SIGNAL_BOUNDARY_NAME = st.one_of(texts(), texts(boundary=(240, 256)))
VALID_ISH_NAME = texts("storable", boundary=(240, 255), long_max=255)
VALID_ISH_SIGNAL_NAME = texts("storable", boundary=(240, 248), long_max=248)

VARIANTS: dict[str, Callable[[str], str]] = {
    "append a space": lambda s: s + " ",
    "append two spaces": lambda s: s + "  ",
    "prepend a space": lambda s: " " + s,
    "strip trailing spaces": lambda s: s.rstrip(" "),
    "append a tab": lambda s: s + "\t",
    "upper": str.upper,
    "lower": str.lower,
    "swapcase": str.swapcase,
    "casefold": str.casefold,
}
VARIANT = st.sampled_from(list(VARIANTS))


def json_values(alphabet: str) -> st.SearchStrategy[JSON]:
    """JSON of strings from ``alphabet`` (as values and as keys), numbers, bools, null."""
    text = texts(alphabet, boundary=(0, 300), long_max=10_000)
    scalar = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        text,
    )
    return st.recursive(
        scalar,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)
        ),
        max_leaves=6,
    )


ANY_JSON = json_values("any")
UNICODE_JSON = json_values("unicode")


def spell(name: str) -> list[int]:
    """A name as its code points: how a name travels in a run's input whatever
    it holds (lone surrogates included), so only the name itself is judged."""
    return [ord(ch) for ch in name]


def unspell(codes: list[int]) -> str:
    return "".join(map(chr, codes))


# --- the world of one example -----------------------------------------------------


@dataclass
class Backend:
    name: str
    store: SQLWorkflowStore
    db: sa.Engine


@pytest.fixture(params=SQL_BACKENDS)
def sql(request: pytest.FixtureRequest) -> Backend:
    kind = str(request.param)
    if kind == "sqlite":
        db: sa.Engine = request.getfixturevalue("sqlite_engine")
    else:
        name = "store_pg_engine" if kind == "postgres" else "store_mysql_engine"
        db = request.getfixturevalue(name)
        # Earlier suites kill this engine's backends on purpose (a dropped
        # connection costs its one call); start these examples on fresh ones.
        db.dispose()
    store = store_for(db)
    store.prepare()  # before the first wipe: SQLite makes its tables on first use
    return Backend(kind, store, db)


@dataclass
class World:
    """A fresh engine with the test's workflows, over the backend's emptied store."""

    backend: Backend
    engine: WorkflowEngine
    dispatcher: InlineDispatcher

    @property
    def store(self) -> SQLWorkflowStore:
        return self.backend.store

    def run(self) -> None:
        self.dispatcher.run_until_idle(timeout=30)

    def get_run(self, run_id: str) -> RunState:
        run = self.store.get_run(run_id)
        assert run is not None, f"run {run_id} is gone"
        return run

    def count(self, table: sa.Table) -> int:
        with self.backend.db.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())

    def signals(self, run_id: str) -> dict[str, JSON]:
        """The signals stored for the run, read straight from the table."""
        query = sa.select(signal_table.c.name, signal_table.c.payload).where(
            signal_table.c.run_id == run_id
        )
        with self.backend.db.connect() as conn:
            return {name: json.loads(payload) for name, payload in conn.execute(query)}


def echo(value: JSON) -> JSON:
    return value


def one_step(ctx: Context, input: dict[str, Any]) -> JSON:
    name = unspell(input["name"])
    return ctx.step(name, echo, [name, len(name)])


def two_steps(ctx: Context, input: dict[str, Any]) -> JSON:
    first = ctx.step(input["a"], echo, {"of": input["a"]})
    second = ctx.step(input["b"], echo, {"of": input["b"]})
    return [first, second]


def one_signal(ctx: Context, input: dict[str, Any]) -> JSON:
    return ctx.wait_for_signal(unspell(input["wait"]))


def two_signals(ctx: Context, input: dict[str, Any]) -> JSON:
    return [ctx.wait_for_signal(input["a"]), ctx.wait_for_signal(input["b"])]


def payloads(ctx: Context, input: JSON) -> JSON:
    result = ctx.step("echo", echo, input)
    signalled = ctx.wait_for_signal("payload")
    return {"input": input, "step": result, "signal": signalled}


def plain(ctx: Context, input: JSON) -> JSON:
    return input


WORKFLOWS = {
    "prop.plain": plain,
    "prop.one_step": one_step,
    "prop.two_steps": two_steps,
    "prop.one_signal": one_signal,
    "prop.two_signals": two_signals,
    "prop.payloads": payloads,
}


def world(backend: Backend) -> World:
    wipe(backend.db)
    engine, dispatcher = make_engine(backend.store, max_input_bytes=50_000_000)
    dispatcher.task(echo, name="echo")
    for name, body in WORKFLOWS.items():
        engine.workflow(body, name=name)
    return World(backend, engine, dispatcher)


def step_named(steps: list[StepState], name: str) -> StepState:
    found = [s for s in steps if s.name == name]
    assert len(found) == 1, f"{len(found)} steps named {name!r} in {[s.name for s in steps]}"
    return found[0]


def distinct_valid(name: str, variant: str, limit: int) -> str:
    """The variant of ``name``; the example is skipped unless both are valid and differ."""
    other = VARIANTS[variant](name)
    assume(other != name and not problems(name, limit) and not problems(other, limit))
    event(f"variant: {variant}")
    return other


# --- idempotency keys -----------------------------------------------------------


@SETTINGS
@given(key=ANY_NAME)
@example(key="k" * 255)  # the longest a key may be
@example(key="k" * 256)
def test_an_idempotency_key_is_refused_or_read_back_exactly(sql: Backend, key: str) -> None:
    w = world(sql)
    reasons = problems(key, NAME_LIMIT)
    classify(key, reasons)
    if reasons:
        with pytest.raises(PayloadError) as info:
            w.engine.start("prop.plain", {"key": spell(key)}, idempotency_key=key)
        assert_says(str(info.value), "idempotency", reasons)
        assert w.count(run_table) == 0, "a refused start wrote a run"
        return
    handle = w.engine.start("prop.plain", {"key": spell(key)}, idempotency_key=key)
    run = w.get_run(handle.run_id)
    assert run.idempotency_key == key
    assert_same_json(run.input, {"key": spell(key)}, "the run's input")
    again = w.engine.start("prop.plain", {"key": spell(key)}, idempotency_key=key)
    assert again.run_id == handle.run_id, "the same key started a second run"
    with pytest.raises(IdempotencyKeyReusedError):  # the same key, another input
        w.engine.start("prop.plain", {"key": "again"}, idempotency_key=key)
    assert w.count(run_table) == 1


@SETTINGS
@given(key=VALID_ISH_NAME, variant=VARIANT)
def test_two_distinct_idempotency_keys_are_two_runs(sql: Backend, key: str, variant: str) -> None:
    other = distinct_valid(key, variant, NAME_LIMIT)
    w = world(sql)
    first = w.engine.start("prop.plain", {"key": key}, idempotency_key=key)
    second = w.engine.start("prop.plain", {"key": other}, idempotency_key=other)
    assert first.run_id != second.run_id, f"keys {key!r} and {other!r} gave one run"
    for handle, k in ((first, key), (second, other)):
        run = w.get_run(handle.run_id)
        assert run.idempotency_key == k
        assert_same_json(run.input, {"key": k}, f"the input of the run keyed {k!r}")
    assert w.count(run_table) == 2


# --- step names -------------------------------------------------------------------


@SETTINGS
@given(name=ANY_NAME)
@example(name="n" * 255)  # the longest a step name may be
@example(name="n" * 256)
def test_a_step_name_fails_the_run_or_is_read_back_exactly(sql: Backend, name: str) -> None:
    w = world(sql)
    handle = w.engine.start("prop.one_step", {"name": spell(name)})
    w.run()
    run = w.get_run(handle.run_id)
    steps = w.store.get_steps(handle.run_id)
    reasons = problems(name, NAME_LIMIT)
    classify(name, reasons)
    if reasons:
        assert run.status == RunStatus.FAILED, f"run is {run.status}, steps {steps}"
        assert run.error is not None
        assert run.error["type"] == "PayloadError", run.error
        assert_says(str(run.error["message"]), "step", reasons)
        assert w.count(step_table) == 0
        return
    assert run.status == RunStatus.COMPLETED, run.error
    step = step_named(steps, name)
    assert_same_json(step.args, [[name, len(name)]], "the step's args")
    assert_same_json(step.result, [name, len(name)], "the step's result")
    assert_same_json(run.output, [name, len(name)], "the run's output")


@SETTINGS
@given(name=VALID_ISH_NAME, variant=VARIANT)
def test_step_names_differing_by_spaces_or_case_are_two_steps(
    sql: Backend, name: str, variant: str
) -> None:
    other = distinct_valid(name, variant, NAME_LIMIT)
    w = world(sql)
    handle = w.engine.start("prop.two_steps", {"a": name, "b": other})
    w.run()
    run = w.get_run(handle.run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert_same_json(run.output, [{"of": name}, {"of": other}], "the run's output")
    steps = w.store.get_steps(handle.run_id)
    assert [s.name for s in steps] == [name, other]
    for n in (name, other):
        assert_same_json(step_named(steps, n).result, {"of": n}, f"step {n!r}'s result")


# --- signal names -------------------------------------------------------------------


@SETTINGS
@given(name=SIGNAL_BOUNDARY_NAME, payload=UNICODE_JSON)
@example(name="g" * 248, payload=None)  # the longest a signal name may be
@example(name="g" * 249, payload=None)
def test_a_signal_name_is_refused_or_delivered_exactly(
    sql: Backend, name: str, payload: JSON
) -> None:
    reasons = problems(name, SIGNAL_NAME_LIMIT)
    classify(name, reasons)
    w = world(sql)
    # A refused name cannot be waited for: that run waits for another signal.
    handle = w.engine.start("prop.one_signal", {"wait": spell("ready" if reasons else name)})
    w.run()
    before = w.get_run(handle.run_id)
    assert not before.status.terminal, before.error
    if reasons:
        with pytest.raises(PayloadError) as info:
            w.engine.send_signal(handle.run_id, name, payload)
        assert_says(str(info.value), "signal", reasons)
        assert w.get_run(handle.run_id).version == before.version, "a refused signal moved it"
        assert w.signals(handle.run_id) == {}, "a refused signal was stored"
        return
    w.engine.send_signal(handle.run_id, name, payload)
    stored = w.signals(handle.run_id)
    assert list(stored) == [name]
    assert_same_json(stored[name], payload, "the stored signal payload")
    w.run()
    run = w.get_run(handle.run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert_same_json(run.output, payload, "the payload the body got")
    wait = step_named(w.store.get_steps(handle.run_id), f"signal:{name}")
    assert_same_json(wait.result, payload, "the signal step's result")


@SETTINGS
@given(name=VALID_ISH_SIGNAL_NAME, variant=VARIANT)
def test_signals_differing_by_spaces_or_case_are_two_signals(
    sql: Backend, name: str, variant: str
) -> None:
    other = distinct_valid(name, variant, SIGNAL_NAME_LIMIT)
    w = world(sql)
    handle = w.engine.start("prop.two_signals", {"a": name, "b": other})
    w.run()
    w.engine.send_signal(handle.run_id, name, {"sent": name})
    w.run()
    w.engine.send_signal(handle.run_id, other, {"sent": other})
    stored = w.signals(handle.run_id)
    assert sorted(stored) == sorted([name, other]), f"signal {other!r} was dropped: {stored!r}"
    assert_same_json(stored[name], {"sent": name}, f"signal {name!r}")
    assert_same_json(stored[other], {"sent": other}, f"signal {other!r}")
    w.run()
    run = w.get_run(handle.run_id)
    assert run.status == RunStatus.COMPLETED, (run.status, run.error)
    assert_same_json(run.output, [{"sent": name}, {"sent": other}], "the payloads the body got")


# --- payloads -----------------------------------------------------------------------


def check_payload_round_trip(backend: Backend, payload: JSON) -> None:
    """Run input, step args and result, signal payload and output read back exactly."""
    w = world(backend)
    handle = w.engine.start("prop.payloads", payload)
    assert_same_json(w.get_run(handle.run_id).input, payload, "the run's input")
    w.run()
    step = step_named(w.store.get_steps(handle.run_id), "echo")
    assert_same_json(step.args, [payload], "the step's args")
    assert_same_json(step.result, payload, "the step's result")
    w.engine.send_signal(handle.run_id, "payload", payload)
    assert_same_json(w.signals(handle.run_id)["payload"], payload, "the stored signal payload")
    w.run()
    run = w.get_run(handle.run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    expected = {"input": payload, "step": payload, "signal": payload}
    assert_same_json(run.output, expected, "the run's output")


@SETTINGS
@given(payload=UNICODE_JSON)
def test_a_payload_of_unicode_text_is_read_back_exactly(sql: Backend, payload: JSON) -> None:
    """NUL, astral characters, spaces, as values and as keys: no surrogates."""
    check_payload_round_trip(sql, payload)


@SETTINGS
@given(payload=ANY_JSON)
def test_a_payload_with_surrogates_is_refused_or_read_back_exactly(
    sql: Backend, payload: JSON
) -> None:
    """A string holding a surrogate code point is not Unicode text: it has no
    UTF-8 form, and a high surrogate followed by a low one would come back
    from JSON as one astral character. Such a payload is refused at ``start``
    with nothing written; any other reads back exactly."""
    if not any(has_surrogate(text) for text in strings_in(payload)):
        check_payload_round_trip(sql, payload)
        return
    w = world(sql)
    with pytest.raises(PayloadError, match="surrogate code point"):
        w.engine.start("prop.payloads", payload)
    assert w.store.list_runs() == []


def strings_in(value: JSON) -> list[str]:
    """Every string of a JSON value, dict keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in strings_in(item)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings_in(v)]]
    return []
