"""The lake: atomic publication, idempotent re-ingest, crash and Ctrl-C safety, concurrent ingests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from blake3 import blake3

from cubelake.errors import LakeError
from cubelake.ingest import IngestOptions, Outcome, ingest, load_profile
from cubelake.lake import Lake, safe_scene_id
from tests.conftest import hsi_cube, write_geotiff


def _scene(tmp_path: Path, name: str = "scene.tif", seed: int = 0, shape: tuple[int, int, int] = (6, 70, 90)) -> Path:
    return write_geotiff(tmp_path / name, hsi_cube(*shape, "int16", seed), nodata=-32768, tiled=True,
                         blockxsize=32, blockysize=32)


def test_reingest_unchanged_does_nothing_and_says_so(tmp_path: Path, lake: Lake) -> None:
    src = _scene(tmp_path)
    (first,) = ingest([src], lake, IngestOptions(chunk=32))
    assert first.outcome is Outcome.INGESTED
    scene = lake.scene_dir(first.scene_id)  # type: ignore[arg-type]
    files = json.loads((scene / "scene.json").read_text())["source"]["files"]
    assert files == [{"path": str(src.resolve()), "size": src.stat().st_size, "mtime_ns": src.stat().st_mtime_ns,
                      "blake3": blake3(src.read_bytes()).hexdigest()}]
    before = {p: p.stat().st_mtime_ns for p in scene.rglob("*")}
    (second,) = ingest([src], lake, IngestOptions(chunk=32))
    assert second.outcome is Outcome.UNCHANGED
    assert "nothing to do" in second.message
    assert {p: p.stat().st_mtime_ns for p in scene.rglob("*")} == before
    # a touched but identical file is still unchanged (the content hash decides)
    os.utime(src, None)
    (third,) = ingest([src], lake, IngestOptions(chunk=32))
    assert third.outcome is Outcome.UNCHANGED


def test_changed_content_or_config_rebuilds(tmp_path: Path, lake: Lake) -> None:
    src = _scene(tmp_path)
    (a,) = ingest([src], lake, IngestOptions(chunk=32))
    old_hash = json.loads((lake.scene_dir(a.scene_id) / "scene.json").read_text())["content_hash"]  # type: ignore[arg-type]
    (b,) = ingest([src], lake, IngestOptions(chunk=64))
    assert b.outcome is Outcome.INGESTED
    assert b.scene_id == a.scene_id
    _scene(tmp_path, seed=1)  # same path, new pixels
    (c,) = ingest([src], lake, IngestOptions(chunk=64))
    assert c.outcome is Outcome.INGESTED
    rec = json.loads((lake.scene_dir(c.scene_id) / "scene.json").read_text())  # type: ignore[arg-type]
    assert rec["content_hash"] != old_hash
    assert rec["grid"]["chunk_shape"][1] == 64
    assert lake.scene_ids() == [a.scene_id]
    assert not list((lake.root / ".trash").iterdir())
    (d,) = ingest([src], lake, IngestOptions(chunk=64, force=True))
    assert d.outcome is Outcome.INGESTED


def test_same_stem_in_two_folders_gets_two_ids(tmp_path: Path, lake: Lake) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    r1, r2 = ingest([_scene(tmp_path / "a"), _scene(tmp_path / "b", seed=2)], lake, IngestOptions(chunk=32))
    assert r1.outcome is r2.outcome is Outcome.INGESTED
    assert r1.scene_id != r2.scene_id
    assert len(lake.scene_ids()) == 2


def test_interrupt_mid_scan_publishes_nothing(tmp_path: Path, lake: Lake) -> None:
    src = _scene(tmp_path, shape=(8, 256, 256))

    def interrupt(ev):  # type: ignore[no-untyped-def]
        if ev.stage == "scan" and ev.done >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ingest([src], lake, IngestOptions(chunk=32), progress=interrupt)
    assert lake.scene_ids() == []
    assert list((lake.root / ".staging").iterdir()) == []


def _wait_for_staging(lake_root: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if any((lake_root / ".staging").glob("*")):
            return
        if proc.poll() is not None:
            raise AssertionError(f"ingest finished before it could be interrupted: {proc.communicate()}")
        time.sleep(0.01)
    raise AssertionError("the ingest never started building")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_killed_cli_leaves_nothing_partial_and_next_run_cleans_up(tmp_path: Path, sig: signal.Signals) -> None:
    src = _scene(tmp_path, shape=(64, 1024, 1024))
    root = tmp_path / "lake"
    Lake(root)
    proc = subprocess.Popen([sys.executable, "-m", "cubelake.cli", "ingest", "--lake", str(root), "--workers", "1",
                             "--chunk", "64", str(src)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_staging(root, proc)
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=60)
    assert not list((root / "scenes").iterdir())  # nothing was published
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert b"interrupted" in err
        assert not list((root / ".staging").iterdir())
    else:
        assert proc.returncode == -signal.SIGKILL
        assert list((root / ".staging").iterdir())  # the dead build is left behind ...
    lake = Lake(root)
    (r,) = ingest([src], lake, IngestOptions(chunk=64))  # ... and removed by the next run
    assert r.outcome is Outcome.INGESTED
    assert not list((root / ".staging").iterdir())


def test_ctrl_c_while_zarr_writes_on_its_loop_leaves_no_staging_folder(tmp_path: Path, lake: Lake) -> None:
    """zarr-python's synchronous calls wait for a coroutine on zarr's own loop thread; Ctrl-C in that wait leaves
    the coroutine running. The staging folder is removed only once it has finished writing into it."""
    import asyncio
    import threading

    import zarr
    from zarr.core.sync import sync

    interrupted = threading.Event()

    async def slow_create(path: Path) -> None:
        for _ in range(3000):  # still running when the interrupt arrives, however late the timer fires
            if interrupted.is_set():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the caller has moved on by now
        await zarr.api.asynchronous.create_array(store=str(path), shape=(4, 4), chunks=(2, 2), dtype="int16")

    def build() -> None:
        with lake.staging("scene") as staged:
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                sync(slow_create(staged / "scene.zarr" / "data"))
            except KeyboardInterrupt:
                interrupted.set()
                raise

    with pytest.raises(KeyboardInterrupt):
        build()
    time.sleep(1.0)  # time for a straggling write to land
    assert list((lake.root / ".staging").iterdir()) == []


def test_recover_restores_a_scene_caught_mid_replacement(tmp_path: Path, lake: Lake) -> None:
    (r,) = ingest([_scene(tmp_path)], lake, IngestOptions(chunk=32))
    sid = r.scene_id
    assert sid is not None
    # simulate a crash between "move old version to trash" and "move new version in"
    os.rename(lake.scene_dir(sid), lake.root / ".trash" / f"{sid}.deadbeef")
    assert lake.scene_ids() == []
    done = lake.recover()
    assert lake.scene_ids() == [sid]
    assert any("restored" in line for line in done)


def test_recover_keeps_live_builds(tmp_path: Path, lake: Lake) -> None:
    live = lake.root / ".staging" / f"x.{os.getpid()}.abcd"
    live.mkdir()
    dead = lake.root / ".staging" / "y.999999999.abcd"
    dead.mkdir()
    lake.recover()
    assert live.exists()
    assert not dead.exists()


@pytest.mark.slow
def test_two_processes_ingesting_the_same_scene(tmp_path: Path) -> None:
    src = _scene(tmp_path, shape=(32, 512, 512))
    root = tmp_path / "lake"
    Lake(root)
    cmd = [sys.executable, "-m", "cubelake.cli", "ingest", "--lake", str(root), "--chunk", "64", "--format", "json", str(src)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outcomes = sorted(json.loads(p.communicate(timeout=120)[0])["results"][0]["outcome"] for p in procs)
    assert outcomes == ["ingested", "unchanged"]
    assert Lake(root).scene_ids() == ["scene"]


def test_processes_creating_one_new_lake_at_once_all_succeed(tmp_path: Path) -> None:
    """Each round starts several processes at one instant on a lake that does not exist yet."""
    code = ("import sys, time; from cubelake.lake import Lake; t = float(sys.argv[2]); "
            "time.sleep(max(0.0, t - time.time())); lk = Lake(sys.argv[1]); print(len(lk.scene_ids()))")
    for round_ in range(5):
        root = tmp_path / f"lake{round_}" / "deeper"
        start = time.time() + 1.0
        procs = [subprocess.Popen([sys.executable, "-c", code, str(root), str(start)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(6)]
        results = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0] * 6, [err for _, err in results]
        assert json.loads((root / "lake.json").read_text())["format"] == "cubelake-lake"
        assert sorted(p.name for p in root.iterdir()) == [".locks", ".staging", ".trash", "lake.json", "rejected",
                                                          "scenes"]


def test_lake_creation_never_replaces_a_marker_another_process_wrote(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    Lake(root).allow_root(str(tmp_path / "archive"))
    assert Lake(root).allowed_roots == [str((tmp_path / "archive").resolve())]
    # a process that found no marker a moment ago still creates nothing over the one now there
    late = Lake.__new__(Lake)
    late.root = root
    late._create(root / "lake.json")
    assert Lake(root).allowed_roots == [str((tmp_path / "archive").resolve())]


def test_lake_refuses_foreign_or_newer_folders(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.txt").write_text("x")
    with pytest.raises(LakeError, match="not empty"):
        Lake(foreign)
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "lake.json").write_text(json.dumps({"format": "cubelake-lake", "version": 99}))
    with pytest.raises(LakeError, match="newer"):
        Lake(newer)
    with pytest.raises(LakeError, match="no cubelake lake"):
        Lake(tmp_path / "absent", create=False)


@pytest.mark.parametrize(("name", "safe"), [("../../etc/passwd", "etc_passwd"), ("a b/c", "a_b_c"), ("..", "scene"),
                                            ("x..y", "x.y"), ("ENMAP01-L2A_2022", "ENMAP01-L2A_2022")])
def test_safe_scene_ids(name: str, safe: str) -> None:
    assert safe_scene_id(name) == safe
    assert "/" not in safe_scene_id(name)


def test_profile_applies_and_is_recorded(tmp_path: Path, lake: Lake) -> None:
    src = write_geotiff(tmp_path / "refl.tif", (hsi_cube(4, 40, 40, "float32") * 10000).astype(np.float32),
                        nodata=-32768)
    prof = tmp_path / "p.yaml"
    prof.write_text("name: refl\ncalibration: {scale: 1.0e-4, quantity: reflectance, unit: '1'}\n"
                    "encoding: {dtype: int16, scale_factor: 1.0e-4, fill_value: -32768}\nproducts: {chunk: 32}\n")
    (r,) = ingest([src], lake, IngestOptions(profile=load_profile(prof)))
    rec = json.loads((lake.scene_dir(r.scene_id) / "scene.json").read_text())  # type: ignore[arg-type]
    assert rec["profile"]["name"] == "refl"
    assert rec["encoding"]["dtype"] == "int16"
    assert rec["calibration"]["quantity"] == "reflectance"


def test_lake_copy_creates_a_missing_staging_folder_and_leaves_it_clean(tmp_path: Path) -> None:
    from tests.conftest import no_traceback, run_cli

    src = write_geotiff(tmp_path / "scene.tif", hsi_cube(8, 64, 64, seed=2))
    res = ingest([src], tmp_path / "a", IngestOptions(chunk=32, products=("zarr",)))
    assert res[0].outcome is Outcome.INGESTED, res[0].message
    staging = tmp_path / "not" / "yet"
    out = run_cli("lake", "copy", str(tmp_path / "a"), str(tmp_path / "b"), env={"CUBELAKE_STAGING": str(staging)})
    assert out.returncode == 0, no_traceback(out)
    assert Lake(tmp_path / "b", create=False).scene_ids() == ["scene"]
    assert list((staging / "cubelake-staging").iterdir()) == []  # the copy's staging folder is gone


def test_a_replacement_whose_final_rename_fails_restores_the_old_version_at_once(tmp_path: Path, lake: Lake,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (r,) = ingest([_scene(tmp_path)], lake, IngestOptions(chunk=32))
    sid = r.scene_id
    assert sid is not None
    old = {p.relative_to(lake.scene_dir(sid)): p.read_bytes() for p in lake.scene_dir(sid).rglob("*") if p.is_file()}
    real_rename = os.rename

    def rename(src: str | Path, dst: str | Path) -> None:
        if ".staging" in str(src):  # the new version's move into scenes/
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    with lake.staging(sid) as staged:
        (staged / "scene.json").write_text("{}")
        monkeypatch.setattr(os, "rename", rename)
        with pytest.raises(OSError, match="No space"):
            lake.publish(staged, sid)
        monkeypatch.undo()
    # no recover() needed: the old version is back in place, byte for byte, and nothing is left in the trash
    assert {p.relative_to(lake.scene_dir(sid)): p.read_bytes() for p in lake.scene_dir(sid).rglob("*")
            if p.is_file()} == old
    assert list((lake.root / ".trash").iterdir()) == []
    assert lake.scene_ids() == [sid]


@pytest.mark.parametrize("damage", ["flip-a-byte-of-a-chunk", "drop-a-chunk", "flip-a-byte-of-the-cog"])
def test_lake_copy_refuses_a_damaged_product_and_copies_the_other_scenes(tmp_path: Path, damage: str) -> None:
    from cubelake.copy import copy_lake

    a, b = tmp_path / "a", tmp_path / "b"
    srcs = [write_geotiff(tmp_path / f"{n}.tif", hsi_cube(4, 40, 40, seed=i)) for i, n in enumerate(("one", "two"))]
    res = ingest(srcs, a, IngestOptions(chunk=16, products=("cog", "zarr")))
    assert [r.outcome for r in res] == [Outcome.INGESTED] * 2, [r.message for r in res]
    scene = Lake(a, create=False).scene_dir("one")
    chunks = sorted(p for p in (scene / "one.zarr").rglob("c/*/*/*") if p.is_file())
    assert len(chunks) == 9  # 4 bands in one chunk deep, 3 x 3 chunks of 16 over 40 x 40
    victim = scene / "one.tif" if damage.endswith("cog") else chunks[4]
    if damage == "drop-a-chunk":
        victim.unlink()
    else:
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    report = copy_lake(a, b)
    product = "cog" if damage.endswith("cog") else "zarr"
    assert list(report.failed) == ["one"]
    assert f"one: product {product} differs from its recorded BLAKE3" in report.failed["one"]
    assert "nothing was copied for this scene" in report.failed["one"]
    assert report.copied == ["two"]
    assert Lake(b, create=False).scene_ids() == ["two"]


def test_lake_copy_reports_its_bytes_skips_what_is_there_and_copies_what_differs(tmp_path: Path) -> None:
    import shutil

    from cubelake.copy import copy_lake

    for name, seed in (("x", 1), ("y", 2)):  # two lakes, the same scene id with different pixels
        (tmp_path / name).mkdir()
        src = write_geotiff(tmp_path / name / "scene.tif", hsi_cube(4, 40, 40, seed=seed))
        (r,) = ingest([src], tmp_path / f"lake-{name}", IngestOptions(chunk=16, products=("cog", "zarr")))
        assert r.outcome is Outcome.INGESTED, r.message
    x, y = tmp_path / "lake-x", tmp_path / "lake-y"
    first = copy_lake(x, tmp_path / "c")
    scene = Lake(x, create=False).scene_dir("scene")
    assert first.copied == ["scene"]
    assert first.bytes == sum(p.stat().st_size for p in scene.rglob("*") if p.is_file() and p.name != "item.json")
    assert first.lines()[-1] == f"1 copied ({first.bytes} bytes), 0 unchanged, 0 failed"
    again = copy_lake(x, tmp_path / "c")
    assert (again.copied, again.skipped, again.bytes) == ([], ["scene"], 0)
    assert again.lines() == ["unchanged scene (already in the destination)", "0 copied (0 bytes), 1 unchanged, 0 failed"]
    # a destination holding other content is replaced, whichever way its content hash sorts
    for src, dst in ((x, y), (y, x)):
        target = tmp_path / f"into-{dst.name}"
        shutil.copytree(dst, target, symlinks=True)
        report = copy_lake(src, target)
        assert report.copied == ["scene"], report.lines()
        assert Lake(target, create=False).scene_record("scene").content_hash == \
            Lake(src, create=False).scene_record("scene").content_hash  # type: ignore[union-attr]


def test_lake_copy_from_a_missing_lake_creates_nothing(tmp_path: Path) -> None:
    from cubelake.copy import copy_lake

    with pytest.raises(LakeError):
        copy_lake(tmp_path / "nowhere", tmp_path / "dst")
    assert not (tmp_path / "nowhere").exists()


def test_a_committed_item_goes_back_to_its_staged_form() -> None:
    from cubelake.copy import local_item
    from cubelake.object_lake import VERSION_KEY

    item = {"id": "s", "properties": {VERSION_KEY: "v7", "datetime": None},
            "assets": {"cog": {"href": "./v/v7/s.tif"}, "other": {"href": "./v/v8/s.tif"}, "ext": {"href": "s3://b/k"}}}
    staged = local_item(item)
    assert staged == {"id": "s", "properties": {"datetime": None},
                      "assets": {"cog": {"href": "./s.tif"}, "other": {"href": "./v/v8/s.tif"}, "ext": {"href": "s3://b/k"}}}
    assert item["properties"][VERSION_KEY] == "v7"  # the committed item is left as it was
    assert local_item({"id": "s", "assets": {"a": {"href": "./v//a"}}}) == {"id": "s", "assets": {"a": {"href": "./v//a"}}}


def test_a_scene_lock_is_held_across_processes_and_released(tmp_path: Path, lake: Lake) -> None:
    code = ("import sys, time; from cubelake.lake import Lake\n"
            "with Lake(sys.argv[1]).lock('s1'):\n    print('held', flush=True); time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(lake.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        with lake.lock("s1", blocking=False) as got:
            assert got is False  # another process holds it
        with lake.lock("s2", blocking=False) as got:
            assert got is True  # another scene's lock is free
    finally:
        holder.kill()
        holder.wait(30)
    with lake.lock("s1", blocking=False) as got:
        assert got is True  # the dead holder's lock is free again
        with Lake(lake.root).lock("s1", blocking=False) as again:
            assert again is False  # and now held here
    with lake.lock("s1", blocking=False) as got:
        assert got is True  # released on leaving


def test_a_staging_folder_is_gone_after_a_failed_build_and_publishing_clears_an_old_rejection(
        tmp_path: Path, lake: Lake) -> None:
    def build() -> None:
        with lake.staging("s1") as staged:
            (staged / "half.tif").write_bytes(b"half")
            raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        build()
    assert list((lake.root / ".staging").iterdir()) == []
    lake.record_rejection("s1", {"reason": "an earlier version was refused"})
    assert lake.rejected_ids() == ["s1"]
    with lake.staging("s1") as staged:
        (staged / "scene.json").write_text("{}")
        target = lake.publish(staged, "s1")
    assert target == lake.scene_dir("s1")
    assert (target / "scene.json").read_text() == "{}"
    assert lake.rejected_ids() == []  # published now: the rejection no longer stands
    assert list((lake.root / ".staging").iterdir()) == []


def test_recover_keeps_the_builds_of_every_live_process_and_only_those(tmp_path: Path, lake: Lake) -> None:
    from cubelake.lake import pid_alive

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead_low = next(p for p in range(os.getpid() - 1, 1, -1) if not pid_alive(p))
        staging = lake.root / ".staging"
        keep = [staging / f"a.{os.getpid()}.abcd", staging / f"b.{other.pid}.abcd"]
        gone = [staging / f"c.{dead_low}.abcd", staging / "d.999999999.abcd", staging / "e.notapid.abcd",
                staging / "f"]
        for folder in keep + gone:
            folder.mkdir()
        done = lake.recover()
        assert [p for p in keep if p.exists()] == keep  # this process's, and another live one's
        assert [p for p in gone if p.exists()] == []
        assert sorted(done) == sorted(f"removed unfinished build {p.name}" for p in gone)
    finally:
        other.kill()
        other.wait(30)


def test_recover_restores_every_scene_caught_mid_replacement(tmp_path: Path, lake: Lake) -> None:
    results = ingest([_scene(tmp_path, f"{name}.tif", seed=i) for i, name in enumerate(("one", "two", "three"))],
                     lake, IngestOptions(chunk=32))
    sids = [str(r.scene_id) for r in results]
    for sid in sids:  # a crash between "old version to the trash" and "new version in", three times
        os.rename(lake.scene_dir(sid), lake.root / ".trash" / f"{sid}.deadbeef")
    (lake.root / ".trash" / "junk.0badf00d").mkdir()  # no scene record: only removed
    assert lake.scene_ids() == []
    done = lake.recover()
    assert lake.scene_ids() == sorted(sids)
    assert sorted(done) == sorted(f"restored scene {s} interrupted while being replaced" for s in sids)
    assert list((lake.root / ".trash").iterdir()) == []
