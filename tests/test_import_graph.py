"""No import cycle between the modules of pikku_celery; no test imports the benchmarks.

``lint-imports`` checks the direction of imports between layers; inside a
layer, and across layers it cannot tell apart, this checks that no module
imports itself again through others. Imports inside functions count (one
that is there only to dodge a cycle still closes it); imports under
``TYPE_CHECKING`` never run and are left out here (the layers contract
counts them). A failure names each cycle, import by import, with lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

import grimp
import pytest

PACKAGE = "pikku_celery"

PENDING: frozenset[frozenset[str]] = frozenset()
"""Cycles known and not yet closed, each a set of module names (none now): an
entry goes when its cycle does (test_pending_cycles_are_still_there)."""


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=True)


def strongly_connected(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The graph's strongly connected sets of more than one module (Tarjan,
    iterative: each is a set of modules that all import each other, through
    one another)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            step = next(imported, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.find_modules_directly_imported_by(step)))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == module:
                        break
                if len(members) > 1:
                    found.append(frozenset(members))
    return found


def describe(graph: grimp.ImportGraph, cycles: Iterable[frozenset[str]]) -> str:
    """Each cycle as a loop of imports with their lines: the shortest way
    back to its first module from one it imports."""
    lines = []
    for members in sorted(cycles, key=sorted):
        first = min(members)
        back = min(
            (
                chain
                for step in graph.find_modules_directly_imported_by(first) & members
                if (chain := graph.find_shortest_chain(step, first)) is not None
            ),
            key=len,
        )
        loop = (first, *back)
        hops = []
        for importer, imported in pairwise(loop):
            details = graph.get_import_details(importer=importer, imported=imported)
            at = ", ".join(f"l.{d['line_number']}" for d in details)
            hops.append(f"  {importer} -> {imported} ({at})")
        lines.append(f"cycle through {len(members)} modules:\n" + "\n".join(hops))
    return "\n".join(lines)


def test_no_import_cycle_between_modules(graph: grimp.ImportGraph) -> None:
    cycles = set(strongly_connected(graph)) - PENDING
    assert not cycles, describe(graph, cycles)


def test_pending_cycles_are_still_there(graph: grimp.ImportGraph) -> None:
    """An entry of PENDING whose cycle is gone is removed, so it cannot hide a new one."""
    gone = PENDING - set(strongly_connected(graph))
    assert not gone, f"no longer cycles, remove them from PENDING: {sorted(map(sorted, gone))}"


def test_a_cycle_is_found_and_named() -> None:
    """The check itself: a cycle made on purpose, one import inside a function."""
    made = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        made.add_module(module)
    for importer, imported in [
        ("pkg.a", "pkg.b"),
        ("pkg.b", "pkg.c"),
        ("pkg.c", "pkg.a"),
        ("pkg.c", "pkg.d"),
    ]:
        made.add_import(importer=importer, imported=imported, line_number=7, line_contents="import")
    assert strongly_connected(made) == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]
    assert describe(made, strongly_connected(made)).splitlines() == [
        "cycle through 3 modules:",
        "  pkg.a -> pkg.b (l.7)",
        "  pkg.b -> pkg.c (l.7)",
        "  pkg.c -> pkg.a (l.7)",
    ]


def test_no_test_imports_the_benchmarks() -> None:
    """Tests stand on the package and their own helpers: a benchmark may change
    (or go) without a test noticing, so what both need is copied into tests/."""
    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [
                f"{path.relative_to(tests.parent)}:{node.lineno} imports {name}"
                for name in names
                if name == "benchmarks" or name.startswith("benchmarks.")
            ]
    assert not found, "\n".join(found)
