"""``make mutate``'s runner: its module list is real, its sample is deterministic and scoped, and its check fails
when a score falls below the recorded one or the floor."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "mutation"))
import run as mutate  # noqa: E402


def test_every_listed_module_and_test_exists_and_has_a_recorded_score() -> None:
    modules = mutate.load_modules()
    recorded = json.loads((ROOT / "mutation" / "scores.json").read_text())
    assert {m.path for m in modules} == set(recorded)
    for m in modules:
        assert (ROOT / m.path).exists(), m.path
        for t in m.tests:
            assert (ROOT / t.split("::")[0]).is_file(), t
        assert m.sample > 0
        mutate.scope_lines(ROOT / m.path, m.scope) if m.scope else None
        assert recorded[m.path] >= mutate.FLOOR, m.path
    for e in mutate.load_equivalents():
        assert e["module"] in recorded
        assert e["why"].strip()
        assert e["mutant"] != e["line"]
        assert set(e) <= {"module", "line", "mutant", "next", "why"}
        where = ROOT / e["module"]
        text = "\n".join(f.read_text() for f in (where.rglob("*.py") if where.is_dir() else [where]))
        assert e["line"] in {ln.strip() for ln in text.splitlines()}, f"stale justification: {e['line']!r}"


def test_a_scope_names_its_definitions_or_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("X = 1\n\n\nclass A:\n    y = 2\n\n    def g(self):\n        return 4\n\n\ndef f():\n    return 3\n")
    assert mutate.scope_lines(src, ("A",)) == {4, 5, 6, 7, 8}
    assert mutate.scope_lines(src, ("A.g",)) == {7, 8}  # one method of a class
    assert mutate.scope_lines(src, ("A.g", "f")) == {7, 8, 11, 12}
    assert mutate.scope_lines(src, ()) is None
    for missing in ("B", "A.h", "g"):
        with pytest.raises(SystemExit, match=f"has no definition \\['{missing}'\\]"):
            mutate.scope_lines(src, (missing,))


def _sample(session: Path, module: mutate.Module) -> list[tuple[str, int, int]]:
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome

    cfg = session.with_suffix(".toml")
    cfg.write_text(f'[cosmic-ray]\nmodule-path = "{module.path}"\ntimeout = 10\nexcluded-modules = []\n'
                   'test-command = "true"\n[cosmic-ray.distributor]\nname = "local"\n')
    subprocess.run([sys.executable, "-m", "cosmic_ray.cli", "init", str(cfg), str(session)], cwd=ROOT, check=True,
                   capture_output=True)
    with use_db(str(session)) as db:
        total, sampled, _ = mutate.choose(db, module, [])
        skipped = {job for job, r in db.results if r.worker_outcome == WorkerOutcome.SKIPPED}
        kept = [(m.mutations[0].operator_name, m.mutations[0].occurrence, m.mutations[0].start_pos[0])
                for m in db.work_items if m.job_id not in skipped]
    assert sampled == len(kept) == min(module.sample, total)
    return sorted(kept)


def test_the_sample_is_the_same_every_run_and_stays_in_scope(tmp_path: Path) -> None:
    module = mutate.Module("cubelake/cube.py", ("tests/ingest/test_calibrate.py",), 12, ("CFEncoder",))
    first, second = _sample(tmp_path / "a.sqlite", module), _sample(tmp_path / "b.sqlite", module)
    assert first == second
    lines = mutate.scope_lines(ROOT / module.path, module.scope)
    assert lines is not None
    assert all(line in lines for _, _, line in first)
    assert len({op for op, _, _ in first}) > 3  # a spread of operators, not one kind


def test_a_justification_covers_its_one_mutant_and_no_other(tmp_path: Path) -> None:
    from cosmic_ray.work_db import use_db

    module = mutate.Module("cubelake/cube.py", ("tests/ingest/test_calibrate.py",), 500, ("CFEncoder",))
    _sample(tmp_path / "s.sqlite", module)
    with use_db(str(tmp_path / "s.sqlite")) as db:
        muts = [item.mutations[0] for item in db.work_items]
    src = (ROOT / module.path).read_text()
    lines = src.splitlines()
    target = next(m for m in muts if "self.add_offset) / self.scale_factor" in lines[m.start_pos[0] - 1]
                  and m.operator_name == "core/ReplaceBinaryOperator_Sub_Add")
    line = lines[target.start_pos[0] - 1].strip()
    mutated = mutate.mutant_line(target, src)
    assert mutated == line.replace("value - self.add_offset", "value + self.add_offset")
    entry = {"module": module.path, "line": line, "mutant": mutated, "why": "test"}
    assert mutate._equivalent(module, target, line, [entry]) is entry
    others = [m for m in muts if m.start_pos[0] == target.start_pos[0] and m is not target]
    assert others  # the same line has other mutants (the division's, the constants')
    assert all(mutate._equivalent(module, m, line, [entry]) is None for m in others)


def test_the_check_fails_below_the_recorded_score_or_the_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = tmp_path / "mutation"
    here.mkdir()
    shutil.copy(ROOT / "mutation" / "modules.toml", here)
    (here / "scores.json").write_text(json.dumps({"a.py": 0.95, "b.py": 0.5}))
    monkeypatch.setattr(mutate, "HERE", here)

    def result(module: str, killed: int, survived: int) -> mutate.Result:
        return mutate.Result(module, "k", 100, killed + survived, killed=killed, survived=survived)

    assert mutate.check([result("a.py", 19, 1), result("b.py", 18, 2)]) == []
    bad = mutate.check([result("a.py", 18, 2), result("b.py", 17, 3), result("c.py", 9, 1)])
    assert [b.split(":")[0] for b in bad] == ["a.py", "b.py"]
    assert "90.0% < 95.0%" in bad[0]
    assert "85.0% < 90.0%" in bad[1]  # the floor, above b's recorded 50%


def test_annotations_count_only_where_the_module_never_evaluates_them(tmp_path: Path) -> None:
    lazy = tmp_path / "lazy.py"
    lazy.write_text("from __future__ import annotations\n\n\ndef f(a: int | str, b=1) -> list[int]:\n"
                    "    x: dict[str, int] = {}\n    return [a | b]\n")
    spans = mutate.annotation_spans(lazy)
    assert sorted(spans) == [((4, 9), (4, 18)), ((4, 28), (4, 37)), ((5, 7), (5, 21))]
    eager = tmp_path / "eager.py"
    eager.write_text(lazy.read_text().split("\n", 1)[1])  # without the __future__ import: evaluated
    assert mutate.annotation_spans(eager) == []
