"""The README's "Catalog (STAC 1.1)" examples, run exactly as written (each shell line with bash, each Python
block with the interpreter) from a folder holding the lake at ``./lake``, as after ``make demo``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pystac

from .conftest import RealLake

README = Path(__file__).resolve().parents[2] / "README.md"


def catalog_section() -> str:
    text = README.read_text()
    start = text.index("## Catalog (STAC 1.1)")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", catalog_section(), flags=re.S | re.M)


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CUBELAKE_LAKE", None)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_section_has_the_examples() -> None:
    [sh] = blocks("sh")
    lines = [ln for ln in sh.splitlines() if ln.strip()]
    assert len(lines) >= 12
    assert any("--intersects field.geojson" in ln for ln in lines)
    assert any("> field.geojson" in ln for ln in lines)  # the example makes the file it uses
    assert len(blocks("python")) == 1


def test_shell_examples_run_as_written(lake_copy: Path, real_ingest: RealLake) -> None:
    cwd = lake_copy.parent
    [sh] = blocks("sh")
    outputs = {}
    for line in (ln for ln in sh.splitlines() if ln.strip()):
        res = run(["bash", "-c", line], cwd)
        assert res.returncode == 0, (line, res.stderr)
        assert "Traceback" not in res.stdout + res.stderr, line
        assert "error" not in res.stderr.lower(), (line, res.stderr)
        outputs[line] = res.stdout
    enmap = set(real_ingest.ids["enmap"])
    first = next(out for line, out in outputs.items() if "--bbox 12.9,52.3,13.2,52.5" in line)
    assert {row.split()[0] for row in first.splitlines()[2:-1]} == enmap
    field = next(out for line, out in outputs.items() if "--intersects field.geojson" in line)
    assert real_ingest.ids["enmap"][0] in field  # the field lies on the first EnMAP tile
    as_json = next(out for line, out in outputs.items() if "--format json" in line)
    assert {it.id for it in pystac.ItemCollection.from_dict(json.loads(as_json))} <= enmap
    assert (cwd / "field.geojson").is_file()
    assert (cwd / "lake.parquet").is_file()
    assert any("STAC file(s) checked" in out and ", 0 invalid" in out for out in outputs.values())


def test_python_example_runs_as_written(lake_copy: Path) -> None:
    [code] = blocks("python")
    res = run([sys.executable, "-c", code], lake_copy.parent)
    assert res.returncode == 0, res.stderr
