"""Mutation testing of cubelake's pure and security-critical modules with Cosmic Ray.

For each module of ``mutation/modules.toml``: Cosmic Ray lists every mutant of the module (``cosmic-ray init``);
this script leaves out those inside annotations the module never evaluates (``from __future__ import
annotations``: equivalent by construction), keeps a fixed, deterministic sample of the others (the first
``sample`` by a hash of the mutant and its source line, so a rerun tests the same mutants while the code is
unchanged), marks the mutants that ``mutation/equivalent.toml`` justifies as equivalent, and lets Cosmic Ray
run the module's tests against each (``cosmic-ray exec``, local distributor, one mutant at a time, the file
mutated in place and restored).

Score = killed / (killed + survived), equivalent mutants left out. A module whose sources, tests, sample and
justifications have not changed since its last run is not run again (its result is reused from ``.mutation/``).
The run fails (exit 1) when a module's score is below the score recorded in ``mutation/scores.json`` or below
the floor (0.90); ``--record`` writes the scores of this run there.

    python mutation/run.py                       # every module (incremental), then the check
    python mutation/run.py --module cubelake/grid.py --force
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "mutation"
WORK = ROOT / ".mutation"
FLOOR = 0.90


@dataclass(frozen=True)
class Module:
    path: str
    tests: tuple[str, ...]
    sample: int
    scope: tuple[str, ...] = ()  # top-level names to mutate (empty: the whole module)
    select: str = ""  # a pytest -k expression over the tests (empty: all of them)

    @property
    def name(self) -> str:
        return self.path.replace("/", "_").removesuffix(".py")


@dataclass
class Result:
    module: str
    key: str
    mutants: int  # all Cosmic Ray made for the module (in scope)
    sampled: int
    killed: int = 0
    survived: int = 0
    incompetent: int = 0
    equivalent: list[str] = field(default_factory=list)
    survivors: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        judged = self.killed + self.survived
        return self.killed / judged if judged else 1.0


def load_modules() -> list[Module]:
    doc = tomllib.loads((HERE / "modules.toml").read_text())
    return [Module(m["path"], tuple(m["tests"]), int(m["sample"]), tuple(m.get("scope", ())), m.get("select", ""))
            for m in doc["module"]]


def load_equivalents() -> list[dict[str, str]]:
    """Justified survivors: ``module``, ``line`` (the stripped source line a mutant changes), ``mutant`` (that
    line as the mutant has it), optionally ``next`` (the line after it) and ``why``."""
    doc = tomllib.loads((HERE / "equivalent.toml").read_text())
    return list(doc.get("equivalent", []))


def cache_key(m: Module, equivalents: list[dict[str, str]]) -> str:
    import cosmic_ray

    h = hashlib.sha256(json.dumps([asdict(m), [e for e in equivalents if e["module"] == m.path],
                                   getattr(cosmic_ray, "__version__", "")]).encode())
    for rel in (m.path, *m.tests):
        for f in sorted((ROOT / rel).rglob("*.py")) if (ROOT / rel).is_dir() else [ROOT / rel.split("::")[0]]:
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def test_command(m: Module) -> str:
    select = ["-k", m.select] if m.select else []
    return shlex.join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *select, *m.tests])


# -- choosing the mutants ------------------------------------------------------------------------------


def scope_lines(path: Path, names: tuple[str, ...]) -> set[int] | None:
    """Line numbers of the definitions ``names`` in ``path``: top-level ones, or a class's methods as
    ``Class.method`` (``None``: every line)."""
    if not names:
        return None
    import ast

    tree = ast.parse(path.read_text())
    lines: set[int] = set()
    found: set[str] = set()
    for node in tree.body:
        name = getattr(node, "name", None)
        members = [(f"{name}.{sub.name}", sub) for sub in node.body if hasattr(sub, "name")] \
            if isinstance(node, ast.ClassDef) else []
        for full, definition in [(name, node), *members]:
            found.add(str(full))
            if full in names:
                lines.update(range(definition.lineno, (definition.end_lineno or definition.lineno) + 1))
    missing = set(names) - found
    if missing:
        raise SystemExit(f"mutation/modules.toml: {path} has no definition {sorted(missing)}; fix its scope")
    return lines


def annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where ``path``'s annotations are, if the module never evaluates them (``from __future__ import
    annotations``): a mutant there is equivalent by construction. ``[]`` otherwise."""
    import ast

    tree = ast.parse(path.read_text())
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
               for n in tree.body):
        return []
    spans = []
    for node in ast.walk(tree):
        for ann in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if isinstance(ann, ast.expr) and not isinstance(node, ast.expr):
                spans.append(((ann.lineno, ann.col_offset), (ann.end_lineno or ann.lineno, ann.end_col_offset or 0)))
    return spans


