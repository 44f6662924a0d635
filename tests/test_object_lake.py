"""Lakes on an S3-protocol server (moto on 127.0.0.1): the same scenes, catalog and samples as on disk."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cubelake.catalog import LakeCatalog
from cubelake.catalog.query import Query
from cubelake.ingest import IngestOptions, Outcome, ingest
from cubelake.lake import Lake, open_lake
from cubelake.object_lake import VERSION_KEY, ObjectLake
from cubelake.record import SceneRecord
from cubelake.storage import CommitConflict, open_store

from .conftest import REAL, S3Server, cli_process, no_traceback, run_cli

SCENES = [REAL / "hsi_enmap_potsdam", REAL / "hsi_jasper_ridge", REAL / "hsi_samson", REAL / "landsat8_rio_toa"]
PRODUCTS = ("cog", "zarr", "refs")


def s3_env(server: S3Server, cache: Path) -> dict[str, str]:
    """The user's variables for the test server (:meth:`S3Server.env`), with ``cache`` as cubelake's cache."""
    return {**os.environ, **server.env(cache.parent), "CUBELAKE_CACHE": str(cache)}


@pytest.fixture(autouse=True)
def _aws_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """URLs given without options reach the test server the way a user's would: through AWS_* variables."""
    for k, v in s3_env(s3_server, tmp_path / "cache").items():
        if k.startswith(("AWS_", "CUBELAKE_")):
            monkeypatch.setenv(k, v)


@dataclass
class Lakes:
    local: Lake
    remote: ObjectLake
    url: str
    bucket: str
    server: S3Server


