"""mypy sees the public API's types: each wrong call is reported, correct use is not.

One mypy run (``--strict``, the project's configuration, a fresh cache) checks
wrong_calls.py and correct_usage.py; the modules they import are analysed, but
their errors are left to the project's own mypy run. A line of wrong_calls.py
ending in ``# expect: CODE[, CODE]`` must get exactly those error codes, and no
other line any error; correct_usage.py (whose ``assert_type`` calls pin the
inferred types) must get none.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WRONG = HERE / "wrong_calls.py"
CORRECT = HERE / "correct_usage.py"

EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>[\w-]+(?:\s*,\s*[\w-]+)*)\s*$")
ERROR = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: (?P<message>.*)$")
CODE = re.compile(r"\s+\[(?P<code>[\w-]+)\]$")

Errors = dict[Path, set[tuple[int, str]]]


def expected_errors(path: Path) -> set[tuple[int, str]]:
    """The ``(line, code)`` pairs the file's ``# expect:`` comments ask for."""
    expected: set[tuple[int, str]] = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = EXPECT.search(text)
        if match:
            expected.update((number, code.strip()) for code in match["codes"].split(","))
    return expected


def parse_errors(stdout: str) -> Errors:
    """mypy's errors by file as ``(line, code)``; an error without a code is ``?``."""
    errors: Errors = {}
    for text in stdout.splitlines():
        match = ERROR.match(text)
        if match is None:
            continue  # notes (overload variants, "defined here") say nothing new
        code = CODE.search(match["message"])
        path = Path(match["path"]).resolve()
        errors.setdefault(path, set()).add((int(match["line"]), code["code"] if code else "?"))
    return errors


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> Errors:
    """Both files in one mypy run (a cold cache takes a few seconds)."""
    cache = tmp_path_factory.mktemp("mypy-cache")
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--follow-imports",
            "silent",
            "--cache-dir",
            str(cache),
            "--show-absolute-path",
            "--show-error-codes",
            "--no-pretty",
            "--no-error-summary",
            str(WRONG),
            str(CORRECT),
        ]
    )
    assert status in (0, 1), f"mypy did not run (exit {status}):\n{stdout}{stderr}"
    errors = parse_errors(stdout)
    assert errors, f"mypy reported nothing, not even wrong_calls.py's errors:\n{stdout}{stderr}"
    return errors


def test_the_expectations_cover_the_shops_workflow() -> None:
    """The check itself: wrong_calls.py does ask for errors, starting fulfil_order wrongly."""
    expected = expected_errors(WRONG)
    lines = WRONG.read_text().splitlines()
    assert (lines.index('    fulfil_order.start("x")  # expect: arg-type') + 1, "arg-type") in (
        expected
    )
    assert len(expected) >= 10


def test_each_wrong_call_is_reported_and_nothing_else(mypy_errors: Errors) -> None:
    expected = expected_errors(WRONG)
    reported = mypy_errors.get(WRONG, set())
    missing = sorted(expected - reported)
    unexpected = sorted(reported - expected)
    assert not missing and not unexpected, (
        f"wrong_calls.py: expected but not reported {missing}; "
        f"reported but not expected {unexpected}"
    )


def test_correct_usage_has_no_errors(mypy_errors: Errors) -> None:
    assert mypy_errors.get(CORRECT, set()) == set()
