"""The published index of an object-store lake: a base snapshot plus a cumulative change set, folded.

Against a real S3-protocol server (moto, started by the suite): the index a reader assembles from
base + change set answers exactly like a local index of the same items, concurrent writers merge,
deletions and replacements hold, folds rewrite the static STAC tree, gc keeps what the pointer
names, and damaged pointers or change sets are refused with what to do.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from shapely.geometry import box

from cubelake.catalog import CatalogIndex, LakeCatalog, Query, remote
from cubelake.catalog import changes as changes_mod
from cubelake.catalog.changes import (
    Change,
    ChangeSet,
    DamagedIndexError,
    FoldPolicy,
    IndexPointer,
    should_fold,
)
from cubelake.catalog.remote import POINTER, ObjectLakeCatalog
from cubelake.errors import CatalogError
from cubelake.object_lake import ObjectLake

from ..conftest import S3Server, no_traceback, run_cli
from .conftest import spectrometer_um, synth_item

QUERIES = [Query(), Query(bbox=(13.0, 52.0, 14.0, 53.0)), Query(wavelength_nm=(900.0, 1000.0)),
           Query(collections=["b"]), Query(datetime=("2022-07-01T00:00:00Z", "2022-07-31T00:00:00Z"))]


def _item(n: int, collection: str = "a", **kw: Any) -> dict[str, Any]:
    lon = 13.0 + (n % 10) * 0.05
    return synth_item(f"scene-{n:03d}", collection=collection, geometry=box(lon, 52.1, lon + 0.04, 52.2),
                      datetime=f"2022-07-{1 + n % 28:02d}T10:00:00Z",
                      bands_um=spectrometer_um(400 + 10 * (n % 7), 1000, 10), **kw)


@pytest.fixture
def lake_url(s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty object-store lake; the AWS_* variables point at the test server, caches are per test."""
    for k, v in {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                 "CUBELAKE_CACHE": str(tmp_path / "cache"), "CUBELAKE_STAGING": str(tmp_path / "staging")}.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{s3_bucket}/lake"
    ObjectLake(url, create=True)
    return url


def _commit_items(url: str, items: list[dict[str, Any]]) -> None:
    """Write items as committed scenes (their item.json), as ingest's commit does."""
    lake = ObjectLake(url)
    for it in items:
        lake.store.put(lake.item_key(it["id"]), json.dumps(it).encode())


def _publish(url: str, items: list[dict[str, Any]]) -> None:
    _commit_items(url, items)
    with LakeCatalog(url) as cat:
        for it in items:
            cat.publish(it["id"])


def _pointer(url: str) -> dict[str, Any]:
    return json.loads(ObjectLake(url).store.get_text(POINTER))


def _expected(items: list[dict[str, Any]], tmp_path: Path) -> list[list[str]]:
    """What a local index of ``items`` answers to each query (the reference)."""
    idx = CatalogIndex(tmp_path / f"ref-{len(items)}.sqlite")
    for it in items:
        idx.upsert(it, f"scenes/{it['id']}/item.json")
    out = [sorted(h.id for h in idx.search(q)) for q in QUERIES]
    idx.close()
    return out