@pytest.fixture(scope="module")
def lakes(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Lakes:
    bucket = f"lakes-{uuid.uuid4().hex[:8]}"
    s3_server.client().create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/team/lake"
    local = Lake(tmp_path_factory.mktemp("local") / "lake")
    remote = ObjectLake(url, options=s3_server.options)
    opts = IngestOptions(products=PRODUCTS)
    for lake in (local, remote):
        results = ingest(SCENES, lake, opts)
        assert all(r.outcome is Outcome.INGESTED for r in results), [r.message for r in results]
    return Lakes(local, remote, url, bucket, s3_server)


def test_every_scene_is_published_once_with_its_products(lakes: Lakes) -> None:
    assert lakes.remote.scene_ids() == lakes.local.scene_ids()
    assert len(lakes.local.scene_ids()) >= 7
    for sid in lakes.local.scene_ids():
        here, there = lakes.local.scene_record(sid), lakes.remote.scene_record(sid)
        assert there is not None
        assert here is not None
        assert there.content_hash == here.content_hash
        assert {k: v.blake3 or v.tree_blake3 for k, v in there.products.items() if k != "refs"} == \
            {k: v.blake3 or v.tree_blake3 for k, v in here.products.items() if k != "refs"}
        item = json.loads(lakes.remote.store.get_text(f"scenes/{sid}/item.json"))
        version = item["properties"][VERSION_KEY]
        for asset in item["assets"].values():
            if asset["href"].startswith("./"):
                assert asset["href"].startswith(f"./v/{version}/")
                assert lakes.remote.store.exists(f"scenes/{sid}/{asset['href'][2:]}") or \
                    any(True for _ in lakes.remote.store.list(f"scenes/{sid}/{asset['href'][2:]}"))


def test_products_read_back_with_independent_clients(lakes: Lakes) -> None:
    """zarr-python over obstore, xarray over s3fs, GDAL /vsis3/: the values of the local lake's products."""
    import rasterio
    import xarray as xr
    import zarr
    from obstore.store import S3Store
    from rasterio.session import AWSSession

    ep = lakes.server.endpoint
    session = AWSSession(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1",
                         endpoint_url=ep.split("://")[1])
    for sid in lakes.local.scene_ids():
        loc = lakes.remote.scene_location(sid)
        assert loc is not None
        key = loc.split(f"s3://{lakes.bucket}/", 1)[1]
        local_zarr = zarr.open_group(str(lakes.local.scene_dir(sid) / f"{sid}.zarr"), mode="r")["data"][:]
        s3 = S3Store(lakes.bucket, prefix=f"{key}/{sid}.zarr", endpoint=ep, access_key_id="testing",
                     secret_access_key="testing", region="us-east-1", client_options={"allow_http": True})
        remote_zarr = zarr.open_group(zarr.storage.ObjectStore(s3, read_only=True), mode="r")["data"][:]
        np.testing.assert_array_equal(remote_zarr, local_zarr)
        ds = xr.open_zarr(f"{loc}/{sid}.zarr", storage_options={"endpoint_url": ep, "key": "testing",
                                                                "secret": "testing"})
        np.testing.assert_array_equal(ds["data"].values, xr.open_zarr(lakes.local.scene_dir(sid) / f"{sid}.zarr")
                                      ["data"].values)
        with rasterio.Env(session=session, AWS_HTTPS="NO", AWS_VIRTUAL_HOSTING="FALSE",
                          GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR"), \
                rasterio.open(f"/vsis3/{lakes.bucket}/{key}/{sid}.tif") as remote_cog, \
                rasterio.open(lakes.local.scene_dir(sid) / f"{sid}.tif") as local_cog:
            np.testing.assert_array_equal(remote_cog.read(), local_cog.read())
            assert remote_cog.crs == local_cog.crs
            assert remote_cog.transform == local_cog.transform


def test_refs_on_the_object_store_point_inside_it(lakes: Lakes) -> None:
    from cubelake.refs import open_array

    for sid in lakes.local.scene_ids():
        rec = lakes.remote.scene_record(sid)
        assert rec is not None
        refs_url = f"{lakes.remote.scene_location(sid)}/{rec.products['refs'].path}"
        arr = open_array(refs_url, storage_options=lakes.server.options)
        local = zarr_data(lakes.local.scene_dir(sid) / f"{sid}.zarr")
        np.testing.assert_array_equal(np.asarray(arr[:]).astype(local.dtype), local)


def zarr_data(path: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_group(str(path), mode="r")["data"][:])


@pytest.mark.parametrize("query", [
    Query(),
    Query(bbox="12.9,52.3,13.2,52.5"),
    Query(datetime="2022-06/2022-08"),
    Query(wavelength_nm="450:1300"),
    Query(bbox="12.9,52.3,13.2,52.5", datetime="2022-06/2022-08", wavelength_nm="450:1300"),
])
def test_catalog_search_equals_the_local_lake(lakes: Lakes, query: Query) -> None:
    with LakeCatalog(lakes.local) as here, LakeCatalog(lakes.url) as there:
        assert type(there).__name__ == "ObjectLakeCatalog"
        assert [h.id for h in there.search(query)] == [h.id for h in here.search(query)]
        assert there.stats()["items"] == here.stats()["items"] == len(lakes.local.scene_ids())


def test_catalog_of_the_object_lake_validates_against_stac(lakes: Lakes) -> None:
    with LakeCatalog(lakes.url) as cat:
        report = cat.validate([REAL.parent.parent / "schemas"] if (REAL.parent.parent / "schemas").is_dir() else [])
    assert report.checked >= len(lakes.local.scene_ids()) + 2
    assert report.ok, report.invalid


def test_search_downloads_the_index_once_then_only_when_it_changed(lakes: Lakes, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBELAKE_CACHE", str(tmp_path / "cache"))
    with LakeCatalog(lakes.url) as cat:
        cat.search(Query())
    cached = sorted((tmp_path / "cache").rglob("*.sqlite"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    with LakeCatalog(lakes.url) as cat:
        cat.search(Query())
    assert sorted((tmp_path / "cache").rglob("*.sqlite")) == cached
    assert cached[0].stat().st_mtime_ns == mtime


def test_loader_epochs_over_the_object_lake_equal_local(lakes: Lakes) -> None:
    from cubelake.loaders import CubeDataset, PlanSpec, Sampling

    def epoch(lake: str, prefer: tuple[str, ...]) -> list[tuple[str, float]]:
        with LakeCatalog(lake) as cat:
            hits = cat.search(Query(bbox="12.9,52.3,13.2,52.5", collections="enmap-l2a"))
        assert len(hits) == 4
        ds = CubeDataset(hits, lake=lake, prefer=prefer, storage_options=lakes.server.options,
                         sampling=Sampling(size=16, stride=16, labels="none"), plan=PlanSpec(batch_size=8, seed=3))
        out = []
        for batch in ds:
            out.append((",".join(batch["scene"]), float(batch["image"].double().sum())))
        return out

    for prefer in (("zarr",), ("refs",)):  # these tiles are 32 px: too small for the loader's COG path
        there, here = epoch(lakes.url, prefer), epoch(str(lakes.local.root), prefer)
        assert there == here
        assert len(there) > 0


def test_reingest_is_unchanged_and_commits_nothing(lakes: Lakes) -> None:
    before = {o.key for o in lakes.remote.store.list("scenes")}
    results = ingest(SCENES[1:2], lakes.remote, IngestOptions(products=PRODUCTS))
    assert [r.outcome for r in results] == [Outcome.UNCHANGED]
    assert {o.key for o in lakes.remote.store.list("scenes")} == before


# -- the commit protocol -------------------------------------------------------------------


def test_two_writers_of_one_scene_exactly_one_commit_wins(s3_server: S3Server, s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/race"
    ingest([REAL / "hsi_jasper_ridge"], ObjectLake(url, options=s3_server.options), IngestOptions(products=("zarr",)))
    a, b = ObjectLake(url, options=s3_server.options), ObjectLake(url, options=s3_server.options)
    sid = a.scene_ids()[0]
    version = a.scene_version(sid)
    a.scene_record(sid)
    b.scene_record(sid)  # both read the same commit object, then both build
    folder = _staged_copy(a, sid)
    new_a = a.publish(folder, sid)
    with pytest.raises(CommitConflict, match="published by another ingest while this one was building"):
        b.publish(folder, sid)
    winner = a.scene_version(sid)
    assert winner != version
    assert new_a.endswith(str(winner))
    versions, _ = a.store.list_dirs(f"scenes/{sid}/v")
    assert set(versions) == {version, winner}  # the loser's upload is gone; the replaced version waits for gc
    n = n_objects(a, sid, str(version))
    assert f"removed unreferenced version {sid}/{version} ({n} objects)" in a.gc(dt_zero())
    versions, _ = a.store.list_dirs(f"scenes/{sid}/v")
    assert versions == [winner]


def dt_zero() -> Any:
    import datetime as dt

    return dt.timedelta(0)


def n_objects(lake: ObjectLake, sid: str, version: str) -> int:
    return sum(1 for _ in lake.store.list(f"scenes/{sid}/v/{version}"))


def _staged_copy(lake: ObjectLake, sid: str) -> Path:
    import tempfile

    from cubelake.copy import _fetch

    folder = Path(tempfile.mkdtemp(prefix="staged-"))
    _fetch(lake, sid, folder)
    return folder


def test_conditional_puts_on_the_commit_object(s3_server: S3Server, s3_bucket: str) -> None:
    store = open_store(f"s3://{s3_bucket}/x", s3_server.options)
    first = store.put("scenes/a/item.json", b"{}", create=True)
    with pytest.raises(CommitConflict):
        store.put("scenes/a/item.json", b"{}", create=True)
    store.put("scenes/a/item.json", b'{"v": 2}', if_match=first.etag)
    with pytest.raises(CommitConflict):
        store.put("scenes/a/item.json", b'{"v": 3}', if_match=first.etag)
    assert store.get("scenes/a/item.json") == b'{"v": 2}'


# -- crashes and concurrency, through the real CLI ------------------------------------------------

KILL_SCENES = [REAL / "hsi_jasper_ridge", REAL / "hsi_samson", REAL / "hsi_enmap_potsdam"]


def _ingest_args(url: str, *paths: Path, force: bool = False) -> list[str]:
    return ["ingest", "--lake", url, "--products", "cog,zarr,refs", *(["--force"] if force else []), *map(str, paths)]


def _check_consistent(url: str, server: S3Server, expected: int) -> None:
    lake = ObjectLake(url, options=server.options)
    ids = lake.scene_ids()
    assert len(ids) == expected
    with LakeCatalog(lake) as cat:
        hits = cat.search(Query())
        assert sorted(h.id for h in hits) == ids  # every scene indexed, once
        for h in hits:
            item, _ = lake.committed(h.id)
            assert item is not None
            assert h.properties[VERSION_KEY] == item["properties"][VERSION_KEY]
    for sid in ids:
        rec = lake.scene_record(sid)
        assert rec is not None
        np.asarray(_open_zarr(lake, sid, rec, server))
    assert not list(lake.store.list("catalog/pending"))


def _open_zarr(lake: ObjectLake, sid: str, rec: SceneRecord, server: S3Server) -> Any:
    import zarr

    store = open_store(f"{lake.scene_location(sid)}/{rec.products['zarr'].path}", server.options)
    return zarr.open_group(store.zarr_store(), mode="r")["data"][:]


@pytest.mark.timeout(400)  # 20 ingests killed at random moments: ~100 s alone, up to twice that beside other tests
def test_kill_9_at_20_random_moments_then_rerun(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/killed"
    # CUBELAKE_INDEX_FOLD_BELOW=0: the index takes the path of a large lake (change sets over a base snapshot)
    env = s3_env(s3_server, tmp_path / "cache") | {"CUBELAKE_STAGING": str(tmp_path / "staging"),
                                                   "CUBELAKE_INDEX_FOLD_BELOW": "0"}
    t0 = time.monotonic()
    first = run_cli(*_ingest_args(url, *KILL_SCENES), env=env)
    full = time.monotonic() - t0
    assert first.returncode == 0, first.stderr
    rng = random.Random(12)
    for _ in range(20):
        proc = cli_process(*_ingest_args(url, *KILL_SCENES, force=True), env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, full))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    rerun = run_cli(*_ingest_args(url, *KILL_SCENES), env=env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    no_traceback(rerun)
    _check_consistent(url, s3_server, expected=7)
    gc = run_cli("lake", "gc", "--lake", url, "--grace", "0", env=env)
    assert gc.returncode == 0, gc.stderr
    lake = ObjectLake(url, options=s3_server.options)
    for sid in lake.scene_ids():  # no orphans: the only version left is the committed one
        versions, _ = lake.store.list_dirs(f"scenes/{sid}/v")
        assert versions == [lake.scene_version(sid)]
    ptr = json.loads(lake.store.get_text("catalog/index.json"))
    live = [ptr["key"]] + ([ptr["changes"]["key"]] if ptr["changes"] else [])
    assert sorted(o.key for o in lake.store.list("catalog/index")) == sorted(live)
    assert list((tmp_path / "staging" / "cubelake-staging").iterdir()) == []  # no local build left behind
    _check_consistent(url, s3_server, expected=7)


def test_four_concurrent_ingests_merge_into_one_index(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/shared"
    env = s3_env(s3_server, tmp_path / "cache") | {"CUBELAKE_INDEX_FOLD_BELOW": "0"}  # change sets, as a large lake
    groups = [[REAL / "hsi_enmap_potsdam"], [REAL / "hsi_jasper_ridge"], [REAL / "hsi_samson"],
              [REAL / "landsat8_rio_toa"]]
    procs = [cli_process(*_ingest_args(url, *g), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for g in groups]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    ingested = sum(int(re.search(r"(\d+) ingested", out).group(1)) for out, _ in outs)  # type: ignore[union-attr]
    assert ingested >= 8
    _check_consistent(url, s3_server, expected=ingested)
    lake = ObjectLake(url, options=s3_server.options)
    ptr = json.loads(lake.store.get_text("catalog/index.json"))
    assert ptr["items"] + (ptr["changes"]["entries"] if ptr["changes"] else 0) == ingested
    assert ptr["generation"] >= ingested  # one generation per scene: none overwrote another


# -- errors ---------------------------------------------------------------------------------


def _assert_usage_error(res: subprocess.CompletedProcess[str], url: str, *needles: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    text = no_traceback(res)
    flat = " ".join(text.replace("│", " ").split())
    assert url in flat
    for n in needles:
        assert n in flat, flat


def test_missing_bucket_unreachable_endpoint_and_not_a_lake(s3_server: S3Server, s3_bucket: str,
                                                            tmp_path: Path) -> None:
    env = s3_env(s3_server, tmp_path / "cache")
    res = run_cli("catalog", "search", "--lake", "s3://no-such-bucket-x/lake", env=env)
    _assert_usage_error(res, "s3://no-such-bucket-x/lake", "the bucket does not exist")
    res = run_cli("ingest", "--lake", "s3://no-such-bucket-x/lake", str(REAL / "hsi_samson"), env=env)
    _assert_usage_error(res, "s3://no-such-bucket-x/lake", "the bucket does not exist")
    res = run_cli("lake", "--lake", f"s3://{s3_bucket}/lake", env=env | {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    _assert_usage_error(res, f"s3://{s3_bucket}/lake", "endpoint cannot be reached", "AWS_ENDPOINT_URL")
    res = run_cli("catalog", "search", "--lake", f"s3://{s3_bucket}/nothing", env=env)
    _assert_usage_error(res, f"s3://{s3_bucket}/nothing", "no cubelake lake here")
    store = open_store(f"s3://{s3_bucket}/foreign", s3_server.options)
    store.put("data/x.bin", b"someone else's")
    res = run_cli("ingest", "--lake", f"s3://{s3_bucket}/foreign", str(REAL / "hsi_samson"), env=env)
    _assert_usage_error(res, f"s3://{s3_bucket}/foreign", "holds objects and is not a cubelake lake")
    assert [o.key for o in store.list()] == ["data/x.bin"]  # nothing written


# -- copy and gc --------------------------------------------------------------------------------


def test_copy_local_to_s3_and_back_verified(lakes: Lakes, s3_bucket: str, tmp_path: Path) -> None:
    env = s3_env(lakes.server, tmp_path / "cache")
    dst = f"s3://{s3_bucket}/published"
    res = run_cli("lake", "copy", str(lakes.local.root), dst, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(lakes.local.scene_ids())} copied" in res.stdout
    again = run_cli("lake", "copy", str(lakes.local.root), dst, env=env)  # resumes: nothing left to do
    assert f"0 copied (0 bytes), {len(lakes.local.scene_ids())} unchanged" in again.stdout
    back = tmp_path / "offline"
    sub = run_cli("lake", "copy", dst, str(back), "--bbox", "12.9,52.3,13.2,52.5", env=env)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    pulled = Lake(back, create=False)
    assert pulled.scene_ids() == sorted(s for s in lakes.local.scene_ids() if s.startswith("enmap"))
    for sid in pulled.scene_ids():
        np.testing.assert_array_equal(zarr_data(pulled.scene_dir(sid) / f"{sid}.zarr"),
                                      zarr_data(lakes.local.scene_dir(sid) / f"{sid}.zarr"))
    with LakeCatalog(pulled) as cat:
        assert sorted(h.id for h in cat.search(Query())) == pulled.scene_ids()


def test_copy_refuses_a_damaged_source(lakes: Lakes, tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "src"
    shutil.copytree(lakes.local.root, src)
    sid = lakes.local.scene_ids()[0]
    cog = src / "scenes" / sid / f"{sid}.tif"
    data = bytearray(cog.read_bytes())
    data[-100] ^= 0xFF
    cog.write_bytes(bytes(data))
    res = run_cli("lake", "copy", str(src), str(tmp_path / "dst"))
    assert res.returncode == 1
    assert f"{sid}: product cog differs from its recorded BLAKE3" in " ".join(res.stderr.split())
    assert sid not in open_lake(tmp_path / "dst").scene_ids()


def test_copy_between_two_object_lakes_and_gc_keeps_published(lakes: Lakes, tmp_path: Path) -> None:
    import datetime as dt

    lakes.server.client().create_bucket(Bucket="other-team")
    dst = "s3://other-team/mirror"
    res = run_cli("lake", "copy", lakes.url, dst, "--scene", "jasperRidge2_R198", "--scene", "samson_1",
                  env=s3_env(lakes.server, tmp_path / "cache"))
    assert res.returncode == 0, res.stdout + res.stderr
    mirror = ObjectLake(dst, options=lakes.server.options)
    assert mirror.scene_ids() == ["jasperRidge2_R198", "samson_1"]
    for sid in mirror.scene_ids():
        rec = mirror.scene_record(sid)
        assert rec is not None
        np.testing.assert_array_equal(np.asarray(_open_zarr(mirror, sid, rec, lakes.server)),
                                      zarr_data(lakes.local.scene_dir(sid) / f"{sid}.zarr"))
    assert not [line for line in mirror.gc(dt.timedelta(0)) if "unreferenced" in line]
    assert all(mirror.scene_location(s) for s in mirror.scene_ids())  # gc never removes a published version


def test_cli_show_reindex_and_refs_check_on_the_object_lake(lakes: Lakes, tmp_path: Path) -> None:
    env = s3_env(lakes.server, tmp_path / "cache")
    show = run_cli("catalog", "show", "samson_1", "--lake", lakes.url, env=env)
    assert show.returncode == 0, show.stderr
    item = json.loads(show.stdout)
    assert item["id"] == "samson_1"
    assert item["properties"][VERSION_KEY] == lakes.remote.scene_version("samson_1")
    before = json.loads(lakes.remote.store.get_text("catalog/index.json"))
    reindex = run_cli("catalog", "reindex", "--lake", lakes.url, env=env)
    assert reindex.returncode == 0, reindex.stderr
    assert f"indexed {len(lakes.local.scene_ids())} item(s)" in reindex.stdout
    after = json.loads(lakes.remote.store.get_text("catalog/index.json"))
    assert after["generation"] == before["generation"] + 1
    assert after["items"] == before["items"]
    rec = lakes.remote.scene_record("samson_1")
    assert rec is not None
    refs = f"{lakes.remote.scene_location('samson_1')}/{rec.products['refs'].path}"
    check = run_cli("refs", "check", refs, "--lake", lakes.url, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith(f"ok: {refs}")


# -- sources on an object store -------------------------------------------------------------------


def test_geotiff_sources_on_s3_ingest_like_local_files(lakes: Lakes, s3_bucket: str, tmp_path: Path) -> None:
    """``cubelake ingest s3://…/`` reads GeoTIFFs by range requests; formats it cannot read there are refused by name."""
    client = lakes.server.client()
    tiles = sorted((REAL / "hsi_enmap_potsdam").glob("enmap_potsdam_tile_*.tif"))
    for f in tiles:
        client.upload_file(str(f), s3_bucket, f"archive/{f.name}")
    client.upload_file(str(REAL / "bad_inputs" / "rasterio" / "corrupt.tif"), s3_bucket, "archive/corrupt.tif")
    client.upload_file(str(REAL / "hsi_samson" / "samson_1.mat"), s3_bucket, "archive/samson_1.mat")
    client.put_object(Bucket=s3_bucket, Key="archive/notes.txt", Body=b"sidecar text")
    client.put_object(Bucket=s3_bucket, Key="archive/cube.nc", Body=b"\x89HDF\r\n\x1a\n" + b"\0" * 4088)
    client.put_object(Bucket=s3_bucket, Key="archive/scene.jp2", Body=b"\0\0\0\x0cjP  \r\n\x87\n" + b"\0" * 64)
    env = s3_env(lakes.server, tmp_path / "cache")  # staging in tmp_path / "staging"
    lake = tmp_path / "from-s3"
    res = run_cli("ingest", "--lake", str(lake), "--products", "cog,zarr,refs", f"s3://{s3_bucket}/archive/", env=env)
    out = " ".join(no_traceback(res).split())
    assert res.returncode == 1, out  # the corrupt TIFF, the damaged NetCDF and the JPEG 2000 are reported
    assert "5 ingested" in out  # the tiles and the MAT
    assert f"s3://{s3_bucket}/archive/cube.nc: not a readable HDF5 file" in out  # read in place, found damaged
    assert f"s3://{s3_bucket}/archive/scene.jp2: this format is not read from object stores" in out
    assert "corrupt.tif" in out
    assert "notes.txt" not in out  # a sidecar in a listed prefix is skipped, as in a local folder
    got = Lake(lake, create=False)
    assert got.scene_ids() == sorted([f.stem for f in tiles] + ["samson_1"])
    mat = got.scene_record("samson_1")
    assert mat is not None
    assert mat.source.path == f"s3://{s3_bucket}/archive/samson_1.mat"
    assert [f.path for f in mat.source.files] == [mat.source.path]
    np.testing.assert_array_equal(zarr_data(got.scene_dir("samson_1") / "samson_1.zarr"),
                                  zarr_data(lakes.local.scene_dir("samson_1") / "samson_1.zarr"))
    assert list((tmp_path / "staging" / "cubelake-staging").iterdir()) == []  # the fetched MAT file is gone
    for f in tiles:
        rec = got.scene_record(f.stem)
        assert rec is not None
        assert rec.source.path == f"s3://{s3_bucket}/archive/{f.name}"
        assert rec.source.files[0].model_dump()["etag"]
        np.testing.assert_array_equal(zarr_data(got.scene_dir(f.stem) / f"{f.stem}.zarr"),
                                      zarr_data(lakes.local.scene_dir(f.stem) / f"{f.stem}.zarr"))
    again = run_cli("ingest", "--lake", str(lake), f"s3://{s3_bucket}/archive/{tiles[0].name}", env=env)
    assert again.returncode == 0
    assert "unchanged" in again.stdout
    client.upload_file(str(tiles[1]), s3_bucket, f"archive/{tiles[0].name}")  # new content under the same key
    changed = run_cli("ingest", "--lake", str(lake), f"s3://{s3_bucket}/archive/{tiles[0].name}", env=env)
    assert changed.returncode == 0
    assert "ingested" in changed.stdout
    missing = run_cli("ingest", "--lake", str(lake), f"s3://{s3_bucket}/nothing/here.tif", env=env)
    assert missing.returncode == 1
    assert f"s3://{s3_bucket}/nothing/here.tif: no such object" in " ".join(missing.stdout.split())


def test_s3_source_into_s3_lake(lakes: Lakes, s3_bucket: str, tmp_path: Path) -> None:
    client = lakes.server.client()
    tile = REAL / "hsi_enmap_potsdam" / "enmap_potsdam_tile_96_0.tif"
    client.upload_file(str(tile), s3_bucket, "in/tile.tif")
    url = f"s3://{s3_bucket}/lake"
    res = run_cli("ingest", "--lake", url, f"s3://{s3_bucket}/in/tile.tif", env=s3_env(lakes.server, tmp_path / "c"))
    assert res.returncode == 0, res.stdout + res.stderr
    lake = ObjectLake(url, options=lakes.server.options)
    rec = lake.scene_record("tile")
    assert rec is not None
    np.testing.assert_array_equal(np.asarray(_open_zarr(lake, "tile", rec, lakes.server)),
                                  zarr_data(lakes.local.scene_dir(tile.stem) / f"{tile.stem}.zarr"))


def test_hostile_object_keys_in_a_source_prefix_are_reported_not_fatal(lakes: Lakes, s3_bucket: str,
                                                                        tmp_path: Path) -> None:
    client = lakes.server.client()
    tile = REAL / "hsi_enmap_potsdam" / "enmap_potsdam_tile_96_0.tif"
    client.upload_file(str(tile), s3_bucket, "src/good.tif")
    client.put_object(Bucket=s3_bucket, Key="src/sub/../escape.tif", Body=b"II*\x00")
    client.put_object(Bucket=s3_bucket, Key="src/bad\x07name.tif", Body=b"II*\x00")
    res = run_cli("ingest", "--lake", str(tmp_path / "lake"), f"s3://{s3_bucket}/src/",
                  f"s3://{s3_bucket}/src/good.tif", env=s3_env(lakes.server, tmp_path / "cache"))
    out = no_traceback(res)
    # object_store refuses a listing holding a key it cannot parse: the prefix is reported, not followed;
    # the object named on its own is still ingested
    assert res.returncode == 1, out
    assert "1 ingested" in out
    assert "rename that object, or name the scenes below this prefix one by one" in " ".join(out.split())
    assert "\x07" not in out  # control characters are escaped in what is printed
    assert Lake(tmp_path / "lake", create=False).scene_ids() == ["good"]


# -- ENVI and Landsat sources on the object store ----------------------------------------------

AVIRIS = REAL / "hsi_aviris_ng_isofit" / "small_chunk" / "ang20170323t202244_rdn_7000-7010"
AVIRIS_HDR = AVIRIS.with_name(AVIRIS.name + ".hdr")
LANDSAT5 = sorted((REAL / "landsat5_tm_rstoolbox").iterdir())  # the MTL and its 7 band GeoTIFFs
L8_MTL = REAL / "landsat8_rio_toa" / "LC81390452014295LGN00_MTL.json"
L8_BAND = REAL / "landsat8_rio_toa" / "tiny_LC81390452014295LGN00_B5.TIF"  # renamed: found by its name's end


def _upload(server: S3Server, bucket: str, prefix: str, files: list[Path]) -> None:
    client = server.client()
    for f in files:
        client.upload_file(str(f), bucket, f"{prefix}/{f.name}")


def _results(res: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    """``--format json`` results of an ingest run, by source."""
    no_traceback(res)
    return {r["path"]: r for r in json.loads(res.stdout)["results"]}


def test_file_helpers_answer_for_objects_as_for_files(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    """The readers' file access (size, bounded read, existence, a folder's files) over /vsis3/ names and paths."""
    from cubelake.errors import SceneReadError
    from cubelake.ingest.sources import discover
    from cubelake.ingest.sources._base import (
        display_name,
        file_size,
        folder_files,
        is_regular_file,
        read_bounded,
    )
    from cubelake.storage import gdal_vsi_path, url_of_gdal_path

    header = b"ENVI\nsamples = 2\n"
    files = {"h/a.hdr": header, "h/big.txt": b"x" * 2048, "h/sub/deeper.hdr": header}
    client = s3_server.client()
    for key, body in files.items():
        client.put_object(Bucket=s3_bucket, Key=key, Body=body)
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_bytes(body)
    url = f"s3://{s3_bucket}/h/a.hdr"
    assert gdal_vsi_path(url) == f"/vsis3/{s3_bucket}/h/a.hdr"
    assert url_of_gdal_path(gdal_vsi_path(url)) == url
    assert url_of_gdal_path(tmp_path / "h" / "a.hdr") is None
    for folder in (Path(f"/vsis3/{s3_bucket}/h"), tmp_path / "h"):
        where = display_name(folder)
        assert where == (f"s3://{s3_bucket}/h" if str(folder).startswith("/vsis3/") else str(folder))
        assert is_regular_file(folder / "a.hdr")
        assert not is_regular_file(folder / "missing.hdr")
        assert not is_regular_file(folder / "sub")  # a prefix or folder is no file
        assert file_size(folder / "big.txt") == 2048
        with pytest.raises(FileNotFoundError):
            file_size(folder / "missing.hdr")
        assert read_bounded(folder / "a.hdr", 1024, "an ENVI header") == header
        with pytest.raises(SceneReadError, match=re.escape(f"{where}/big.txt: 2048 bytes is far larger than a "
                                                           "Landsat MTL (at most 1024)")):
            read_bounded(folder / "big.txt", 1024, "a Landsat MTL")
        assert sorted(p.name for p in folder_files(folder)) == ["a.hdr", "big.txt"]  # not what is below sub/
    # a header named on its own whose data object is missing is still an ENVI scene (reported when opened)
    [lonely] = discover([url])
    assert (lonely.kind, lonely.url, lonely.data) == ("envi", url, None)


def test_a_prefix_groups_envi_and_landsat_objects_into_scenes(s3_server: S3Server, s3_bucket: str) -> None:
    from cubelake.ingest.sources import SceneKind, discover

    _upload(s3_server, s3_bucket, "sets", [AVIRIS, AVIRIS_HDR, *LANDSAT5, L8_MTL, L8_BAND])
    s3_server.client().put_object(Bucket=s3_bucket, Key="sets/cube.nc", Body=b"\x89HDF\r\n\x1a\n")
    s3_server.client().put_object(Bucket=s3_bucket, Key="sets/scene.jp2", Body=b"\0\0\0\x0cjP  \r\n\x87\n")
    base = f"s3://{s3_bucket}/sets"
    scenes = discover([f"{base}/"])
    # one scene per header and per MTL: the data object and the band objects are theirs, not scenes
    assert [(s.kind, s.url) for s in scenes] == [  # in key order
        (SceneKind.LANDSAT, f"{base}/{L8_MTL.name}"),
        (SceneKind.LANDSAT, f"{base}/{LANDSAT5[-1].name}"),
        (SceneKind.ENVI, f"{base}/{AVIRIS_HDR.name}"),
        (SceneKind.GDAL, f"{base}/cube.nc"),  # HDF5/NetCDF: read in place, its content picks the reader
        (SceneKind.SPECIAL, f"{base}/scene.jp2"),
    ]
    envi = scenes[2]
    assert (str(envi.path), str(envi.data)) == (f"/vsis3/{s3_bucket}/sets/{AVIRIS_HDR.name}",
                                                f"/vsis3/{s3_bucket}/sets/{AVIRIS.name}")
    assert "this format is not read from object stores" in (scenes[4].problem or "")
    # named on their own: the header, the data object (its header is the scene) and the MTL
    for named, scene in ((AVIRIS_HDR, envi), (AVIRIS, envi), (LANDSAT5[-1], scenes[1])):
        assert discover([f"{base}/{named.name}"]) == [scene]


def test_envi_and_landsat_sources_on_s3_ingest_like_local_files(s3_server: S3Server, s3_bucket: str,
                                                                  tmp_path: Path) -> None:
    """An ENVI pair and two Landsat MTL sets read in place from s3:// give the local lake's scenes and values."""
    _upload(s3_server, s3_bucket, "sets", [AVIRIS, AVIRIS_HDR, *LANDSAT5, L8_MTL, L8_BAND])
    local = Lake(tmp_path / "local")
    done = ingest([AVIRIS_HDR, REAL / "landsat5_tm_rstoolbox", L8_MTL], local, IngestOptions(products=("zarr",)))
    assert [r.outcome for r in done] == [Outcome.INGESTED] * 3, [r.message for r in done]
    env = s3_env(s3_server, tmp_path / "cache")  # staging in tmp_path / "staging"
    lake = tmp_path / "from-s3"
    base = f"s3://{s3_bucket}/sets"
    cmd = ("ingest", "--lake", str(lake), "--products", "zarr", "--format", "json")
    res = run_cli(*cmd, f"{base}/", env=env)
    results = _results(res)
    assert res.returncode == 0, results
    assert {r["outcome"] for r in results.values()} == {"ingested"}
    got = Lake(lake, create=False)
    assert got.scene_ids() == local.scene_ids()
    assert len(got.scene_ids()) == 3
    for sid in local.scene_ids():
        here, there = local.scene_record(sid), got.scene_record(sid)
        assert here is not None
        assert there is not None
        np.testing.assert_array_equal(zarr_data(got.scene_dir(sid) / f"{sid}.zarr"),
                                      zarr_data(local.scene_dir(sid) / f"{sid}.zarr"))
        assert there.source.path == f"{base}/{Path(here.source.path).name}"
        assert [f.path for f in there.source.files] == [f"{base}/{Path(f.path).name}" for f in here.source.files]
        assert all(f.model_dump()["etag"] and f.size == g.size for f, g in zip(there.source.files, here.source.files,
                                                                               strict=True))
        assert len(there.source.files) in (2, 3, 8)  # header + data; MTL + its band(s)
        # the same calibration (Landsat radiance/TOA coefficients from the MTL), bands, grid, time and tags
        for part in ("calibration", "bands", "grid", "acquisition", "tags", "encoding", "profile"):
            assert getattr(there, part) == getattr(here, part), (sid, part)
        assert [w.code for w in there.validation.warnings] == [w.code for w in here.validation.warnings]
    # the header and the data object named again: the header's scene, once
    again = run_cli(*cmd, f"{base}/", f"{base}/{AVIRIS_HDR.name}", f"{base}/{AVIRIS.name}", env=env)
    no_traceback(again)
    assert [r["outcome"] for r in json.loads(again.stdout)["results"]] == ["unchanged"] * 3
    client = s3_server.client()
    flipped = AVIRIS.read_bytes()[::-1]  # new content, same size, under the same key
    client.put_object(Bucket=s3_bucket, Key=f"sets/{AVIRIS.name}", Body=flipped)
    changed = _results(run_cli(*cmd, f"{base}/", env=env))
    assert changed[f"{base}/{AVIRIS_HDR.name}"]["outcome"] == "ingested"
    assert sorted(r["outcome"] for r in changed.values()) == ["ingested", "unchanged", "unchanged"]


def test_broken_envi_and_landsat_sets_on_s3_are_reported_by_url(s3_server: S3Server, s3_bucket: str,
                                                                 tmp_path: Path) -> None:
    """A header without its data object, a truncated data object, an MTL missing a band: as locally, by URL."""
    client = s3_server.client()
    base = f"s3://{s3_bucket}/broken"
    header = AVIRIS_HDR.read_bytes()
    client.put_object(Bucket=s3_bucket, Key="broken/lonely.hdr", Body=header)
    client.put_object(Bucket=s3_bucket, Key="broken/short.hdr", Body=header)
    client.put_object(Bucket=s3_bucket, Key="broken/short.img", Body=AVIRIS.read_bytes()[:100_000])
    _upload(s3_server, s3_bucket, "broken", [f for f in LANDSAT5 if not f.name.endswith("_B7.TIF")])
    env = s3_env(s3_server, tmp_path / "cache")
    res = run_cli("ingest", "--lake", str(tmp_path / "lake"), "--products", "zarr", "--format", "json",
                  f"{base}/", env=env)
    results = _results(res)
    assert res.returncode == 1, results
    lonely, short = results[f"{base}/lonely.hdr"], results[f"{base}/short.hdr"]
    assert lonely["outcome"] == short["outcome"] == "rejected"
    assert [e["code"] for e in lonely["errors"]] == ["data_file_missing"]
    assert lonely["errors"][0]["message"].startswith(f"{base}/lonely.hdr: the ENVI header's data file is missing")
    [truncated] = [e for e in short["errors"] if e["code"] == "truncated"]
    assert truncated["where"] == f"{base}/short.img"
    assert "70000 bytes are missing" in truncated["message"]
    landsat = results[f"{base}/{LANDSAT5[-1].name}"]
    assert landsat["outcome"] == "ingested"  # the other scenes are still ingested
    [missing] = [w for w in landsat["warnings"] if w["code"] == "bands_missing"]
    assert f"band(s) B7 listed in the MTL are not in {base};" in missing["message"]
    assert missing["where"] == f"{base}/{LANDSAT5[-1].name}"
    rec = Lake(tmp_path / "lake", create=False).scene_record(landsat["scene_id"])
    assert rec is not None
    assert len(rec.source.files) == 7  # the MTL and the six bands there are
    text = run_cli("ingest", "--lake", str(tmp_path / "lake2"), "--products", "zarr", f"{base}/", env=env)
    assert text.returncode == 1
    assert "1 ingested" in no_traceback(text)
