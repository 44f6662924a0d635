"""The object-store commit protocol of :class:`cubelake.object_lake.ObjectLake`, fast: lakes on ``memory://``
stores (obstore's MemoryStore honours create-only and If-Match puts as S3 does) and scenes staged by hand
(an item and a few product files), so every test runs in milliseconds (mutation testing runs them per mutant).
tests/test_object_lake.py has the same protocol against an S3-protocol server with real ingests."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import cubelake.object_lake as olake
from cubelake.errors import LakeError
from cubelake.lake import LAKE_VERSION, pid_alive
from cubelake.object_lake import (
    VERSION_KEY,
    ObjectLake,
    committed_item,
    new_version,
    staging_root,
    version_time,
)
from cubelake.storage import CommitConflict, StorageError, open_store

SID = "S2A_tile-1.v2"
NOW = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
RECORD = {"scene_id": SID, "content_hash": "abc",
          "source": {"path": "/x/s.tif", "format": "GTiff", "shape": [1, 2, 2], "dtype": "uint16"},
          "grid": {"height": 2, "width": 2, "transform": [1, 0, 0, 0, -1, 0], "chunk_shape": [1, 2, 2]},
          "bands": [{"index": 0, "source_band": 1}]}


@pytest.fixture(autouse=True)
def staging_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Local staging folders (and what recover() removes) in this test's folder, never the shared temp folder."""
    monkeypatch.setenv("CUBELAKE_STAGING", str(tmp_path / "tmp"))
    return tmp_path / "tmp" / "cubelake-staging"


@pytest.fixture
def url() -> str:
    return f"memory://olake-{uuid.uuid4().hex[:12]}/team/lake"


@pytest.fixture
def lake(url: str) -> ObjectLake:
    return ObjectLake(url)


class _Frozen(dt.datetime):
    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return NOW


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> dt.datetime:
    """The module's clock stopped at NOW (new versions are named at NOW; ages are counted from NOW)."""
    monkeypatch.setattr(olake, "dt", SimpleNamespace(datetime=_Frozen, UTC=dt.UTC, timedelta=dt.timedelta))
    return NOW


def item_of(sid: str = SID) -> dict[str, Any]:
    return {"type": "Feature", "id": sid, "properties": {"datetime": "2024-01-02T03:04:05Z"},
            "assets": {"zarr": {"href": f"./{sid}.zarr", "roles": ["data"]},
                       "cog": {"href": f"./{sid}.tif"},
                       "source": {"href": "s3://elsewhere/raw/x.tif"}}}


def stage(root: Path, sid: str = SID, tag: bytes = b"1") -> tuple[Path, dict[str, bytes]]:
    """A staged scene folder: its item plus product files (nested, like a Zarr store); the files but the item."""
    folder = root / f"staged-{uuid.uuid4().hex[:8]}"
    files = {"scene.json": json.dumps({**RECORD, "scene_id": sid, "content_hash": tag.decode()}).encode(),
             f"{sid}.tif": b"II*\x00" + tag * 100,
             f"{sid}.zarr/zarr.json": b'{"zarr_format": 3}',
             f"{sid}.zarr/data/c/0/0/0": bytes(range(256)) + tag,
             "thumbnail.png": b"\x89PNG" + tag}
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    (folder / "item.json").write_text(json.dumps(item_of(sid)))
    return folder, files


def keys(lake: ObjectLake, prefix: str) -> list[str]:
    return sorted(o.key for o in lake.store.list(prefix))


def versions(lake: ObjectLake, sid: str = SID) -> list[str]:
    return lake.store.list_dirs(f"scenes/{sid}/v")[0]


def put_version(lake: ObjectLake, version: str, sid: str = SID, n: int = 2) -> None:
    for i in range(n):
        lake.store.put(f"scenes/{sid}/v/{version}/f{i}", b"x")


# -- names -------------------------------------------------------------------------------------------


