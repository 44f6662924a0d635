"""What a lake's readers and writers need on S3: the IAM action AWS checks for every request they make.

Each command runs as a user with only the documented policy on an S3 server that checks IAM policies
(``tests/s3auth.py``), and every request it made is mapped through the table of what AWS requires
(:data:`tests.s3auth.IAM_ACTION`): a new kind of request, or one that needs more than the README says,
fails here whatever the test server checks.
"""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from cubelake.storage import open_store

from .conftest import REAL, no_traceback, run_cli
from .s3auth import IAM_ACTION, READER_ACTIONS, WRITER_ACTIONS, AuthS3, Request, s3_operation

SCENE = REAL / "hsi_jasper_ridge"
SCENE_ID = "jasperRidge2_R198"


@dataclass(frozen=True)
class Run:
    result: subprocess.CompletedProcess[str]
    requests: list[Request]


def run_as(auth_s3: AuthS3, user: str, tmp: Path, *args: str) -> Run:
    """``cubelake *args`` with ``user``'s credentials, and the requests the server saw meanwhile."""
    mark = auth_s3.mark()
    res = run_cli(*args, env=auth_s3.env(user, tmp / uuid.uuid4().hex[:8]))
    return Run(res, auth_s3.requests_since(mark))


def actions(runs: list[Run]) -> set[str]:
    """The IAM actions AWS would check for the requests of ``runs``; fails on a request not in the table."""
    ops = {r.operation for run in runs for r in run.requests}
    unknown = sorted(op for op in ops if op not in IAM_ACTION)
    assert not unknown, f"requests whose IAM action is not known here; look it up in the S3 API Reference: {unknown}"
    return {IAM_ACTION[op] for op in ops}


def list_prefixes(runs: list[Run]) -> set[str]:
    """The ``prefix`` of every listing ``runs`` made."""
    return {parse_qs(urlsplit(r.target).query).get("prefix", [""])[0]
            for run in runs for r in run.requests if r.operation.startswith("ListObjects")}


def under_lake(url: str, prefixes: set[str]) -> bool:
    """Whether every listing stayed under the lake's prefix (what an ``s3:prefix`` condition would allow)."""
    lake = url.split("/", 3)[3]
    return all(p.startswith(f"{lake}/") for p in prefixes)


def _ok(run: Run) -> Run:
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    return run


@dataclass(frozen=True)
class AuthedLake:
    url: str
    ingest: Run


@pytest.fixture(scope="module")
def authed_lake(auth_s3: AuthS3, tmp_path_factory: pytest.TempPathFactory) -> AuthedLake:
    url = f"s3://{auth_s3.bucket}/lake-{uuid.uuid4().hex[:6]}"
    ingest = _ok(run_as(auth_s3, "writer", tmp_path_factory.mktemp("writer"), "ingest", "--lake", url, str(SCENE)))
    return AuthedLake(url, ingest)


def test_a_writer_needs_get_list_put_and_delete(auth_s3: AuthS3, authed_lake: AuthedLake, tmp_path: Path) -> None:
    url = authed_lake.url
    runs = [authed_lake.ingest,
            _ok(run_as(auth_s3, "writer", tmp_path, "ingest", "--lake", url, "--force", str(SCENE))),  # a replacement
            _ok(run_as(auth_s3, "writer", tmp_path, "lake", "gc", "--lake", url, "--grace", "0s")),
            _ok(run_as(auth_s3, "writer", tmp_path, "catalog", "reindex", "--lake", url))]
    assert "1 ingested" in runs[1].result.stdout, runs[1].result.stdout
    assert f"removed unreferenced version {SCENE_ID}/" in runs[2].result.stdout, runs[2].result.stdout
    assert actions(runs) == set(WRITER_ACTIONS)
    assert list_prefixes(runs)
    assert under_lake(url, list_prefixes(runs)), list_prefixes(runs)


