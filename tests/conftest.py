"""Shared fixtures: the real scenes, fresh lakes, a seeded raster factory, and a local S3 server."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin

from cubelake.lake import Lake
from tests import s3auth, zygote
from tests.s3auth import AuthS3

# A suite started in the background of a non-interactive shell (`cmd &` in a script) inherits
# SIGINT ignored, as POSIX has it, and so would every process it starts: Ctrl-C could not reach
# them. The Ctrl-C tests need it delivered as from a terminal, here and in the CLI processes.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]


def _real_data() -> Path:
    """The real scenes (see SOURCES.md there): $CUBELAKE_REAL_DATA, else ../shared next to the checkout."""
    if "CUBELAKE_REAL_DATA" in os.environ:
        return Path(os.environ["CUBELAKE_REAL_DATA"]).resolve()
    for cand in (ROOT.parent / "shared" / "data" / "real", Path("/work/shared/data/real")):
        if (cand / "SOURCES.md").is_file():
            return cand.resolve()
    return (ROOT.parent / "shared" / "data" / "real").resolve()


#: Tests fail, not skip, if the real scenes are missing.
REAL = _real_data()


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 300, cold: bool = False) -> subprocess.CompletedProcess[str]:
    """The real ``cubelake`` command in a new process; the test fails (TimeoutExpired) if it hangs.

    The process is forked from a warm one that has the stack imported (``tests/zygote.py``), saving a second
    or two a command; ``cold=True`` (or ``CUBELAKE_TEST_COLD_CLI=1`` for the whole run) starts
    ``python -m cubelake.cli`` from nothing instead.
    """
    argv = [sys.executable, "-m", "cubelake.cli", *args]
    full_env = {**os.environ, **(env or {})}
    if cold or zygote.cold():
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env,
                              errors="backslashreplace", check=False)
    code, out, err = zygote.run(list(args), full_env, str(cwd) if cwd is not None else None, timeout)
    return subprocess.CompletedProcess(argv, code, _text(out), _text(err))


def cli_process(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, stdout: int | None = None,
                stderr: int | None = None, text: bool = False) -> subprocess.Popen[Any] | zygote.WarmProcess:
    """``cubelake *args`` started in the background, to be signalled, killed or waited for: forked from the warm
    process (:class:`tests.zygote.WarmProcess`, the same ``Popen`` methods), or ``python -m cubelake.cli`` with
    ``CUBELAKE_TEST_COLD_CLI=1``."""
    full_env = {**os.environ, **(env or {})}
    if zygote.cold():
        return subprocess.Popen([sys.executable, "-m", "cubelake.cli", *args], env=full_env, cwd=cwd, stdout=stdout,
                                stderr=stderr, text=text)
    return zygote.WarmProcess(list(args), env=full_env, cwd=cwd, stdout=stdout, stderr=stderr, text=text)


def python_process(code: str, *args: str, stdout: int | None = None, stderr: int | None = None,
                   text: bool = False) -> subprocess.Popen[Any] | zygote.WarmProcess:
    """``python -c code *args`` in the background, forked from the warm process (cold with
    ``CUBELAKE_TEST_COLD_CLI=1``), as :func:`cli_process`."""
    if zygote.cold():
        return subprocess.Popen([sys.executable, "-c", code, *args], stdout=stdout, stderr=stderr, text=text)
    return zygote.WarmProcess(list(args), stdout=stdout, stderr=stderr, text=text, code=code)


def _text(data: bytes) -> str:
    """Bytes as ``subprocess.run(text=True, errors="backslashreplace")`` decodes them (universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="backslashreplace").read()


def no_traceback(res: subprocess.CompletedProcess[str]) -> str:
    """stdout + stderr of a command run, after checking no traceback or "cubelake bug" reached the user."""
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    assert "cubelake bug" not in out, out
    return out


@pytest.fixture(scope="session")
def real() -> Path:
    assert (REAL / "SOURCES.md").is_file(), f"real test data not found at {REAL}; set CUBELAKE_REAL_DATA"
    return REAL


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(tmp_path / "lake")


def write_geotiff(path: Path, data: np.ndarray, **profile: Any) -> Path:
    """Write ``data (band, y, x)`` as a GeoTIFF; ``profile`` overrides rasterio creation options."""
    nb, ny, nx = data.shape
    base: dict[str, Any] = {
        "driver": "GTiff", "width": nx, "height": ny, "count": nb, "dtype": data.dtype.name,
        "crs": "EPSG:32633", "transform": from_origin(500000.0, 5800000.0, 30.0, 30.0),
    }
    base.update(profile)
    band_tags = base.pop("band_tags", None)
    with rasterio.open(path, "w", **base) as dst:
        dst.write(data)
        if band_tags:
            for i, tags in enumerate(band_tags, start=1):
                dst.update_tags(i, **tags)
    return path


def hsi_cube(bands: int, height: int, width: int, dtype: str = "int16", seed: int = 0) -> np.ndarray:
    """A seeded, smooth-spectrum test cube ``(band, y, x)`` with values valid for ``dtype``."""
    rng = np.random.default_rng(seed)
    wl = np.linspace(0, 1, bands)[:, None, None]
    yy, xx = np.mgrid[0:height, 0:width]
    base = 0.3 + 0.2 * np.sin(yy / 7.0)[None] * np.cos(xx / 5.0)[None] + 0.3 * wl
    cube = base + rng.normal(0, 0.01, (bands, height, width))
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return cube.astype(dt)
    info = np.iinfo(dt)
    lo, hi = max(info.min, -30000), min(info.max, 30000)
    return np.clip(lo + (hi - lo) * (cube - cube.min()) / (cube.max() - cube.min() + 1e-9), lo + 1, hi - 1).astype(dt)


@pytest.fixture
def geotiff(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``geotiff(name, data, **profile)`` writes a GeoTIFF under the test's tmp dir."""

    def make(name: str, data: np.ndarray, **profile: Any) -> Path:
        return write_geotiff(tmp_path / name, data, **profile)

    return make


@dataclass(frozen=True)
class S3Server:
    """A real S3-protocol server (moto's server mode) on 127.0.0.1, and options to reach it."""

    endpoint: str
    options: dict[str, str]

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def env(self, tmp: Path) -> dict[str, str]:
        """The conventional variables a user sets for an S3-compatible endpoint, plus cubelake's cache and
        staging folders under ``tmp`` (for ``run_cli(..., env=...)``, which adds them to ``os.environ``)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "CUBELAKE_CACHE": str(tmp / "cache"),
                "CUBELAKE_STAGING": str(tmp / "staging")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts the S3-protocol server, through any fixture, is marked ``s3``: ``-m "not s3"``
    leaves out exactly the tests that need it (a hand-kept marker was missing on loader and lake tests)."""
    for item in items:
        if {"s3_server", "auth_s3"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's threaded server on a free loopback port for the whole session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        yield S3Server(endpoint, {"endpoint_url": endpoint, "key": "testing", "secret": "testing", "region": "us-east-1"})
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> str:
    """A fresh bucket for one test."""
    name = "t-" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + f"-{uuid.uuid4().hex[:6]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def auth_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthS3]:
    """moto in its own process with authentication on: users with the policies AWS needs (tests/s3auth.py)."""
    yield from s3auth.serve(tmp_path_factory.mktemp("auth-s3"))
