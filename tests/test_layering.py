"""Imports point one way: the core, ``cubelake.refs`` and the loaders never import the ingest."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Building references *from a source file* reads its metadata with the ingest's GDAL reader: that
#: one function may import the ingest (when called); nothing that reads or opens references may.
_ALLOWED = {("cubelake/refs/api.py", "build_refs"),
            # a prediction's COGs are written by the ingest's one-pass COG writer (cubelake.infer sits above it)
            ("cubelake/infer/product.py", "_cog_sink")}


@pytest.mark.parametrize("module", ["cubelake.loaders", "cubelake.refs", "cubelake.record", "cubelake.cube",
                                    "cubelake.lake", "cubelake.products"])
def test_importing_does_not_import_the_ingest(module: str) -> None:
    code = (f"import sys, {module}\n"
            "bad = sorted(m for m in sys.modules if m == 'cubelake.ingest' or m.startswith('cubelake.ingest.'))\n"
            "print(','.join(bad))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"importing {module} imported {res.stdout.strip()}"


_OPEN_REFS = """
import sys
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin

from cubelake.cube import CFEncoder, CubeSpec
from cubelake.loaders import open_source
from cubelake.refs import open_dataset, stat_target, tiff_layout, write_refs
from cubelake.refs.build import reference_tiff

folder = Path(sys.argv[1])
cube = np.arange(3 * 128 * 128, dtype="int16").reshape(3, 128, 128)
tif = folder / "s.tif"
with rasterio.open(tif, "w", driver="GTiff", count=3, height=128, width=128, dtype="int16", tiled=True,
                   blockxsize=64, blockysize=64, crs="EPSG:32633", transform=from_origin(0, 1280, 10, 10)) as dst:
    dst.write(cube)
spec = CubeSpec(shape=(3, 128, 128), encoding=CFEncoder("int16"), band_numbers=[1, 2, 3],
                wavelengths_nm=[500.0, 600.0, 700.0], fwhm_nm=[None] * 3, band_names=[None] * 3,
                transform=(10.0, 0.0, 0.0, 0.0, -10.0, 1280.0), crs_wkt=None, attrs={}, data_attrs={})
refs = reference_tiff(tiff_layout(str(tif)), stat_target(str(tif)), spec)
path = write_refs(refs, folder / "s.refs.json", "json")
assert (open_dataset(path)["data"].values == cube).all()
src = open_source(path)
assert src.n_bands == 3 and list(src.wavelengths_nm) == [500.0, 600.0, 700.0]
print(",".join(sorted(m for m in sys.modules if m == "cubelake.ingest" or m.startswith("cubelake.ingest."))))
"""


def test_building_and_opening_references_does_not_import_the_ingest(tmp_path: Path) -> None:
    """References of a cube described by the core, opened by cubelake.refs and by the loader: no ingest."""
    res = subprocess.run([sys.executable, "-c", _OPEN_REFS, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"imported {res.stdout.strip()}"


def _ingest_imports(path: Path) -> list[tuple[str, int]]:
    """``(enclosing function, line)`` of every import of ``cubelake.ingest`` in a source file."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else func
            if isinstance(child, ast.ImportFrom):
                mods = [child.module or ""]
            elif isinstance(child, ast.Import):
                mods = [a.name for a in child.names]
            else:
                mods = []
            if any(m == "cubelake.ingest" or m.startswith("cubelake.ingest.") for m in mods):
                found.append((func, child.lineno))
            visit(child, name)

    visit(tree, "<module>")
    return found


@pytest.mark.parametrize("folder", ["cubelake", "loaders"])
def test_no_source_file_of_the_core_refs_or_loaders_imports_the_ingest(folder: str) -> None:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("cubelake/cli/", "cubelake/jobs/")):
            continue  # the command line and the job runner (which schedules ingests) sit above everything
        bad += [f"{rel}:{line} ({func})" for func, line in _ingest_imports(path) if (rel, func) not in _ALLOWED]
    assert bad == []


def test_nothing_outside_the_tests_imports_from_them() -> None:
    """Test data lives in ``cubelake.testing``: the library, the benchmarks, the mutation runner and make reach
    into ``tests/`` neither by import, nor through ``sys.path``, nor with ``python -m tests...``."""
    found = []
    for folder in ("cubelake", "ingest", "catalog", "loaders", "bench", "mutation", ".ci"):
        for f in (ROOT / folder).rglob("*.py"):
            text = f.read_text()
            for node in ast.walk(ast.parse(text)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{f.relative_to(ROOT)}: import {n}" for n in names if n.split(".")[0] == "tests"]
            if "sys.path" in text and '"tests"' in text:
                found.append(f"{f.relative_to(ROOT)}: puts tests/ on sys.path")
    makefile = (ROOT / "Makefile").read_text()
    found += ["Makefile: python -m tests..." for _ in re.findall(r"-m tests\.", makefile)]
    assert found == []