def test_a_reader_needs_only_get_and_list(auth_s3: AuthS3, authed_lake: AuthedLake, tmp_path: Path) -> None:
    url = authed_lake.url
    cmds = {"search": ("catalog", "search", "--lake", url), "show": ("catalog", "show", "--lake", url, SCENE_ID),
            "stats": ("catalog", "stats", "--lake", url), "validate": ("catalog", "validate", "--lake", url),
            "lake": ("lake", "--lake", url), "copy": ("lake", "copy", url, str(tmp_path / "offline")),
            "plan": ("loader", "plan", "--lake", url, "--compute-ms", "5", "--link", "500mbps", "--batches", "2",
                     "--batch-size", "4")}
    runs = {name: _ok(run_as(auth_s3, "reader", tmp_path, *cmd)) for name, cmd in cmds.items()}
    assert SCENE_ID in runs["search"].result.stdout
    assert f'"id": "{SCENE_ID}"' in runs["show"].result.stdout
    assert (tmp_path / "offline" / "scenes" / SCENE_ID).is_dir()
    assert "samples/s" in runs["plan"].result.stdout, runs["plan"].result.stdout
    assert actions(list(runs.values())) == set(READER_ACTIONS)
    assert under_lake(url, list_prefixes(list(runs.values()))), list_prefixes(list(runs.values()))


def test_refusals_name_the_credentials_or_the_action_to_grant(auth_s3: AuthS3, authed_lake: AuthedLake,
                                                             tmp_path: Path) -> None:
    url = authed_lake.url
    admin = open_store(url, auth_s3.options("admin"))
    before = sorted((o.key, o.etag) for o in admin.list())
    bad = run_cli("catalog", "search", "--lake", url,
                  env=auth_s3.env("reader", tmp_path) | {"AWS_SECRET_ACCESS_KEY": "wrong"})
    _usage_error(bad, url, "credentials were rejected", "AWS_ACCESS_KEY_ID")
    denied = run_as(auth_s3, "reader", tmp_path, "ingest", "--lake", url, "--force", str(REAL / "hsi_samson"))
    _usage_error(denied.result, url, "cannot write: permission denied; this needs s3:PutObject",
                 "readers need s3:GetObject and s3:ListBucket, its writers also s3:PutObject and s3:DeleteObject")
    unlisted = run_as(auth_s3, "getter", tmp_path, "lake", "--lake", url)  # s3:GetObject only
    _usage_error(unlisted.result, url, "cannot list: permission denied; this needs s3:ListBucket on the bucket")
    assert sorted((o.key, o.etag) for o in admin.list()) == before  # nothing written


def _usage_error(res: subprocess.CompletedProcess[str], url: str, *needles: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    flat = " ".join(no_traceback(res).replace("│", " ").split())
    assert url in flat
    for n in needles:
        assert n in flat, flat


@pytest.mark.parametrize(("method", "target", "operation"), [
    ("HEAD", "/b/lake/lake.json", "HeadObject"),
    ("GET", "/b/lake/lake.json", "GetObject"),
    ("GET", "/b?list-type=2&prefix=lake/scenes/&delimiter=/&encoding-type=url", "ListObjectsV2"),
    ("GET", "/b?prefix=lake/", "ListObjects"),
    ("HEAD", "/b", "HeadBucket"),
    ("PUT", "/b/lake/x.tif", "PutObject"),
    ("POST", "/b/lake/x.tif?uploads", "CreateMultipartUpload"),
    ("PUT", "/b/lake/x.tif?partNumber=2&uploadId=u", "UploadPart"),
    ("POST", "/b/lake/x.tif?uploadId=u", "CompleteMultipartUpload"),
    ("DELETE", "/b/lake/x.tif?uploadId=u", "AbortMultipartUpload"),
    ("DELETE", "/b/lake/x.tif", "DeleteObject"),
    ("POST", "/b?delete", "DeleteObjects"),
    ("GET", "/b/lake/x.tif?tagging", "unknown GET /b/lake/x.tif?tagging"),
    ("GET", "/b?location", "unknown GET /b?location"),
    ("PUT", "/b", "unknown PUT /b"),
    ("GET", "/", "unknown GET /"),
])
def test_each_logged_request_is_named_by_its_s3_operation(method: str, target: str, operation: str) -> None:
    assert s3_operation(method, target) == operation


def test_a_large_product_uploads_in_parts_with_put_object_alone(auth_s3: AuthS3, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).bytes(17 * 1024 * 1024))  # three parts of 8 MiB at most
    writer = open_store(f"s3://{auth_s3.bucket}/parts-{uuid.uuid4().hex[:6]}", auth_s3.options("writer"))
    mark = auth_s3.mark()
    writer.put("products/big.bin", big)
    ops = [r.operation for r in auth_s3.requests_since(mark)]
    assert ops.count("UploadPart") == 3, ops
    assert "CompleteMultipartUpload" in ops, ops
    assert {IAM_ACTION[op] for op in ops} == {"s3:PutObject"}
    assert writer.get("products/big.bin") == big.read_bytes()