def _answers(url: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """What a fresh reader (its own cache) answers to each query."""
    monkeypatch.setenv("CUBELAKE_CACHE", str(cache))
    with LakeCatalog(url) as cat:
        return [sorted(h.id for h in cat.search(q)) for q in QUERIES]


# -- pure ---------------------------------------------------------------------------------------
def test_change_set_round_trips_and_keeps_the_latest_change_per_item() -> None:
    cs = ChangeSet("catalog/index/00000001-a.sqlite")
    cs = cs.with_change("x", Change(2, _item(1) | {"id": "x"}, "scenes/x/item.json"))
    cs = cs.with_change("y", Change(3, None))
    cs = cs.with_change("x", Change(4, None))
    back = ChangeSet.decode(cs.encode())
    assert back.base == cs.base
    assert back.entries == {"x": Change(4, None, None), "y": Change(3, None, None)}
    assert back.encoded_bytes == len(cs.encode())


def test_a_hostile_change_set_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(changes_mod, "MAX_CHANGESET_BYTES", 1 << 20)
    with pytest.raises(DamagedIndexError, match="expands to more than"):
        ChangeSet.decode(gzip.compress(b" " * (2 << 20)))  # a gzip bomb, bounded
    with pytest.raises(DamagedIndexError, match="not gzip"):
        ChangeSet.decode(b"plain text")
    wrong_id = {"format": "cubelake-index-changes", "entries": [{"id": "a", "generation": 1, "item": {"id": "b"}}]}
    with pytest.raises(DamagedIndexError, match="no STAC item with that id"):
        ChangeSet.decode(gzip.compress(json.dumps(wrong_id).encode()))


def test_pointer_parsing_refuses_keys_outside_the_index() -> None:
    good = IndexPointer(3, "catalog/index/00000003-x.sqlite", 10, 5000, "catalog/index/changes/00000004-y.json.gz",
                        2, ("a",))
    assert IndexPointer.parse(json.loads(good.to_json("now"))) == good
    for key in ("scenes/a/item.json", "catalog/index/../../lake.json", 7):
        with pytest.raises(DamagedIndexError):
            IndexPointer.parse({"format": "cubelake-index", "generation": 1, "key": key})
    with pytest.raises(DamagedIndexError, match="neither"):
        IndexPointer.parse({"format": "cubelake-index", "generation": 1, "key": None})


def test_fold_policy() -> None:
    policy = FoldPolicy(always_below=1000, max_bytes=100, entries_range=(3, 3))
    big = IndexPointer(5, "catalog/index/5.sqlite", 99, 10_000, collections=("a",))
    three = ChangeSet(big.key, {str(i): Change(i, None) for i in range(3)}, 10)
    assert should_fold(policy, None, None, {"a"})  # no index yet
    assert should_fold(policy, IndexPointer(5, "catalog/index/5.sqlite", 1, 999, collections=("a",)), None, {"a"})
    assert not should_fold(policy, big, None, {"a"})
    assert should_fold(policy, big, None, {"new"})  # the root catalog must list a new collection
    assert should_fold(policy, big, three, set())
    assert should_fold(policy, big, ChangeSet(big.key, {}, 100), set())
    assert not should_fold(policy, big, ChangeSet(big.key, {"1": Change(1, None)}, 99), set())
    # folds every ~0.63·sqrt(items) changes, within its range
    assert [FoldPolicy().max_entries(n) for n in (0, 10_000, 100_000, 10_000_000)] == [32, 63, 199, 1000]


# -- on a real S3-protocol server ----------------------------------------------------------------------
def test_changes_over_a_base_answer_like_a_local_index(lake_url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBELAKE_INDEX_FOLD_BELOW", "0")  # every change goes to the change set
    items = [_item(n, "a" if n % 3 else "b") for n in range(12)]
    _publish(lake_url, items[:1])
    assert _pointer(lake_url)["changes"] is None  # the first item: a base snapshot
    _publish(lake_url, items[1:])
    ptr = _pointer(lake_url)
    # every item after the first of each collection went into one cumulative change set
    assert ptr["changes"]["entries"] == 10
    assert ptr["items"] == 2
    assert ptr["generation"] == 12
    assert sorted(ptr["collections"]) == ["a", "b"]
    assert _answers(lake_url, tmp_path / "reader", monkeypatch) == _expected(items, tmp_path)
    # a replacement and a deletion through the change set
    items[4] = _item(4, "a", properties={"platform": "enmap"}) | {"geometry": box(100, 0, 101, 1).__geo_interface__,
                                                                   "bbox": [100, 0, 101, 1]}
    _publish(lake_url, [items[4]])
    with LakeCatalog(lake_url) as cat:
        assert cat.unpublish(items[7]["id"])
        assert not cat.unpublish("no-such-scene")
    del items[7]
    assert _answers(lake_url, tmp_path / "reader2", monkeypatch) == _expected(items, tmp_path)
    assert _pointer(lake_url)["changes"]["entries"] == 10  # the latest change per item


def test_a_large_change_set_is_folded_into_a_new_base(lake_url: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "fold_policy", lambda: FoldPolicy(always_below=0, entries_range=(4, 4)))
    items = [_item(n) for n in range(9)]
    _publish(lake_url, items)
    ptr = _pointer(lake_url)
    # 1 base, 4 changes, fold (5 items), 3 changes
    assert (ptr["items"], ptr["changes"]["entries"]) == (6, 3)
    coll = json.loads(ObjectLake(lake_url).store.get_text("collections/a/collection.json"))
    assert len([ln for ln in coll["links"] if ln["rel"] == "item"]) == 6  # the tree as of the last fold
    assert coll["cubelake:index_generation"] == 6
    assert _answers(lake_url, tmp_path / "reader", monkeypatch) == _expected(items, tmp_path)
    # reindex folds everything; gc then keeps only what the pointer names
    with LakeCatalog(lake_url) as cat:
        assert cat.reindex().indexed == 9
        ptr = _pointer(lake_url)
        assert ptr["changes"] is None
        assert ptr["items"] == 9
        lines = cat.gc(grace=dt.timedelta(0))
    assert any("old index change set" in ln for ln in lines)
    assert any("old index snapshot" in ln for ln in lines)
    assert [o.key for o in ObjectLake(lake_url).store.list("catalog/index")] == [ptr["key"]]
    assert _answers(lake_url, tmp_path / "reader2", monkeypatch) == _expected(items, tmp_path)


def test_an_open_reader_keeps_its_view_until_refresh_and_the_cache_keeps_two_files(
        lake_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBELAKE_INDEX_FOLD_BELOW", "0")
    _publish(lake_url, [_item(n) for n in range(3)])
    reader = ObjectLakeCatalog(lake_url)
    assert len(reader.search(Query())) == 3
    _publish(lake_url, [_item(n) for n in range(3, 6)])
    assert len(reader.search(Query())) == 3  # the view it opened: a consistent generation
    folder = next((tmp_path / "cache" / "catalogs").iterdir())
    dead = subprocess.Popen(["true"])
    dead.wait()
    (folder / f".view.{dead.pid}.abc.sqlite").write_bytes(b"left by a killed reader")
    (folder / f".view.{os.getpid()}.def.sqlite").write_bytes(b"being built by a live one")
    reader.refresh()
    assert len(reader.search(Query())) == 6
    reader.close()
    assert not (folder / f".view.{dead.pid}.abc.sqlite").exists()
    (folder / f".view.{os.getpid()}.def.sqlite").unlink()  # never removed under a live builder
    cached = sorted(p.name for p in (tmp_path / "cache" / "catalogs").glob("*/*.sqlite"))
    ptr = _pointer(lake_url)
    view = Path(ptr["changes"]["key"]).name.removesuffix(".json.gz") + ".sqlite"
    assert cached == sorted([Path(ptr["key"]).name, view])  # the base and the current view, nothing older


def test_concurrent_writers_merge_their_changes(lake_url: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBELAKE_INDEX_FOLD_BELOW", "0")
    _publish(lake_url, [_item(0)])
    items = [_item(n) for n in range(1, 25)]
    _commit_items(lake_url, items)
    errors: list[BaseException] = []

    def writer(part: list[dict[str, Any]]) -> None:
        try:
            with ObjectLakeCatalog(lake_url) as cat:
                for it in part:
                    cat.publish(it["id"])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(items[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    ptr = _pointer(lake_url)
    assert ptr["generation"] == 25
    assert ptr["changes"]["entries"] == 24
    assert _answers(lake_url, tmp_path / "reader", monkeypatch) == _expected([_item(0), *items], tmp_path)


def test_damaged_change_set_is_refused_with_what_to_do(lake_url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBELAKE_INDEX_FOLD_BELOW", "0")
    _publish(lake_url, [_item(0), _item(1)])
    store = ObjectLake(lake_url).store
    key = _pointer(lake_url)["changes"]["key"]
    store.put(key, b"\x1f\x8b not really gzip")
    res = run_cli("catalog", "search", "--lake", lake_url, env={"CUBELAKE_CACHE": str(tmp_path / "fresh")})
    assert res.returncode == 1  # a catalog failure (exit 2 is kept for usage errors)
    err = " ".join(no_traceback(res).split())
    assert f"{lake_url}/{key}: damaged index change set" in err
    assert f"cubelake catalog reindex --lake {lake_url}" in err
    assert run_cli("catalog", "reindex", "--lake", lake_url).returncode == 0
    assert _answers(lake_url, tmp_path / "after", monkeypatch) == _expected([_item(0), _item(1)], tmp_path)
    monkeypatch.setenv("CUBELAKE_INDEX_FOLD_BELOW", "lots")
    with pytest.raises(CatalogError, match="not a number of bytes"):
        remote.fold_policy()


def test_the_fold_policy_defaults_and_its_edges() -> None:
    policy = FoldPolicy()
    assert (policy.always_below, policy.max_bytes, policy.entries_range) == (32 * 1024**2, 4 * 1024**2, (32, 1000))
    at = IndexPointer(5, "catalog/index/5.sqlite", 10_000, 32 * 1024**2, collections=("a",))
    assert not should_fold(policy, at, None, {"a"})  # a base of exactly 32 MiB is no longer always refolded
    below = IndexPointer(5, "catalog/index/5.sqlite", 10_000, 32 * 1024**2 - 1, collections=("a",))
    assert should_fold(policy, below, None, {"a"})
    n = policy.max_entries(10_000)
    for count, size, fold in ((n - 1, 4 * 1024**2 - 1, False), (n, 0, True), (n + 5, 0, True),
                              (0, 4 * 1024**2, True), (0, 4 * 1024**2 + 1, True)):
        cs = ChangeSet(at.key, {str(i): Change(i, None) for i in range(count)}, size)
        assert should_fold(policy, at, cs, set()) is fold, (count, size)


def test_a_change_set_lists_the_collections_of_its_items_not_of_its_deletions() -> None:
    cs = ChangeSet(None, {"x": Change(1, _item(1) | {"id": "x", "collection": "c1"}), "y": Change(2, None),
                          "z": Change(3, _item(2) | {"id": "z", "collection": "c2"})})
    assert cs.collections() == {"c1", "c2"}
    assert ChangeSet(None, {"y": Change(2, None)}).collections() == set()


@pytest.mark.parametrize("doc", [
    {"format": "something-else", "entries": []}, ["format", "entries"], {"format": "cubelake-index-changes"},
    {"format": "cubelake-index-changes", "entries": {"id": "a"}},
    {"format": "cubelake-index-changes", "entries": [{"id": "a", "generation": 1, "item": {"id": "b", "collection": "c"}}]},
    {"format": "cubelake-index-changes", "entries": [{"id": "b", "generation": 1, "item": {"id": "a", "collection": "c"}}]},
    {"format": "cubelake-index-changes", "entries": [{"id": "a", "generation": 1, "item": {"id": "a"}}]},
    {"format": "cubelake-index-changes", "entries": [{"id": "a", "generation": 1, "item": {"id": "a", "collection": 3}}]},
    {"format": "cubelake-index-changes", "entries": [{"id": "a", "generation": "1", "item": None}]},
    {"format": "cubelake-index-changes", "entries": [{"id": "a", "generation": 1, "item": None, "href": 5}]},
])
def test_anything_but_a_change_set_is_refused(doc: Any) -> None:
    with pytest.raises(DamagedIndexError):
        ChangeSet.decode(gzip.compress(json.dumps(doc).encode()))


def test_a_change_set_bomb_is_stopped_at_256_mib() -> None:
    with pytest.raises(DamagedIndexError, match=f"expands to more than {256 * 1024**2} bytes"):
        ChangeSet.decode(gzip.compress(b" " * (256 * 1024**2 + 1), compresslevel=1))


def test_a_minimal_pointer_takes_zero_for_what_it_leaves_out_and_is_immutable() -> None:
    import dataclasses

    p = IndexPointer.parse({"format": "cubelake-index", "generation": 2, "key": "catalog/index/2.sqlite"})
    assert p == IndexPointer(2, "catalog/index/2.sqlite", 0, 0, None, 0, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.items = 5  # type: ignore[misc]
    assert {p: 1}[p] == 1  # hashable: a snapshot's pointer can key a cache
    with pytest.raises(DamagedIndexError, match="not a number"):
        IndexPointer.parse({"format": "cubelake-index", "generation": "two", "key": "catalog/index/2.sqlite"})
