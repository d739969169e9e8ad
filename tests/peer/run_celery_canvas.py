"""Celery's own canvas tests, run plainly and with every canvas made durable.

Run by hand (``python -m tests.peer.run_celery_canvas``; never collected in
CI). It fetches the source distribution of the installed Celery (whose ``t/``
holds ``t/integration/test_canvas.py``), starts a throwaway Redis for the
broker and result backend, and runs that file twice under Celery's session
worker with ``Pikku`` attached: once plainly, once with every canvas a test
starts routed through ``pikku.durable()`` (:mod:`.celery_canvas_plugin`).
Each test is then one of: *same* (the same outcome both ways), *differ*,
*not expressible* (``durable()`` refused a canvas of the test), *no canvas*
(the test starts none).

Options: ``-k EXPR`` (pytest's), ``--timeout`` (seconds a test waits for a
result, Celery's own is 60), ``--keep DIR`` (where the source and logs stay).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

import celery

from tests.throwaway import throwaway_redis

REPO = Path(__file__).resolve().parents[2]
CATEGORIES = ("same", "differ", "not expressible", "no canvas")


def celery_tests(workdir: Path) -> Path:
    """An unpacked copy of the installed Celery's ``t/`` (from its sdist)."""
    version = celery.__version__
    root = workdir / f"celery-{version}"
    if (root / "t" / "integration" / "test_canvas.py").exists():
        return root
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"celery=={version}",
            "-d",
            str(workdir),
        ],
        check=True,
    )
    with tarfile.open(workdir / f"celery-{version}.tar.gz") as sdist:
        members = [m for m in sdist.getmembers() if m.name.startswith(f"celery-{version}/t/")]
        members += [sdist.getmember(f"celery-{version}/pyproject.toml")]
        sdist.extractall(workdir, members=members, filter="data")
    return root


def run_suite(root: Path, mode: str, redis_url: str, args: argparse.Namespace) -> list[dict]:
    out = root / f"results-{mode}.jsonl"
    out.unlink(missing_ok=True)
    host, port = redis_url.split("//", 1)[1].split("/", 1)[0].split(":")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
        "TEST_BROKER": redis_url.rsplit("/", 1)[0] + "/0",
        "TEST_BACKEND": redis_url.rsplit("/", 1)[0] + "/1",
        "REDIS_HOST": host,
        "REDIS_PORT": port,
        "PIKKU_PEER_MODE": mode,
        "PIKKU_PEER_OUT": str(out),
        "PIKKU_PEER_DATABASE": f"sqlite:///{root / f'pikku-{mode}.sqlite'}",
        "PIKKU_PEER_TIMEOUT": str(args.timeout),
    }
    command = [sys.executable, "-m", "pytest", "t/integration/test_canvas.py", "-q"]
    command += ["-p", "tests.peer.celery_canvas_plugin", "-p", "no:cacheprovider"]
    command += ["-o", "addopts=", "-W", "ignore", "--timeout", str(4 * args.timeout + 60)]
    command += ["--durations", "15"]  # in the log: where each run spends its time
    if args.k:
        command += ["-k", args.k]
    log = root / f"pytest-{mode}.log"
    with log.open("w") as sink:
        subprocess.run(command, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT)
    if not out.exists():
        raise SystemExit(f"the {mode} run wrote no results; see {log}")
    return [json.loads(line) for line in out.read_text().splitlines()]


def judged(plain: dict[str, dict], durable: dict[str, dict]) -> dict[str, str]:
    verdict = {}
    for test_id, d in durable.items():
        p = plain.get(test_id, {"outcome": "missing"})
        if d["canvases"] == 0:
            verdict[test_id] = "no canvas"
        elif d["refused"]:
            verdict[test_id] = "not expressible"
        elif d["outcome"] == p["outcome"]:
            verdict[test_id] = "same"
        elif d.get("tree") or d.get("lazy"):
            # it reads the AsyncResult tree, or relies on a lazy generator header
            verdict[test_id] = "not expressible"
        else:
            verdict[test_id] = "differ"
    return verdict


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="pytest -k expression")
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--plain-from", type=Path, default=None, help="reuse a plain results file")
    parser.add_argument(
        "--durable-from", type=Path, default=None, help="reuse a durable results file"
    )
    args = parser.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="pikku-peer-"))
    workdir.mkdir(parents=True, exist_ok=True)
    root = celery_tests(workdir)
    with throwaway_redis() as server:
        if args.plain_from:
            plain_rows = _read(args.plain_from)
        else:
            plain_rows = run_suite(root, "plain", server.url, args)
        if args.durable_from:
            durable_rows = _read(args.durable_from)
        else:
            server.restart()
            durable_rows = run_suite(root, "durable", server.url, args)
    plain = {r["id"]: r for r in plain_rows}
    durable = {r["id"]: r for r in durable_rows}
    verdict = judged(plain, durable)
    counts = Counter(verdict.values())
    print(f"Celery {celery.__version__} t/integration/test_canvas.py through pikku.durable()")
    print(f"plain outcomes: {dict(Counter(r['outcome'] for r in plain_rows))}")
    print(f"{'':16}{'tests':>6}")
    for category in CATEGORIES:
        print(f"{category:16}{counts.get(category, 0):6}")
    print(f"{'total':16}{len(verdict):6}")
    for category in ("differ", "not expressible"):
        print(f"\n{category}:")
        for test_id, v in sorted(verdict.items()):
            if v != category:
                continue
            d, p = durable[test_id], plain.get(test_id, {})
            change = f"{p.get('outcome')} -> {d['outcome']}: {d['error']}"
            if d.get("tree") and not d["refused"]:
                change = f"reads the AsyncResult tree ({change})"
            elif d.get("lazy") and not d["refused"]:
                change = f"a generator chord header, consumed when stored ({change})"
            why = d["refused"][0] if d["refused"] else change
            print(f"  {test_id.split('::', 1)[1]}: {why}")
    print(f"\nlogs and results: {root}")


if __name__ == "__main__":
    main()
