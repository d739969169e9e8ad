"""scripts/check-shape on small package trees: what it refuses, and the SQL it does not count."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check-shape"


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60
    )


def function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}() -> None:\n{body}"


def package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_tree_within_the_limits_passes(tmp_path: Path) -> None:
    root = package(tmp_path, {"a.py": function("f", 79) + "\n" * (600 - 80)})
    done = check(root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_a_module_over_600_lines_is_named(tmp_path: Path) -> None:
    root = package(tmp_path, {"sub/big.py": "x = 1\n" * 601, "ok.py": "x = 1\n" * 600})
    done = check(root)
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["pkg/sub/big.py: 601 lines (limit 600)"]


def test_migrations_may_be_long(tmp_path: Path) -> None:
    root = package(tmp_path, {"store/migrations/versions/v1.py": "x = 1\n" * 700})
    assert check(root).returncode == 0


def test_a_function_or_method_over_80_lines_is_named(tmp_path: Path) -> None:
    method = function("long", 80, indent="    ")  # 81 lines with its def
    nested = function("outer", 1) + function("inner", 80, indent="    ")
    root = package(tmp_path, {"m.py": "class C:\n" + method + "\n\n" + nested})
    done = check(root)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "pkg/m.py:2: C.long is 81 lines (limit 80)",
        "pkg/m.py:85: outer is 83 lines (limit 80)",
        "pkg/m.py:87: outer.inner is 81 lines (limit 80)",
    ]


def test_decorators_are_not_counted(tmp_path: Path) -> None:
    decorators = "".join(f"@dec{i}\n" for i in range(10))
    root = package(tmp_path, {"d.py": decorators + function("f", 79)})
    assert check(root).returncode == 0


def test_sql_text_counts_one_line_and_other_strings_count_whole(tmp_path: Path) -> None:
    sql_lines = "\n".join(f"        col_{i}," for i in range(90))
    sql = textwrap.indent(f'text = """\n    SELECT\n{sql_lines}\n    FROM t\n"""\n', "    ")
    prose = sql.replace("SELECT", "Some words")
    root = package(
        tmp_path,
        {
            "sql.py": "def statement() -> str:\n" + sql + "    return text\n",
            "fsql.py": "def statement(t: str) -> str:\n"
            + sql.replace('= """', '= f"""')
            + "    return text\n",
            "prose.py": "def statement() -> str:\n" + prose + "    return text\n",
        },
    )
    done = check(root)
    assert done.stdout.splitlines() == ["pkg/prose.py:1: statement is 96 lines (limit 80)"]