def test_a_version_name_is_its_utc_second_and_twelve_random_hex_digits() -> None:
    v = new_version(NOW)
    assert re.fullmatch(r"20310506T070809-[0-9a-f]{12}", v), v
    assert new_version(NOW) != v
    assert version_time(v) == NOW
    assert version_time(v).tzinfo is dt.UTC
    fresh = version_time(new_version())
    assert fresh is not None
    assert abs(dt.datetime.now(dt.UTC) - fresh) < dt.timedelta(seconds=5)
    later = new_version(NOW + dt.timedelta(seconds=1))
    next_year = new_version(NOW + dt.timedelta(days=400))
    assert sorted([next_year, later, v]) == [v, later, next_year]  # names sort by time


def test_version_time_is_none_for_names_that_are_not_times() -> None:
    assert version_time("garbage") is None
    assert version_time("") is None
    assert version_time("20311306T070809-abc") is None  # month 13
    assert version_time("20310506T070809") == NOW
    assert version_time("20310506T070809-zz") == NOW


def test_the_commit_object_points_its_relative_assets_into_the_version() -> None:
    item = item_of()
    out = committed_item(item, "V1")
    assert out["assets"]["zarr"] == {"href": f"./v/V1/{SID}.zarr", "roles": ["data"]}
    assert out["assets"]["cog"]["href"] == f"./v/V1/{SID}.tif"
    assert out["assets"]["source"]["href"] == "s3://elsewhere/raw/x.tif"
    assert out["properties"] == {"datetime": "2024-01-02T03:04:05Z", VERSION_KEY: "V1"}
    assert item == item_of()  # the staged item is not changed
    assert committed_item({"id": "x"}, "V2") == {"id": "x", "properties": {VERSION_KEY: "V2"}}
    assert VERSION_KEY == "cubelake:version"


# -- the lake marker --------------------------------------------------------------------------------------


def test_a_new_prefix_becomes_a_lake_with_a_create_only_marker(url: str) -> None:
    lake = ObjectLake(url)
    assert lake.url == lake.root == url
    assert repr(lake) == f"ObjectLake({url!r})"
    assert lake.is_local is False
    assert lake.store.get("lake.json") == (json.dumps({"format": "cubelake-lake", "version": LAKE_VERSION})
                                           + "\n").encode()
    lake.allow_root("s3://other/raw")
    lake._create()  # a second creator (a race lost) keeps the marker it found
    assert ObjectLake(url).allowed_roots == ["s3://other/raw"]
    assert keys(lake, "") == ["lake.json"]


def test_an_empty_prefix_opened_without_create_is_not_a_lake(url: str) -> None:
    with pytest.raises(LakeError) as err:
        ObjectLake(url, create=False)
    assert str(err.value) == (f"{url}: no cubelake lake here (no lake.json); create one with "
                              f"'cubelake ingest SCENES --lake {url}'")
    assert list(open_store(url).list("")) == []  # nothing written


@pytest.mark.parametrize("what", ["object", "folder"])
def test_a_prefix_holding_other_objects_is_not_taken_over(url: str, what: str) -> None:
    store = open_store(url)
    store.put("data.bin" if what == "object" else "sub/data.bin", b"mine")
    with pytest.raises(LakeError) as err:
        ObjectLake(url)
    assert str(err.value) == f"{url}: holds objects and is not a cubelake lake; choose an empty or new --lake prefix"
    assert not store.exists("lake.json")


@pytest.mark.parametrize(("marker", "message"), [
    (b"not json", "{url}/lake.json: unreadable lake marker (Expecting value: line 1 column 1 (char 0)); is this a "
                  "cubelake lake?"),
    (b"[1, 2]", "{url}/lake.json: not a cubelake lake marker (format=None)"),
    (b'{"version": 1}', "{url}/lake.json: not a cubelake lake marker (format=None)"),
    (b'{"format": "zarr", "version": 1}', "{url}/lake.json: not a cubelake lake marker (format='zarr')"),
    (json.dumps({"format": "cubelake-lake", "version": LAKE_VERSION + 1}).encode(),
     f"{{url}}: lake format version {LAKE_VERSION + 1} is newer than this cubelake understands ({LAKE_VERSION}); "
     "upgrade cubelake"),
    (b'{"format": "cubelake-lake", "version": "1"}',
     f"{{url}}: lake format version '1' is newer than this cubelake understands ({LAKE_VERSION}); upgrade cubelake"),
])
def test_a_prefix_whose_marker_is_not_a_cubelake_lake_is_refused(url: str, marker: bytes, message: str) -> None:
    open_store(url).put("lake.json", marker)
    with pytest.raises(LakeError) as err:
        ObjectLake(url)
    assert str(err.value) == message.format(url=url)
    assert open_store(url).get("lake.json") == marker  # not overwritten


