"""Run corpus inputs one at a time and say what goes wrong with each (a tool, not a test).

A batch that crashes fails every input in it; this runs each input of a batch alone, with the
same command, so a failure can be traced to the input that causes it::

    .venv/bin/python -m tests.corpus.diagnose [CASE_ID_SUBSTRING ...] [--out DIR]

It writes the corpus to DIR (default: a temporary folder) and prints one block per input.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .generate import build_corpus, materialize
from .harness import execute, problems, tracebacks
from .model import Case, Run
from .ops import remove_special_files


def _alone(case: Case, run: Run) -> Run:
    """The run of ``case`` with only its own input (batches: the scene alone, text output)."""
    if not run.batch:
        return run
    key = f"{case.id}:{run.command}:alone"
    return dataclasses.replace(run, key=key, targets=(case.scene,), controls=(), fmt="text", batch=False, timeout=60.0)


def _line(case: Case, run: Run, root: Path, real: Path, lakes: Path) -> str:
    result = execute(run, root, real, lakes)
    found = problems(case, result, root)
    traces = tracebacks(result.out)
    head = f"{'FAIL' if found else 'ok  '} {case.id} [{run.command}] exit {result.rc} {result.seconds:.1f}s"
    body = [f"     - {p}" for p in found]
    if traces and found:
        body.append(f"     traceback: {traces[-1].last}")
    return "\n".join([head, *body])


def main() -> int:
    from tests.conftest import REAL

    ap = argparse.ArgumentParser()
    ap.add_argument("select", nargs="*", help="only cases whose id contains one of these")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    corpus = build_corpus()
    root = args.out or Path(tempfile.mkdtemp(prefix="cubelake-corpus-"))
    materialize(corpus, root, REAL)
    lakes = Path(tempfile.mkdtemp(prefix="cubelake-corpus-lakes-"))
    jobs = [(c, _alone(c, corpus.runs[k])) for c in corpus.cases for k in c.runs
            if not args.select or any(s in c.id for s in args.select)]
    try:
        with ThreadPoolExecutor(args.workers) as pool:
            for line in pool.map(lambda job: _line(job[0], job[1], root, REAL, lakes), jobs):
                print(line, flush=True)
    finally:
        remove_special_files(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