def _line(path: Path, number: int, cache: dict[Path, list[str]]) -> str:
    if path not in cache:
        cache[path] = path.read_text().splitlines()
    return cache[path][number - 1].strip()


def mutant_line(mut: Any, source: str) -> str:
    """The stripped source line ``mut`` changes, as the mutant has it."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    mutated = mutate_code(source, get_operator(mut.operator_name)(**(mut.operator_args or {})), mut.occurrence)
    return str(mutated).splitlines()[mut.start_pos[0] - 1].strip() if mutated is not None else ""


def _equivalent(m: Module, mut: Any, line: str, equivalents: list[dict[str, str]]) -> dict[str, str] | None:
    """The justification of ``mut``: same module, line and mutated line, and (``next``, if given) the same
    stripped line after it — for a line such as ``@property`` that recurs with different meanings."""
    candidates = [e for e in equivalents if e["module"] == m.path and e["line"] == line]
    if not candidates:
        return None
    source = Path(mut.module_path).read_text()
    mutated = mutant_line(mut, source)
    lines = source.splitlines()
    after = lines[mut.start_pos[0]].strip() if mut.start_pos[0] < len(lines) else ""
    return next((e for e in candidates if e["mutant"] == mutated and e.get("next", after) == after), None)


def choose(db: Any, m: Module, equivalents: list[dict[str, str]]) -> tuple[int, int, list[str]]:
    """Skip mutants out of scope and out of the sample, and the justified ones; (in scope, sampled, equivalent)."""
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    cache: dict[Path, list[str]] = {}
    scopes: dict[Path, set[int] | None] = {}
    annotations: dict[Path, list[tuple[tuple[int, int], tuple[int, int]]]] = {}
    ranked: list[tuple[str, str, tuple[Any, str]]] = []  # (rank, job id, (mutation, its source line))
    skip: list[str] = []
    for item in db.work_items:
        (mut,) = item.mutations
        path = Path(mut.module_path)
        if path not in scopes:
            scopes[path] = scope_lines(path, m.scope)
        lines = scopes[path]
        if path not in annotations:
            annotations[path] = annotation_spans(path)
        start = tuple(mut.start_pos)
        if (lines is not None and mut.start_pos[0] not in lines) or any(a <= start < b for a, b in annotations[path]):
            skip.append(item.job_id)
            continue
        line = _line(path, mut.start_pos[0], cache)
        rank = hashlib.sha256(f"{path.name}|{mut.operator_name}|{mut.occurrence}|{line}".encode()).hexdigest()
        ranked.append((rank, item.job_id, (mut, line)))
    ranked.sort(key=lambda x: x[0])
    sampled = ranked[:m.sample]
    skip += [job for _, job, _ in ranked[m.sample:]]
    equivalent = []
    for _, job, (mut, line) in sampled:
        eq = _equivalent(m, mut, line, equivalents)
        if eq is not None:
            equivalent.append(f"{Path(mut.module_path).name}:{mut.start_pos[0]} {mut.operator_name}: {eq['why']}")
            skip.append(job)
    db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    return len(ranked), len(sampled), equivalent


# -- running -------------------------------------------------------------------------------------------


def _files(m: Module) -> list[Path]:
    p = ROOT / m.path
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


def _cosmic_ray(*args: str) -> None:
    res = subprocess.run([sys.executable, "-m", "cosmic_ray.cli", *args], cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"cosmic-ray {' '.join(args)} failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-3000:]}")


def baseline(m: Module) -> float:
    """Seconds the module's tests take unmutated; they must pass, or no mutant could be judged."""
    t0 = time.perf_counter()
    res = subprocess.run(shlex.split(test_command(m)), cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{m.path}: its tests fail without any mutation ({test_command(m)}):\n{res.stdout[-3000:]}")
    return time.perf_counter() - t0


def run_module(m: Module, key: str, equivalents: list[dict[str, str]]) -> Result:
    from cosmic_ray.work_db import use_db

    WORK.mkdir(exist_ok=True)
    cfg, session = WORK / f"{m.name}.toml", WORK / f"{m.name}.sqlite"
    seconds = baseline(m)
    cfg.write_text(f'[cosmic-ray]\nmodule-path = "{m.path}"\ntimeout = {max(30.0, 4 * seconds):.0f}\n'
                   f"excluded-modules = []\ntest-command = {json.dumps(test_command(m))}\n"
                   '[cosmic-ray.distributor]\nname = "local"\n')
    session.unlink(missing_ok=True)
    _cosmic_ray("init", str(cfg), str(session))
    with use_db(str(session)) as db:
        total, sampled, equivalent = choose(db, m, equivalents)
    originals = {f: f.read_bytes() for f in _files(m)}
    t0 = time.perf_counter()
    try:
        _cosmic_ray("exec", str(cfg), str(session))
    finally:  # Cosmic Ray restores each mutated file; this covers an interrupted run too
        for f, data in originals.items():
            if f.read_bytes() != data:
                f.write_bytes(data)
    result = Result(m.path, key, total, sampled, equivalent=equivalent, seconds=time.perf_counter() - t0)
    with use_db(str(session)) as db:
        _tally(db, result)
    return result


def _tally(db: Any, result: Result) -> None:
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    for item, res in db.completed_work_items:
        if res.worker_outcome == WorkerOutcome.SKIPPED:
            continue
        if res.test_outcome == TestOutcome.KILLED:
            result.killed += 1
        elif res.test_outcome == TestOutcome.SURVIVED:
            (mut,) = item.mutations
            result.survived += 1
            result.survivors.append({"where": f"{mut.module_path}:{mut.start_pos[0]}", "operator": mut.operator_name,
                                     "diff": res.diff})
        else:  # the mutant did not even import, or the worker failed: no verdict on the tests
            result.incompetent += 1


# -- reporting -----------------------------------------------------------------------------------------


def cached(m: Module, key: str) -> Result | None:
    path = WORK / f"{m.name}.json"
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    return Result(**d) if d.get("key") == key else None


def report(results: list[Result]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="mutation score (killed / (killed + survived); equivalent mutants left out)")
    for col in ("module", "mutants", "sampled", "killed", "survived", "equivalent", "score", "s"):
        table.add_column(col, justify="left" if col == "module" else "right")
    for r in results:
        table.add_row(r.module, str(r.mutants), str(r.sampled), str(r.killed), str(r.survived), str(len(r.equivalent)),
                      f"{r.score:.1%}", f"{r.seconds:.0f}")
    console = Console(width=140)
    console.print(table)
    for r in results:
        for s in r.survivors:
            # the diff escaped: rich would take "[bool]" in "Iterator[bool]" for a style tag and drop it
            console.print(f"[yellow]survived[/yellow] {escape(s['where'])} {s['operator']}\n{escape(s['diff'])}",
                          markup=True, highlight=False)


def check(results: list[Result]) -> list[str]:
    """Modules below the floor or below their recorded score."""
    recorded = json.loads((HERE / "scores.json").read_text()) if (HERE / "scores.json").is_file() else {}
    bad = []
    for r in results:
        want = max(FLOOR, recorded.get(r.module, 0.0))
        if r.score + 1e-9 < want:
            bad.append(f"{r.module}: {r.score:.1%} < {want:.1%} (survivors listed above: kill them with a test, "
                       "or justify an equivalent one in mutation/equivalent.toml)")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", action="append", help="only this module (path as in modules.toml); repeatable")
    ap.add_argument("--force", action="store_true", help="run again even if nothing changed")
    ap.add_argument("--record", action="store_true", help="write this run's scores to mutation/scores.json")
    args = ap.parse_args(argv)
    modules = [m for m in load_modules() if not args.module or m.path in args.module]
    if args.module and len(modules) != len(set(args.module)):
        raise SystemExit(f"unknown module among {args.module}; see mutation/modules.toml")
    equivalents = load_equivalents()
    results = []
    for m in modules:
        key = cache_key(m, equivalents)
        r = None if args.force else cached(m, key)
        if r is None:
            print(f"{m.path}: mutating ({test_command(m)})", flush=True)
            r = run_module(m, key, equivalents)
            (WORK / f"{m.name}.json").write_text(json.dumps(asdict(r), indent=1))
            print(f"  {r.killed} killed, {r.survived} survived, {len(r.equivalent)} equivalent of {r.sampled} sampled: "
                  f"{r.score:.1%} in {r.seconds:.0f} s", flush=True)
        results.append(r)
    report(results)
    if args.record:
        path = HERE / "scores.json"
        scores = json.loads(path.read_text()) if path.is_file() else {}
        scores.update({r.module: round(r.score, 4) for r in results})
        path.write_text(json.dumps(dict(sorted(scores.items())), indent=1) + "\n")
    bad = check(results)
    for line in bad:
        print(f"mutation score fell: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