@pytest.mark.parametrize("version", [None, 0, LAKE_VERSION])
def test_markers_of_this_or_older_formats_are_lakes(url: str, version: int | None) -> None:
    marker = {"format": "cubelake-lake"} if version is None else {"format": "cubelake-lake", "version": version}
    open_store(url).put("lake.json", json.dumps(marker).encode())
    assert ObjectLake(url, create=False).url == url


def test_a_marker_or_item_over_16_mib_is_not_read(lake: ObjectLake) -> None:
    limit = 16 * 1024 * 1024
    pad = b'{"a": "' + b"x" * (limit - 9) + b'"}'
    assert len(pad) == limit
    lake.store.put("scenes/big/item.json", pad)
    lake.store.put("scenes/bigger/item.json", pad + b" ")
    assert lake.read_json("scenes/big/item.json") == {"a": "x" * (limit - 9)}
    assert lake.read_json("scenes/bigger/item.json") is None


def test_allow_root_adds_a_root_once_and_retries_a_lost_replace(lake: ObjectLake, monkeypatch: pytest.MonkeyPatch) \
        -> None:
    assert lake.reference_roots() == [lake.url]
    assert lake.allow_root("s3://a/raw") is True
    assert lake.allow_root("s3://a/raw") is False
    real_put, calls = lake.store.put, []

    def racing_put(key: str, data: Any, **kw: Any) -> Any:
        calls.append(kw)
        if len(calls) == 1:  # another writer replaces the marker between our read and our write
            real_put(key, json.dumps({"format": "cubelake-lake", "version": 1,
                                      "allowed_roots": ["s3://a/raw", "s3://c/raw"]}).encode())
        return real_put(key, data, **kw)

    monkeypatch.setattr(lake.store, "put", racing_put)
    assert lake.allow_root("s3://b/raw") is True
    assert len(calls) == 2
    assert lake.allowed_roots == ["s3://a/raw", "s3://c/raw", "s3://b/raw"]
    assert lake.reference_roots() == [lake.url, "s3://a/raw", "s3://c/raw", "s3://b/raw"]


