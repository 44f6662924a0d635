"""The lock: every requirement of the package and its extras is pinned there, and the tests run on what it pins.

``make`` installs ``requirements/lock.txt`` (exact versions, hashes) and then the package without dependencies,
so a requirement added to ``pyproject.toml`` without ``make lock`` would be missing on a fresh machine: these
tests catch it here first.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from .conftest import ROOT

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)
EXTRAS = ("torch", "test", "bench")  # the extras `make lock` locks and `make` installs


def pins(path: Path) -> dict[str, Version]:
    """``name==version`` lines of a lock file, by canonical name."""
    return {canonicalize_name(n): Version(v) for n, v in _PIN.findall(path.read_text())}


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project["optional-dependencies"][extra]
    return [Requirement(r) for r in reqs]


def test_every_requirement_of_the_package_and_its_extras_is_pinned_in_the_lock() -> None:
    lock = pins(ROOT / "requirements" / "lock.txt")
    assert len(lock) > 150
    missing, outside = [], []
    for req in project_requirements():
        if req.marker is not None and not req.marker.evaluate():
            continue
        pinned = lock.get(canonicalize_name(req.name))
        if pinned is None:
            missing.append(str(req))
        elif not req.specifier.contains(pinned, prereleases=True):
            outside.append(f"{req} (locked {pinned})")
    assert missing == [], "not in the lock: run `make lock`"
    assert outside == [], "locked outside the range pyproject.toml asks for: run `make lock`"


def test_the_lock_pins_the_cpu_torch_and_hashes_every_package() -> None:
    text = (ROOT / "requirements" / "lock.txt").read_text()
    assert pins(ROOT / "requirements" / "lock.txt")["torch"] == Version("2.13.0+cpu")
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2]):
        if "==" in block:
            assert "--hash=sha256:" in block, block.splitlines()[0]


def test_the_build_tools_are_locked_at_the_same_versions() -> None:
    lock, build = pins(ROOT / "requirements" / "lock.txt"), pins(ROOT / "requirements" / "build.txt")
    assert {"pip", "setuptools", "wheel"} <= set(build)
    assert {name: v for name, v in build.items() if lock.get(name) != v} == {}


def test_the_tests_run_on_the_locked_versions() -> None:
    """What this environment has is what the lock pins (a stale .venv after `make lock`: `make clean test`)."""
    drift = {}
    for name, version in pins(ROOT / "requirements" / "lock.txt").items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            drift[name] = f"locked {version}, installed {installed}"
    assert drift == {}
