"""What ``pip install cubelake`` promises: every import is declared, nothing declared is unused,
torch is an extra with a clear message, and nothing POSIX-only is imported at module level."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

PACKAGE_DIRS = ("cubelake", "ingest", "catalog", "loaders")
#: declared for what they bring, not imported by name
IMPLICIT = {
    "imagecodecs",  # the TIFF/zstd codecs numcodecs and cubelake_tiff load by entry point
    "pyproj",  # rasterio/shapely CRS handling; also imported lazily
    "bokeh",  # the Dask dashboard a job prints the address of (distributed serves it when bokeh is installed)
    "h5netcdf",  # xarray's engine="h5netcdf" for NetCDF-4/HDF5 cubes (ingest/sources/netcdf.py)
}


def _requirement_names(reqs: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


TESTING = ROOT / "cubelake" / "testing"  # test data (cubelake.testing): may import the test extra


def _imported_distributions(testing: bool = False) -> list[set[str]]:
    """For each third-party module the package imports anywhere (module level or lazily), the
    distributions that provide it (a namespace such as ``pystac`` may come from several); of
    ``cubelake.testing`` alone with ``testing``, else of everything but it."""
    dists = md.packages_distributions()
    out: dict[str, set[str]] = {}
    for d in PACKAGE_DIRS:
        for f in (ROOT / d).rglob("*.py"):
            if f.is_relative_to(TESTING) != testing:
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                         else [])
                for n in names:
                    top = n.split(".")[0]
                    if top in sys.stdlib_module_names or top == "cubelake":
                        continue
                    out[top] = {x.lower().replace("_", "-") for x in dists.get(top, [top])}
    return list(out.values())


def test_every_import_is_declared_and_every_dependency_is_used() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _requirement_names(meta["dependencies"])
    extras = _requirement_names(meta["optional-dependencies"]["torch"])
    imported = _imported_distributions()
    undeclared = [sorted(p) for p in imported if not p & (declared | extras)]
    assert undeclared == [], "imported but not declared"
    used = set().union(*imported)
    assert declared - used - IMPLICIT == set(), "declared but never imported"
    assert extras == {"torch"}


def test_the_testing_package_imports_only_the_core_and_the_test_extra() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _requirement_names(meta["dependencies"]) | _requirement_names(meta["optional-dependencies"]["test"])
    undeclared = [sorted(p) for p in _imported_distributions(testing=True) if not p & declared]
    assert undeclared == [], "imported by cubelake.testing but declared neither by the core nor the test extra"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_loaders_without_torch_say_how_to_get_it() -> None:
    res = _run("import sys; sys.modules['torch'] = None; import cubelake.loaders")
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: cubelake.loaders needs PyTorch")
    assert "pip install 'cubelake[torch]'" in last


def test_the_package_imports_without_posix_only_modules() -> None:
    res = _run("import sys\nfor m in ('fcntl', 'resource', 'termios', 'pwd', 'grp'): sys.modules[m] = None\n"
               "import cubelake, cubelake.lake, cubelake.ingest, cubelake.catalog, cubelake.refs, cubelake.cli\n"
               "import cubelake.loaders\nfrom cubelake.lake import Lake\n"
               "import tempfile, pathlib\nlk = Lake(pathlib.Path(tempfile.mkdtemp()) / 'lake')\n"
               "with lk.lock('x') as held: print(held)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True"


def test_scene_locks_exclude_other_processes(tmp_path: Path) -> None:
    from cubelake.lake import Lake

    lake = Lake(tmp_path / "lake")
    code = (f"from cubelake.lake import Lake\nwith Lake({str(lake.root)!r}).lock('s', blocking=False) as held: "
            "print(held)")
    with lake.lock("s") as held:
        assert held
        assert _run(code).stdout.strip() == "False"
    assert _run(code).stdout.strip() == "True"
