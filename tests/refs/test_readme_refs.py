"""The README's kerchunk-reference examples, run exactly as written (taken from README.md at test time).

They run from a folder laid out like the repository after ``make demo``: ``./lake`` (here one
real EnMAP tile, ingested as the demo does) and ``../shared/data/real``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cubelake.ingest import IngestOptions, ingest
from tests.conftest import REAL

README = Path(__file__).resolve().parents[2] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(title)
    nxt = re.search(r"^#{2,3} ", text[start + len(title):], re.M)
    return text[start: start + len(title) + (nxt.start() if nxt else len(text))]


def _cli_refs_lines() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", _section("## Command line"), re.S)
    assert block is not None
    lines = [ln for ln in block.group(1).splitlines() if "cubelake refs" in ln or "--products refs" in ln]
    assert len(lines) >= 6, lines
    return lines


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """``repo/lake`` with the demo's first EnMAP tile, and ``shared/data/real`` beside ``repo``."""
    (tmp_path / "shared").symlink_to(REAL.parents[1], target_is_directory=True)
    root = tmp_path / "repo"
    root.mkdir()
    (res,) = ingest([REAL / "hsi_enmap_potsdam" / "enmap_potsdam_tile_96_0.tif"], root / "lake",
                    IngestOptions(products=("cog", "zarr", "refs")))
    assert res.outcome.value == "ingested", res.message
    return root


def _sh(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_readme_command_line_refs_examples_run_as_written(repo: Path) -> None:
    for line in _cli_refs_lines():
        run = _sh(line, repo)
        assert run.returncode == 0, (line, run.stdout, run.stderr)
        assert "Traceback" not in run.stdout + run.stderr
        if " refs check " in line:
            assert run.stdout.startswith("ok: "), (line, run.stdout)
        if " refs build " in line or " refs combine " in line:  # targets outside the output's folder
            assert "--allow-root /" in run.stdout, run.stdout
    assert "s3://bucket/archive" in (repo / "lake" / "lake.json").read_text()
    # what the README says of the lake's own scenes: on different grids, so combine refuses them
    lake_combine = "cubelake refs combine lake/scenes/*/*.refs.json -o cube.json"
    assert lake_combine in _section("### Virtual Zarr")
    run = _sh(lake_combine, repo)
    assert run.returncode == 1
    assert "cannot be stacked" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (repo / "cube.json").exists()
    # the flags the README passes are needed: without them the same checks fail, naming the flag to pass
    run = _sh("cubelake refs check lake/scenes/scene_band1/scene_band1.refs.json", repo)
    assert run.returncode == 1
    assert "--lake LAKE" in run.stderr
    run = _sh("cubelake refs check pair.json", repo)
    assert run.returncode == 1
    assert f"--allow-root {REAL.resolve() / 'cog_rio_tiler'}" in run.stderr


def test_readme_python_refs_example_runs_as_written(repo: Path) -> None:
    block = re.search(r"```python\n(.*?)```", _section("### Virtual Zarr"), re.S)
    assert block is not None
    run = subprocess.run([sys.executable, "-c", block.group(1)], cwd=repo, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["EPSG:32633", "{'scene': 2, 'band': 1, 'y': 549, 'x': 549}"]
    assert (repo / "pair.json").is_file()
