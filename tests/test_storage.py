"""Conformance of the storage seam: the same tests on a local folder, memory and a real S3-protocol server."""

from __future__ import annotations

import hashlib
import pickle
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from cubelake.storage import (
    CommitConflict,
    ObjectNotFound,
    S3Options,
    StorageError,
    Store,
    is_url,
    open_store,
    translate,
)

from .conftest import AuthS3, S3Server


@pytest.fixture(params=["local", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(tmp_path / "root")
    if request.param == "memory":
        return open_store(f"memory://m-{uuid.uuid4().hex[:8]}/root")
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/root", server.options)


def test_put_get_head_roundtrip(store: Store) -> None:
    info = store.put("a/b.bin", b"hello world")
    assert info.size == 11
    assert info.etag
    assert store.get("a/b.bin") == b"hello world"
    head = store.head("a/b.bin")
    assert head.size == 11
    assert head.etag == info.etag
    assert head.mtime is not None
    assert store.exists("a/b.bin")
    assert not store.exists("a/c.bin")
    assert store.get_text("a/b.bin") == "hello world"


def test_ranges_return_exact_bytes(store: Store) -> None:
    data = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    store.put("blob", data)
    starts, ends = [0, 10, 99_990, 5_000], [4, 4_010, 100_000, 70_000]
    got = store.get_ranges("blob", starts, ends)
    assert [bytes(g) for g in got] == [data[s:e] for s, e in zip(starts, ends, strict=True)]
    with pytest.raises(StorageError):  # past the end of the object: never silently short
        store.get_ranges("blob", [99_000], [100_100])


def test_missing_keys_raise_object_not_found(store: Store) -> None:
    for op in (lambda: store.get("nope"), lambda: store.head("nope"), lambda: store.get_ranges("nope", [0], [1])):
        with pytest.raises(ObjectNotFound) as exc:
            op()
        assert isinstance(exc.value, FileNotFoundError)
        assert "nope" in str(exc.value)
    store.delete("nope")  # deleting what is not there is fine


def test_conditional_create_conflicts(store: Store) -> None:
    store.put("ptr", b"first", create=True)
    with pytest.raises(CommitConflict, match="already exists"):
        store.put("ptr", b"second", create=True)
    assert store.get("ptr") == b"first"


def test_conditional_replace_by_etag(store: Store) -> None:
    first = store.put("ptr", b"v1")
    second = store.put("ptr", b"v2", if_match=first.etag)
    assert store.get("ptr") == b"v2"
    assert second.etag != first.etag
    with pytest.raises(CommitConflict, match="changed since it was read"):
        store.put("ptr", b"v3", if_match=first.etag)  # stale ETag: another writer won
    assert store.get("ptr") == b"v2"


def test_etag_changes_with_content(store: Store) -> None:
    a = store.put("k", b"one").etag
    b = store.put("k", b"two, longer").etag
    assert a != b
    assert store.head("k").etag == b


def test_listing_with_prefixes(store: Store) -> None:
    for key in ("scenes/a/x.json", "scenes/a/sub/y.bin", "scenes/ab/z.json", "scenes/b/x.json", "other.txt"):
        store.put(key, key.encode())
    assert sorted(o.key for o in store.list("scenes/a")) == ["scenes/a/sub/y.bin", "scenes/a/x.json"]
    assert sorted(o.key for o in store.list()) == sorted(
        ["scenes/a/x.json", "scenes/a/sub/y.bin", "scenes/ab/z.json", "scenes/b/x.json", "other.txt"])
    dirs, objs = store.list_dirs("scenes")
    assert dirs == ["a", "ab", "b"]
    assert objs == []
    dirs, objs = store.list_dirs("scenes/a")
    assert dirs == ["sub"]
    assert [o.key for o in objs] == ["scenes/a/x.json"]
    assert list(store.list("nothing-here")) == []
    assert store.delete_prefix("scenes/a") == 2
    assert sorted(o.key for o in store.list("scenes")) == ["scenes/ab/z.json", "scenes/b/x.json"]


def test_large_object_streams_in_parts(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    rng = np.random.default_rng(1)
    with open(src, "wb") as f:
        for _ in range(5):  # 20 MiB: more than two multipart parts
            f.write(rng.integers(0, 256, 4 * 1024 * 1024, dtype=np.uint8).tobytes())
    info = store.put("big/cube.bin", src)
    assert info.size == src.stat().st_size == store.head("big/cube.bin").size
    out = tmp_path / "back.bin"
    assert store.download("big/cube.bin", out) == info.size
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
    with store.open_reader("big/cube.bin") as fh:
        fh.seek(12_345_678)
        assert fh.read(100) == src.read_bytes()[12_345_678:12_345_778]


def test_copy_and_child(store: Store) -> None:
    store.put("v/1/a.txt", b"A")
    store.copy("v/1/a.txt", "v/2/a.txt")
    child = store.child("v/2")
    assert child.get("a.txt") == b"A"
    assert child.url == store.url_of("v/2")
    store.put("v/1/a.txt", b"B")
    store.copy("v/1/a.txt", "v/2/a.txt")  # replaces
    assert child.get("a.txt") == b"B"


def test_keys_cannot_escape_the_root(store: Store) -> None:
    for bad in ("../outside", "a/../../b", "a//b", "a/./b", "a\\b", "bad\x00key"):
        with pytest.raises(StorageError, match="not a valid object key"):
            store.put(bad, b"x")


def test_pickles_to_a_working_store(store: Store) -> None:
    store.put("p", b"pickled")
    again = pickle.loads(pickle.dumps(store))
    if store.scheme != "memory":  # a memory store lives in one process; a pickle carries its URL only
        assert again.get("p") == b"pickled"
    assert again.url == store.url


def test_urls_and_options() -> None:
    assert is_url("s3://b/k")
    assert is_url("memory://x")
    assert not is_url("/tmp/x")
    assert not is_url("file:///tmp/x")
    opts = S3Options.coerce({"endpoint_url": "http://127.0.0.1:9", "key": "K", "secret": "S", "anon": False})
    kw = opts.obstore_kwargs()
    assert kw["config"]["access_key_id"] == "K"
    assert kw["client_options"]["allow_http"] is True
    assert S3Options.coerce(opts) is opts
    with pytest.raises(StorageError, match="unsupported URL scheme"):
        Store("ftp://host/x")
    with pytest.raises(StorageError, match="no bucket"):
        Store("s3:///prefix")


def test_environment_configures_s3(s3_server: S3Server, s3_bucket: str) -> None:
    """AWS_ENDPOINT_URL, AWS_ALLOW_HTTP and the key variables are honoured in a fresh process."""
    code = (f"from cubelake.storage import open_store; s = open_store('s3://{s3_bucket}/env'); s.put('k', b'v'); "
            "print(s.get('k').decode())")
    env = {"PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ALLOW_HTTP": "true",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "v"


# -- clear errors against real servers ---------------------------------------------


def test_missing_bucket_is_named(s3_server: S3Server) -> None:
    store = open_store("s3://no-such-bucket-here/lake", s3_server.options)
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-here/lake/x: cannot write: the bucket does not exist"):
        store.put("x", b"1")
    with pytest.raises(StorageError, match="bucket does not exist"):
        list(store.list())


def test_unreachable_endpoint_fails_fast() -> None:
    import time

    store = open_store("s3://bucket/lake", {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s",
                                            "retry_timeout_s": 3})
    t0 = time.monotonic()
    with pytest.raises(StorageError, match="endpoint cannot be reached; check AWS_ENDPOINT_URL"):
        store.get("x")
    assert time.monotonic() - t0 < 15


def test_rejected_credentials_and_denied_permission(auth_s3: AuthS3) -> None:
    admin = open_store(f"s3://{auth_s3.bucket}/p", auth_s3.options("admin"))
    admin.put("obj", b"data")
    reader = open_store(f"s3://{auth_s3.bucket}/p", auth_s3.options("reader"))
    assert reader.get("obj") == b"data"
    with pytest.raises(StorageError, match=r"/p/new: cannot write: permission denied; this needs s3:PutObject \("):
        reader.put("new", b"x")
    with pytest.raises(StorageError, match=r"/p/obj: cannot delete: permission denied; this needs s3:DeleteObject"):
        reader.delete("obj")
    getter = open_store(f"s3://{auth_s3.bucket}/p", auth_s3.options("getter"))  # s3:GetObject only
    assert getter.head("obj").size == 4
    with pytest.raises(StorageError, match=r"/p: cannot list: permission denied; this needs s3:ListBucket on the"):
        list(getter.list())
    bad = open_store(f"s3://{auth_s3.bucket}/p", {**auth_s3.options("admin"), "secret": "wrong"})
    with pytest.raises(StorageError, match="credentials were rejected; set AWS_ACCESS_KEY_ID"):
        bad.get("obj")
    assert not admin.exists("new")


@pytest.mark.parametrize(("url", "what", "hint"), [
    ("/data/lake/x.tif", "read", "permission denied; check the owner and mode of this path"),
    ("s3://b/lake/x.tif", "stat", "permission denied; this needs s3:GetObject (a lake's readers need"),
    ("s3://b/lake/x.tif", "read ranges of", "permission denied; this needs s3:GetObject ("),
    ("s3://b/lake", "list", "permission denied; this needs s3:ListBucket on the bucket ("),
    ("s3://b/lake/x.tif", "write", "permission denied; this needs s3:PutObject ("),
    ("s3://b/lake/x.tif", "delete", "permission denied; this needs s3:DeleteObject ("),
    ("gs://b/lake/x.tif", "read", "permission denied; grant these credentials access to this bucket and prefix"),
])
def test_a_refusal_says_what_to_grant(url: str, what: str, hint: str) -> None:
    for exc in (PermissionError(13, "Permission denied"), RuntimeError("status: 403 Forbidden, AccessDenied")):
        err = translate(exc, url, what)
        assert isinstance(err, StorageError)
        assert str(err).startswith(f"{url}: cannot {what}: {hint}"), str(err)


# -- the local folder in detail: what an object store does not show ------------------------------------------


def test_a_local_store_lists_no_temporary_lock_or_special_files(tmp_path: Path) -> None:
    import os

    store = open_store(tmp_path / "root")
    store.put("a/x.json", b"{}")
    root = tmp_path / "root"
    for name in (".x.json.123.456.tmp", ".x.json.lock"):
        (root / "a" / name).write_bytes(b"")
    (root / "a" / ".hidden.json").write_bytes(b"1")  # a dot file that is ours neither: an object
    (root / "a" / "keep.tmp").write_bytes(b"2")
    os.mkfifo(root / "a" / "pipe")
    os.symlink(root / "a" / "x.json", root / "a" / "link.json")
    assert [o.key for o in store.list("a")] == ["a/.hidden.json", "a/keep.tmp", "a/x.json"]
    dirs, objs = store.list_dirs("a")
    assert dirs == []
    assert [o.key for o in objs] == ["a/.hidden.json", "a/keep.tmp", "a/x.json"]
    assert store.list_dirs("missing") == ([], [])
    with pytest.raises(ObjectNotFound):
        store.head("a/pipe")  # never opened: a FIFO could block a reader forever
    with pytest.raises(ObjectNotFound):
        store.get_ranges("a/pipe", [0], [1])


def test_a_local_store_rereads_a_replaced_file_and_closes_its_handles(tmp_path: Path) -> None:
    import os

    store = open_store(tmp_path / "root")
    store.put("c.bin", b"0123456789")
    assert store.get_ranges("c.bin", [2, 5], [4, 8]) == [b"23", b"567"]
    store.put("c.bin", b"abcdefghij")  # a new file (rename): the cached handle must not serve the old bytes
    assert store.get_ranges("c.bin", [0], [3]) == [b"abc"]
    before = len(os.listdir("/proc/self/fd"))
    store.put("c.bin", b"ABCDEFGHIJ")
    assert store.get_ranges("c.bin", [7], [10]) == [b"HIJ"]
    assert len(os.listdir("/proc/self/fd")) == before  # the old handle was closed, not leaked
    store.close()
    assert len(os.listdir("/proc/self/fd")) == before - 1


def test_a_local_put_leaves_no_temporary_file_even_when_it_loses(tmp_path: Path) -> None:
    store = open_store(tmp_path / "root")
    first = store.put("k.json", b"1", create=True)
    with pytest.raises(CommitConflict, match="already exists"):
        store.put("k.json", b"2", create=True)
    with pytest.raises(CommitConflict, match=r"changed since it was read \(ETag .*, expected nope\)"):
        store.put("k.json", b"3", if_match="nope")
    assert store.get("k.json") == b"1"
    assert store.put("k.json", b"4", if_match=first.etag).etag != first.etag
    with pytest.raises(CommitConflict):
        store.put("gone.json", b"5", if_match=first.etag)  # replace-only: nothing to replace
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == [".gone.json.lock", ".k.json.lock", "k.json"]


@pytest.mark.parametrize(("text", "data", "has_etag"), [
    (None, None, False), (b'{"a": 1}', {"a": 1}, True), (b"[1, 2]", None, True), (b"{not json", None, True),
    (b"\xff\xfe binary", None, True),
])
def test_read_json_info(tmp_path: Path, text: bytes | None, data: object, has_etag: bool) -> None:
    from cubelake.storage import read_json_info

    store = open_store(tmp_path / "root")
    if text is not None:
        store.put("o.json", text)
    got, etag = read_json_info(store, "o.json", 1024)
    assert got == data
    assert (etag == store.head("o.json").etag) if has_etag else etag is None


def test_read_json_info_refuses_what_is_over_its_size(tmp_path: Path) -> None:
    from cubelake.storage import read_json_info

    store = open_store(tmp_path / "root")
    store.put("o.json", b'{"a": "' + b"x" * 100 + b'"}')
    assert read_json_info(store, "o.json", 200)[0] == {"a": "x" * 100}
    got, etag = read_json_info(store, "o.json", 50)
    assert got is None
    assert etag == store.head("o.json").etag  # replaceable by a conditional write


@pytest.mark.parametrize("key", ["a", "a/b", "/a/b/", "a/b.c/d", "a b/c"])
def test_good_keys(key: str) -> None:
    from cubelake.storage import check_key

    assert check_key(key) == key.strip("/")


@pytest.mark.parametrize("key", ["", "/", "..", "a/..", "./a", "a//b", "a\\b", "a\x1fb", "a\nb"])
def test_bad_keys(key: str) -> None:
    from cubelake.storage import check_key

    with pytest.raises(StorageError, match="not a valid object key"):
        check_key(key)


def test_a_local_store_opens_each_unchanged_file_once_and_touches_no_other_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    store = open_store(tmp_path / "root")
    store.put("c.bin", b"0123456789")
    std = [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (0, 1, 2)]
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *args: int) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", counting_open)
    for _ in range(5):
        assert store.get_ranges("c.bin", [1], [3]) == [b"12"]
    assert opened == [str(tmp_path / "root" / "c.bin")]  # one handle for repeated reads of an unchanged file
    assert [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (0, 1, 2)] == std  # no standard stream closed
    store.close()