def test_allow_root_gives_up_after_20_lost_replaces(lake: ObjectLake, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def losing_put(key: str, data: Any, **kw: Any) -> Any:
        calls.append(kw)
        raise CommitConflict("lost")

    monkeypatch.setattr(lake.store, "put", losing_put)
    with pytest.raises(LakeError) as err:
        lake.allow_root("s3://b/raw")
    assert str(err.value) == f"{lake.url}: lake.json kept changing under 20 attempts to add s3://b/raw; try again"
    assert len(calls) == 20
    assert all(kw["if_match"] for kw in calls)


def test_the_write_probe_leaves_nothing_and_space_text_names_the_store(lake: ObjectLake) -> None:
    lake.check_writable()
    assert keys(lake, "") == ["lake.json"]
    assert lake.space_text() == f"object store {lake.url}"
    assert lake.space_text(1234) == f"object store {lake.url}; this scene needs up to about 1234 bytes"
    with lake.lock(SID) as got:
        assert got is True
    with lake.lock(SID, blocking=False) as got:
        assert got is True


# -- layout ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a/b", "../x", "..", ".hidden", "a..b", "a b", "x/../y", "a\\b", "", "s.", "-s"])
def test_unsafe_scene_ids_are_refused(lake: ObjectLake, bad: str) -> None:
    for call in (ObjectLake._check_id, lake.item_key, lake.rejected_key, lambda s: lake.version_key(s, "v1")):
        with pytest.raises(LakeError) as err:
            call(bad)
        assert str(err.value) == f"{bad!r} is not a safe scene id"


def test_keys_of_a_scene(lake: ObjectLake) -> None:
    assert ObjectLake._check_id(SID) == SID
    assert lake.item_key(SID) == f"scenes/{SID}/item.json"
    assert lake.version_key(SID, "20310506T070809-0a1b") == f"scenes/{SID}/v/20310506T070809-0a1b"
    assert lake.rejected_key(SID) == f"rejected/{SID}.json"
    assert lake.rejected_path(SID) == f"{lake.url}/rejected/{SID}.json"
    for bad in ("../v", "a/b", ".."):
        with pytest.raises(LakeError) as err:
            lake.version_key(SID, bad)
        assert str(err.value) == f"{lake.url}: scene {SID}: version {bad!r} is not a safe name"


def test_scene_and_rejected_ids_list_only_what_is_theirs(lake: ObjectLake) -> None:
    assert lake.scene_ids() == []
    assert lake.rejected_ids() == []
    for sid in ("b", "a"):
        lake.store.put(f"scenes/{sid}/item.json", b"{}")
    lake.store.put("scenes/not safe/item.json", b"{}")
    assert lake.scene_ids() == ["a", "b"]
    for sid in ("zz", "b1", "a.1"):
        lake.record_rejection(sid, {"why": sid})
    lake.store.put("rejected/notes.txt", b"x")
    assert lake.rejected_ids() == ["a.1", "b1", "zz"]


def test_a_rejection_record_round_trips(lake: ObjectLake) -> None:
    assert lake.rejected_record(SID) is None
    record = {"scene": SID, "errors": ["band 3: all nodata"], "n": 1}
    assert lake.record_rejection(SID, record) == f"{lake.url}/rejected/{SID}.json"
    assert lake.rejected_record(SID) == record
    assert lake.store.get(f"rejected/{SID}.json") == (json.dumps(record, indent=2) + "\n").encode()
    lake.record_rejection(SID, {"n": 2})
    assert lake.rejected_record(SID) == {"n": 2}


# -- reading the published scene --------------------------------------------------------------------------


def test_an_unpublished_scene_reads_as_none(lake: ObjectLake) -> None:
    assert lake.committed(SID) == (None, None)
    assert lake.scene_version(SID) is None
    assert lake.scene_location(SID) is None
    assert lake.scene_record(SID) is None


def test_the_published_scene_is_read_through_its_commit_object(lake: ObjectLake, tmp_path: Path) -> None:
    staged, _ = stage(tmp_path)
    where = lake.publish(staged, SID)
    item, etag = lake.committed(SID)
    assert item is not None
    assert etag == lake.store.head(f"scenes/{SID}/item.json").etag
    version = lake.scene_version(SID)
    assert version is not None
    assert where == lake.scene_location(SID) == f"{lake.url}/scenes/{SID}/v/{version}"
    rec = lake.scene_record(SID)
    assert rec is not None
    assert (rec.scene_id, rec.content_hash) == (SID, "1")


def test_a_commit_object_without_a_usable_version_or_record_reads_as_unpublished(lake: ObjectLake,
                                                                                    caplog: Any) -> None:
    lake.store.put(f"scenes/{SID}/item.json", json.dumps({"properties": {VERSION_KEY: 7}}).encode())
    assert lake.scene_version(SID) is None
    assert lake.scene_record(SID) is None
    lake.store.put(f"scenes/{SID}/item.json", json.dumps({"properties": {VERSION_KEY: "v1"}}).encode())
    assert lake.scene_version(SID) == "v1"
    assert lake.scene_record(SID) is None  # the version holds no scene.json
    lake.store.put(f"scenes/{SID}/v/v1/scene.json", b"{broken")
    with caplog.at_level("WARNING", logger="cubelake.object_lake"):
        assert lake.scene_record(SID) is None
    assert "unreadable scene record" in caplog.text
    lake.store.put(f"scenes/{SID}/v/v1/scene.json", json.dumps(RECORD).encode())
    rec = lake.scene_record(SID)
    assert rec is not None
    assert rec.scene_id == SID


# -- publishing ------------------------------------------------------------------------------------------


def test_a_publish_uploads_every_staged_file_and_commits_the_item(lake: ObjectLake, tmp_path: Path,
                                                                   frozen: dt.datetime) -> None:
    staged, files = stage(tmp_path)
    lake.record_rejection(SID, {"why": "an earlier attempt"})
    where = lake.publish(staged, SID)
    (version,) = versions(lake)
    assert version_time(version) == frozen
    prefix = f"scenes/{SID}/v/{version}"
    assert where == f"{lake.url}/{prefix}"
    assert keys(lake, prefix) == sorted(f"{prefix}/{rel}" for rel in files)  # everything but the item
    for rel, data in files.items():
        assert lake.store.get(f"{prefix}/{rel}") == data
    body = lake.store.get(f"scenes/{SID}/item.json")
    committed = committed_item(item_of(), version)
    assert body == (json.dumps(committed, indent=1) + "\n").encode()
    assert committed["assets"]["cog"]["href"] == f"./v/{version}/{SID}.tif"
    assert lake.rejected_record(SID) is None
    assert lake.rejected_ids() == []
    assert keys(lake, "") == sorted(["lake.json", f"scenes/{SID}/item.json", *(f"{prefix}/{rel}" for rel in files)])


def test_a_second_writer_of_a_new_scene_loses_the_create_only_commit(url: str, tmp_path: Path) -> None:
    a, b = ObjectLake(url), ObjectLake(url)
    assert a.scene_record(SID) is None
    assert b.scene_record(SID) is None  # both saw no scene, both build it
    a.publish(stage(tmp_path, tag=b"a")[0], SID)
    won = a.store.get(f"scenes/{SID}/item.json")
    with pytest.raises(CommitConflict) as err:
        b.publish(stage(tmp_path, tag=b"b")[0], SID)
    assert str(err.value) == (f"{url}: scene {SID} was published by another ingest while this one was building it; "
                              "nothing of this run was published. Run the ingest again to compare with the new "
                              "version")
    assert err.value.__cause__ is None
    assert err.value.__suppress_context__
    assert versions(a) == [a.scene_version(SID)]  # the loser's upload is gone
    assert a.store.get(f"scenes/{SID}/item.json") == won
    rec = a.scene_record(SID)
    assert rec is not None
    assert rec.content_hash == "a"


def test_a_writer_that_never_read_the_scene_does_not_overwrite_it(url: str, tmp_path: Path) -> None:
    a = ObjectLake(url)
    a.publish(stage(tmp_path)[0], SID)
    with pytest.raises(CommitConflict, match="nothing of this run was published"):
        a.publish(stage(tmp_path)[0], SID)  # the ETag it had is spent: a new publish must read the scene again
    with pytest.raises(CommitConflict, match="nothing of this run was published"):
        ObjectLake(url).publish(stage(tmp_path)[0], SID)
    assert len(versions(a)) == 1


def test_a_replace_commits_if_the_item_is_unchanged_since_it_was_read(url: str, tmp_path: Path) -> None:
    a, b = ObjectLake(url), ObjectLake(url)
    a.publish(stage(tmp_path, tag=b"1")[0], SID)
    first = a.scene_version(SID)
    a.scene_record(SID)
    b.scene_record(SID)  # both read the same commit object, then both build
    a.publish(stage(tmp_path, tag=b"2")[0], SID)
    second = a.scene_version(SID)
    assert second != first
    won = a.store.get(f"scenes/{SID}/item.json")
    with pytest.raises(CommitConflict) as err:
        b.publish(stage(tmp_path, tag=b"3")[0], SID)
    assert f"{url}: scene {SID} was published by another ingest" in str(err.value)
    assert "nothing of this run was published" in str(err.value)
    assert a.store.get(f"scenes/{SID}/item.json") == won
    assert sorted(versions(a)) == sorted([first, second])  # the loser's upload is gone; the replaced one waits for gc
    rec = a.scene_record(SID)
    assert rec is not None
    assert rec.content_hash == "2"
    b.scene_record(SID)  # b reads again: now its replace commits
    b.publish(stage(tmp_path, tag=b"4")[0], SID)
    rec = a.scene_record(SID)
    assert rec is not None
    assert rec.content_hash == "4"


def test_a_replace_uses_if_match_with_the_etag_read(lake: ObjectLake, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    lake.publish(stage(tmp_path)[0], SID)
    _, etag = lake.committed(SID)
    assert etag is not None
    real_put, item_puts = lake.store.put, []

    def spy(key: str, data: Any, **kw: Any) -> Any:
        if key.endswith("item.json"):
            item_puts.append(kw)
        return real_put(key, data, **kw)

    monkeypatch.setattr(lake.store, "put", spy)
    lake.publish(stage(tmp_path)[0], SID)
    lake.publish(stage(tmp_path)[0], "new-scene")
    with pytest.raises(CommitConflict):  # the ETag read is spent on the commit it made: no replace without a read
        lake.publish(stage(tmp_path)[0], SID)
    assert item_puts == [{"if_match": etag}, {"create": True}, {"create": True}]


def test_a_failed_upload_deletes_the_version_and_leaves_the_commit(lake: ObjectLake, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    lake.publish(stage(tmp_path, tag=b"1")[0], SID)
    before = keys(lake, "")
    lake.scene_record(SID)
    real_put = lake.store.put

    def failing_put(key: str, data: Any, **kw: Any) -> Any:
        if key.endswith("thumbnail.png"):
            raise StorageError("disk on fire")
        return real_put(key, data, **kw)

    monkeypatch.setattr(lake.store, "put", failing_put)
    with pytest.raises(StorageError) as err:
        lake.publish(stage(tmp_path, tag=b"2")[0], SID)
    assert type(err.value) is StorageError
    assert str(err.value) == "disk on fire"
    assert keys(lake, "") == before
    rec = lake.scene_record(SID)
    assert rec is not None
    assert rec.content_hash == "1"


def test_an_interrupted_publish_deletes_its_version(lake: ObjectLake, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real_put = lake.store.put

    def interrupted(key: str, data: Any, **kw: Any) -> Any:
        if key.endswith("item.json"):
            raise KeyboardInterrupt
        return real_put(key, data, **kw)

    monkeypatch.setattr(lake.store, "put", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lake.publish(stage(tmp_path)[0], SID)
    assert keys(lake, "") == ["lake.json"]


def test_a_conflict_is_reported_even_when_deleting_the_upload_fails(url: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = ObjectLake(url), ObjectLake(url)
    a.publish(stage(tmp_path)[0], SID)

    def broken_delete(prefix: str) -> int:
        raise StorageError("no delete permission")

    monkeypatch.setattr(b.store, "delete_prefix", broken_delete)
    with pytest.raises(CommitConflict, match="nothing of this run was published"):
        b.publish(stage(tmp_path)[0], SID)
    assert len(versions(a)) == 2  # the upload stays (for gc)


def test_a_rejection_that_cannot_be_deleted_does_not_fail_the_publish(lake: ObjectLake, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lake.record_rejection(SID, {"why": "x"})

    def broken_delete(key: str) -> None:
        raise StorageError("no delete permission")

    monkeypatch.setattr(lake.store, "delete", broken_delete)
    where = lake.publish(stage(tmp_path)[0], SID)
    assert where == lake.scene_location(SID)
    assert lake.rejected_record(SID) == {"why": "x"}


# -- staging and recovery ----------------------------------------------------------------------------------


def test_staging_is_a_private_folder_removed_afterwards(lake: ObjectLake, staging_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert staging_root() == staging_dir
    assert staging_dir.is_dir()
    with lake.staging(SID) as path:
        assert path.parent == staging_dir
        assert re.fullmatch(rf"{re.escape(SID)}\.{os.getpid()}\.[0-9a-f]{{8}}", path.name), path.name
        assert path.is_dir()
        (path / "x").write_bytes(b"1")
    assert not path.exists()
    with pytest.raises(RuntimeError), lake.staging(SID) as path:
        raise RuntimeError
    assert not path.exists()
    with pytest.raises(LakeError), lake.staging("../x"):
        pass
    monkeypatch.delenv("CUBELAKE_STAGING")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "t2" / "t3"))
    assert staging_root() == tmp_path / "t2" / "t3" / "cubelake-staging"
    assert staging_root().is_dir()


def _dead_pid_below_ours() -> int:
    return next(p for p in range(os.getpid() - 1, 1, -1) if not pid_alive(p))


def test_recover_removes_only_the_staging_folders_of_dead_processes(lake: ObjectLake, staging_dir: Path) -> None:
    dead = _dead_pid_below_ours()
    keep = [f"a.{os.getpid()}.abcd", f"b.{os.getppid()}.abcd", "c.notapid.abcd", "d", f"e.{dead}",
            f"f.{dead}.x.abcd"]
    gone = [f"g.{dead}.abcd", "h.999999999.abcd", f"my.scene.{dead}.abcd"]
    for name in keep + gone:
        (staging_dir / name).mkdir(parents=True)
        (staging_dir / name / "part").write_bytes(b"1")
    done = lake.recover()
    assert sorted(p.name for p in staging_dir.iterdir()) == sorted(keep)
    assert sorted(done) == sorted(f"removed unfinished local build {name}" for name in gone)
    assert lake.recover() == []


# -- garbage ----------------------------------------------------------------------------------------------


def test_orphan_versions_are_the_unreferenced_ones_at_least_grace_old(lake: ObjectLake, tmp_path: Path,
                                                                      frozen: dt.datetime) -> None:
    grace = dt.timedelta(hours=1)
    lake.publish(stage(tmp_path)[0], SID)
    live = lake.scene_version(SID)
    assert live is not None
    assert version_time(live) == frozen
    exactly = new_version(frozen - grace)
    older = new_version(frozen - grace - dt.timedelta(days=3))
    younger = new_version(frozen - grace + dt.timedelta(seconds=1))
    future = new_version(frozen + dt.timedelta(hours=2))
    for v in (exactly, older, younger, future, "garbage"):
        put_version(lake, v)
    put_version(lake, older, sid="other")  # a scene folder without a commit object: all of its versions
    assert sorted(lake.orphan_versions(grace)) == sorted([(SID, exactly), (SID, older), (SID, "garbage"),
                                                          ("other", older)])
    every = [(SID, v) for v in (exactly, older, younger, "garbage")] + [("other", older)]
    assert sorted(lake.orphan_versions(dt.timedelta(0))) == sorted(every)  # never the live one
    assert lake.orphan_versions(dt.timedelta(days=10)) == [(SID, "garbage")]


def test_gc_deletes_the_orphans_and_says_what_it_removed(lake: ObjectLake, tmp_path: Path, staging_dir: Path,
                                                        frozen: dt.datetime) -> None:
    lake.publish(stage(tmp_path)[0], SID)
    live = lake.scene_version(SID)
    old = new_version(frozen - dt.timedelta(hours=6))
    recent = new_version(frozen - dt.timedelta(hours=6) + dt.timedelta(seconds=1))
    put_version(lake, old, n=3)
    put_version(lake, recent, n=1)
    (staging_dir / f"x.{_dead_pid_below_ours()}.abcd").mkdir(parents=True)
    before = keys(lake, "")
    assert lake.gc(dry_run=True) == [f"would remove unreferenced version {SID}/{old}"]
    assert keys(lake, "") == before  # a dry run deletes nothing, not even local builds
    assert [p.name for p in staging_dir.iterdir()] == [f"x.{_dead_pid_below_ours()}.abcd"]
    assert lake.gc() == [f"removed unfinished local build x.{_dead_pid_below_ours()}.abcd",
                         f"removed unreferenced version {SID}/{old} (3 objects)"]
    assert sorted(versions(lake)) == sorted([live, recent])
    assert lake.gc(dt.timedelta(0), dry_run=True) == [f"would remove unreferenced version {SID}/{recent}"]
    assert lake.gc(dt.timedelta(0)) == [f"removed unreferenced version {SID}/{recent} (1 objects)"]
    assert versions(lake) == [live]
    assert lake.gc(dt.timedelta(0)) == []
    rec = lake.scene_record(SID)
    assert rec is not None
