"""References whose targets are s3:// URLs, against a real S3-protocol server (moto) on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cubelake.errors import StaleReferenceError, UntrustedTargetError
from cubelake.refs import build_refs, open_array, open_dataset, write_refs
from tests.conftest import S3Server, hsi_cube

pytestmark = pytest.mark.s3


def _upload(s3_server: S3Server, bucket: str, geotiff, name: str = "scene.tif") -> tuple[str, np.ndarray, Path]:
    data = hsi_cube(5, 200, 300)
    path = geotiff(name, data, tiled=True, blockxsize=128, blockysize=128, compress="zstd", predictor=2, nodata=-32768)
    s3_server.client().upload_file(str(path), bucket, f"scenes/{name}")
    return f"s3://{bucket}/scenes/{name}", data, path


def test_refs_to_s3_targets_read_value_exact(s3_server: S3Server, s3_bucket: str, geotiff, tmp_path: Path) -> None:
    url, data, _ = _upload(s3_server, s3_bucket, geotiff)
    refs = build_refs(url, storage_options=s3_server.options)  # header read over S3, geo through GDAL /vsis3/
    assert refs.targets[0].url == url
    assert refs.targets[0].etag
    out = write_refs(refs, tmp_path / "r.json")
    arr = open_array(out, allowed_roots=[f"s3://{s3_bucket}/scenes"], storage_options=s3_server.options)
    np.testing.assert_array_equal(arr[:], data)
    ds = open_dataset(out, allowed_roots=[f"s3://{s3_bucket}"], storage_options=s3_server.options)
    assert ds["data"].dims == ("band", "y", "x")
    assert "spatial_ref" in ds.coords
    assert ds["x"].size == 300


def test_other_bucket_is_untrusted(s3_server: S3Server, s3_bucket: str, geotiff, tmp_path: Path) -> None:
    url, _, _ = _upload(s3_server, s3_bucket, geotiff)
    out = write_refs(build_refs(url, storage_options=s3_server.options), tmp_path / "r.json")
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        open_array(out, storage_options=s3_server.options)
    with pytest.raises(UntrustedTargetError, match="outside the allowed roots"):
        open_array(out, allowed_roots=[f"s3://{s3_bucket}-other"], storage_options=s3_server.options)


def test_replaced_object_is_stale_by_etag(s3_server: S3Server, s3_bucket: str, geotiff, tmp_path: Path) -> None:
    url, data, path = _upload(s3_server, s3_bucket, geotiff)
    out = write_refs(build_refs(url, storage_options=s3_server.options), tmp_path / "r.json")
    roots = [f"s3://{s3_bucket}"]
    arr = open_array(out, allowed_roots=roots, storage_options=s3_server.options)
    np.testing.assert_array_equal(arr[:, :128, :128], data[:, :128, :128])
    raw = bytearray(path.read_bytes())
    raw[-64:] = bytes(64)  # same size, other bytes
    s3_server.client().put_object(Bucket=s3_bucket, Key="scenes/scene.tif", Body=bytes(raw))
    with pytest.raises(StaleReferenceError, match="ETag"):
        arr[:]  # every range request carries If-Match
    with pytest.raises(StaleReferenceError, match="ETag"):
        open_array(out, allowed_roots=roots, storage_options=s3_server.options)


def test_cli_build_from_s3_with_aws_environment(s3_server: S3Server, s3_bucket: str, geotiff, tmp_path: Path) -> None:
    url, data, _ = _upload(s3_server, s3_bucket, geotiff)
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    out = tmp_path / "cli.json"
    run = subprocess.run([sys.executable, "-m", "cubelake.cli", "refs", "build", url, "-o", str(out)],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "6 chunks" in run.stdout  # 200 x 300 pixels in 128-pixel tiles
    check = subprocess.run([sys.executable, "-m", "cubelake.cli", "refs", "check", str(out), "--allow-root",
                            f"s3://{s3_bucket}"], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stderr
    arr = open_array(out, allowed_roots=[f"s3://{s3_bucket}"], storage_options=s3_server.options)
    np.testing.assert_array_equal(arr[:], data)
