"""Jobs on a real Dask cluster: ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1.

What is checked on the lake itself: the same scenes, hashes and pixels as ``cubelake ingest``; every scene
exactly once after a worker dies mid-job or the client is killed at random moments; no work on a rerun;
exactly the changed scene redone.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import rasterio

from tests.conftest import no_traceback, run_cli

from .conftest import (
    DaskCluster,
    check_scene_complete,
    lake_state,
    scene_mtimes,
    start_cluster,
    stop_cluster,
    write_manifest,
    write_scene,
)

# Dask clusters, killed clients and workers: ~35 s a test at most alone, up to twice that beside other tests
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REAL_DIRS = ("hsi_enmap_potsdam", "hsi_aviris_ng_isofit", "hsi_jasper_ridge", "hsi_samson", "landsat8_rio_toa",
             "bad_inputs")


def jobs_run(manifest: Path, cluster: DaskCluster, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run_cli("jobs", "run", str(manifest), "--scheduler", cluster.address, *extra, timeout=timeout)


def status(manifest: Path) -> dict[str, Any]:
    res = run_cli("jobs", "status", str(manifest), "--format", "json", timeout=120)
    assert res.returncode == 0, no_traceback(res)
    return dict(json.loads(res.stdout))


def test_a_manifest_over_the_real_scenes_builds_the_lake_cubelake_ingest_builds(
        real: Path, tmp_path: Path, dask_cluster: DaskCluster) -> None:
    dirs = [str(real / d) for d in REAL_DIRS]
    cli = run_cli("ingest", "--lake", str(tmp_path / "cli"), "--products", "cog,zarr,refs", *dirs, timeout=900)
    manifest = write_manifest(tmp_path / "real.yaml", {
        "version": 1, "name": "real", "lake": str(tmp_path / "job"), "inputs": dirs,
        "steps": {"ingest": {"products": ["cog", "zarr", "refs"]}, "export": {"path": "exports/items.parquet"}}})
    res = jobs_run(manifest, dask_cluster, timeout=900)
    out = no_traceback(res)
    assert cli.returncode == res.returncode == 1, out  # the bad inputs are rejected by both
    assert "dashboard http://" in out
    assert f"scheduler {dask_cluster.address}" in out
    cli_lake, job_lake = lake_state(tmp_path / "cli"), lake_state(tmp_path / "job")
    assert len(cli_lake) >= 12
    assert cli_lake == job_lake
    assert sorted(p.name for p in (tmp_path / "cli" / "rejected").glob("*.json")) == \
        sorted(p.name for p in (tmp_path / "job" / "rejected").glob("*.json"))
    for sid in cli_lake:
        a, b = (json.loads((tmp_path / lk / "scenes" / sid / "scene.json").read_text()) for lk in ("cli", "job"))
        with rasterio.open(tmp_path / "cli" / "scenes" / sid / a["products"]["cog"]["path"]) as x, \
                rasterio.open(tmp_path / "job" / "scenes" / sid / b["products"]["cog"]["path"]) as y:
            np.testing.assert_array_equal(x.read(), y.read())
    items = pq.read_table(tmp_path / "job" / "exports" / "items.parquet").column("id").to_pylist()
    assert sorted(items) == sorted(job_lake)  # the export step: every scene's item
    doc = status(manifest)
    counts = doc["run"]["counts"]
    assert counts["ingested"] == len(job_lake)
    assert counts["rejected"] == len(list(
        (tmp_path / "job" / "rejected").glob("*.json")))
    assert counts["failed"] == 0
    assert {w for e in doc["run"]["inputs"] if (w := e.get("worker"))} <= set(_worker_addresses(dask_cluster))

    before = scene_mtimes(tmp_path / "job")
    again = jobs_run(manifest, dask_cluster)
    out = no_traceback(again)
    assert again.returncode == 0, out
    assert "0 scene(s) to ingest" in out
    assert "cluster:" not in out
    assert scene_mtimes(tmp_path / "job") == before
    assert status(manifest)["run"]["counts"]["skipped"] == counts["ingested"] + counts["rejected"]


def _worker_addresses(cluster: DaskCluster) -> list[str]:
    from distributed import Client

    with Client(cluster.address, timeout="10s", set_as_default=False) as c:
        return list(c.scheduler_info()["workers"])


def _ingested(out: str) -> list[str]:
    return sorted(Path(line.split()[1]).name for line in out.splitlines() if line.startswith("ingested "))


def test_a_changed_input_or_setting_redoes_exactly_that_scene(
        manifest: Callable[..., Path], scenes: Path, tmp_path: Path, dask_cluster: DaskCluster) -> None:
    steps = {"ingest": {"products": ["cog", "zarr", "refs"], "chunk": 64}, "stack": {"dim": "time"}}
    first = manifest(inputs=[str(scenes / "scene_4.tif"), str(scenes / "*.tif")], steps=steps)
    res = jobs_run(first, dask_cluster)
    assert res.returncode == 0, no_traceback(res)
    assert _ingested(res.stdout) == [f"scene_{i}.tif" for i in range(6)]
    cube = status(first)["run"]["steps"]["stack"]["result"]["cubes"]
    assert len(cube) == 1
    assert len(cube[0]["scenes"]) == 6
    from cubelake.refs import open_dataset

    ds = open_dataset(cube[0]["refs"], lake=str(tmp_path / "lake"))
    assert ds["data"].shape[0] == 6

    lake = tmp_path / "lake"
    before = scene_mtimes(lake)
    write_scene(scenes / "scene_2.tif", 99)  # new content
    res = jobs_run(first, dask_cluster)
    assert res.returncode == 0, no_traceback(res)
    assert _ingested(res.stdout) == ["scene_2.tif"]
    assert "5 done before (skipped)" in res.stdout
    after = scene_mtimes(lake)
    assert {k for k in after if after[k] != before[k]} == {"scene_2"}

    changed = manifest(inputs=[{"path": str(scenes / "scene_4.tif"), "ingest": {"chunk": 32}},
                               str(scenes / "*.tif")], steps=steps)
    res = jobs_run(changed, dask_cluster)
    assert res.returncode == 0, no_traceback(res)
    assert _ingested(res.stdout) == ["scene_4.tif"]
    later = scene_mtimes(lake)
    assert {k for k in later if later[k] != after[k]} == {"scene_4"}
    assert json.loads((lake / "scenes" / "scene_4" / "scene.json").read_text())["grid"]["chunk_shape"][1:] == [32, 32]
    groups = status(changed)["run"]["steps"]["stack"]["result"]["cubes"]
    assert sorted(len(c["scenes"]) for c in groups) == [5]  # scene_4 is on another chunk grid now

    forced = jobs_run(changed, dask_cluster, "--force")
    assert forced.returncode == 0, no_traceback(forced)
    assert _ingested(forced.stdout) == [f"scene_{i}.tif" for i in range(6)]  # rebuilt, not just re-checked
    assert all(v != later[k] for k, v in scene_mtimes(lake).items())


def test_a_worker_killed_mid_job_every_scene_is_published_once(
        manifest: Callable[..., Path], tmp_path: Path) -> None:
    # the first worker kills itself (SIGKILL) when it is about to publish its first scene
    cluster = start_cluster(tmp_path / "dask", [{"CUBELAKE_FAULT": "before-products"}, {}])
    try:
        path = manifest(steps={"ingest": {"products": ["cog", "zarr"], "chunk": 64}, "export": {}})
        res = jobs_run(path, cluster)
        out = no_traceback(res)
        assert res.returncode == 0, out
        assert cluster.workers[0].wait(timeout=60) == -signal.SIGKILL  # it did die mid-task
        assert cluster.workers[1].poll() is None
        lake = tmp_path / "lake"
        assert sorted(lake_state(lake)) == [f"scene_{i}" for i in range(6)]  # each once, no "-<hash>" twins
        for folder in (lake / "scenes").iterdir():
            check_scene_complete(folder)
        ids = pq.read_table(lake / "exports" / "catalog.parquet").column("id").to_pylist()
        assert sorted(ids) == [f"scene_{i}" for i in range(6)]
        entries = status(path)["ledger"]
        assert len(entries) == 6
        assert {e["state"] for e in entries} == {"done"}
    finally:
        stop_cluster(cluster)


def test_client_killed_at_random_moments_then_a_rerun_completes(
        manifest: Callable[..., Path], scenes: Path, tmp_path: Path, dask_cluster: DaskCluster) -> None:
    for i in range(6, 14):
        write_scene(scenes / f"scene_{i}.tif", i, bands=48, size=192)
    path = manifest(steps={"ingest": {"products": ["cog", "zarr", "refs"], "chunk": 64}, "export": {}})
    rng = random.Random(int(os.environ.get("CUBELAKE_KILL_SEED", "14")))
    # --force: every killed run has all scenes to (re)build, so kills land while scenes are being replaced too
    cmd = [sys.executable, "-m", "cubelake.cli", "jobs", "run", str(path), "--scheduler", dask_cluster.address,
           "--force"]
    # one whole run first: its duration places the kills inside the forced runs that follow, whatever the
    # machine's speed (fixed 1-5 s sleeps let a fast machine finish runs before the kill: too few kills landed)
    t0 = time.monotonic()
    first = jobs_run(path, dask_cluster)
    assert first.returncode == 0, no_traceback(first)
    whole = time.monotonic() - t0
    killed = 0
    for _ in range(10):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.1, 0.8) * whole)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait(timeout=60)
    assert killed >= 8  # the kills landed while the runs were going on
    res = jobs_run(path, dask_cluster)
    out = no_traceback(res)
    assert res.returncode == 0, out
    dask_cluster.idle()  # tasks of killed clients run to their end on the workers
    lake = tmp_path / "lake"
    expected = sorted(f"scene_{i}" for i in range(14))
    assert sorted(lake_state(lake)) == expected
    for sid in expected:
        check_scene_complete(lake / "scenes" / sid)
    assert list((lake / ".staging").iterdir()) == []  # no partial build left
    assert list((lake / ".trash").iterdir()) == []
    ids = pq.read_table(lake / "exports" / "catalog.parquet").column("id").to_pylist()
    assert sorted(ids) == expected
    doc = status(path)
    assert sorted(e["scene_id"] for e in doc["ledger"]) == expected
    runs = run_cli("jobs", "list", "--lake", str(lake), "--format", "json", timeout=120)
    job = json.loads(runs.stdout)["jobs"][0]
    assert job["job"] == "nightly"
    assert job["runs"] >= 4
    runs_done = json.loads(run_cli("jobs", "status", str(path), "--format", "json", timeout=120).stdout)
    assert runs_done["run"]["state"] == "succeeded"
    from cubelake.jobs import Ledger
    from cubelake.lake import Lake

    cut = [r for r in Ledger(Lake(lake), "nightly").runs() if r["state"] == "running"]
    assert len(cut) >= 3  # runs killed after they had started work (never finished)
    again = jobs_run(path, dask_cluster)
    assert again.returncode == 0, no_traceback(again)
    assert "0 scene(s) to ingest" in again.stdout


def test_two_runs_of_one_job_at_once_one_waits_out(
        manifest: Callable[..., Path], tmp_path: Path, dask_cluster: DaskCluster) -> None:
    path = manifest()
    first = subprocess.Popen([sys.executable, "-m", "cubelake.cli", "jobs", "run", str(path), "--scheduler",
                              dask_cluster.address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lease = tmp_path / "lake" / "jobs" / "nightly" / "lease.json"
    deadline = time.monotonic() + 120
    while not lease.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGSTOP)  # hold it while it holds the lease
    try:
        second = jobs_run(path, dask_cluster)
    finally:
        first.send_signal(signal.SIGCONT)
    out = no_traceback(second)
    assert second.returncode == 3, out
    assert "job nightly is already running" in out
    assert f"(pid {first.pid})" in out
    stdout, _ = first.communicate(timeout=300)
    assert first.returncode == 0, stdout
    assert sorted(lake_state(tmp_path / "lake")) == [f"scene_{i}" for i in range(6)]


@pytest.mark.s3
def test_a_job_into_an_s3_lake_keeps_its_ledger_there(
        manifest: Callable[..., Path], tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    aws = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "CUBELAKE_STAGING": str(tmp_path / "staging")}
    cluster = start_cluster(tmp_path / "dask", [aws, aws])
    try:
        url = f"s3://{s3_bucket}/lake"
        s3 = s3_server.client()
        for i in (6, 7):  # two more scenes arrive in the bucket: an s3:// prefix input
            s3.upload_file(str(write_scene(tmp_path / f"up_{i}.tif", i)), s3_bucket, f"incoming/up_{i}.tif")
        path = manifest(lake=url, inputs=[str(tmp_path / "in" / "*.tif"), f"s3://{s3_bucket}/incoming/"],
                        steps={"ingest": {"products": ["cog", "zarr"], "chunk": 64}, "export": {}})
        res = run_cli("jobs", "run", str(path), "--scheduler", cluster.address, env=aws, timeout=600)
        out = no_traceback(res)
        assert res.returncode == 0, out
        assert "8 ingested" in out
        keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="lake/jobs/nightly/")
                .get("Contents", [])}
        assert "lake/jobs/nightly/lease.json" in keys
        assert sum(k.startswith("lake/jobs/nightly/inputs/") for k in keys) == 8
        listing = run_cli("lake", "--lake", url, env=aws, timeout=120)
        assert listing.stdout.startswith(f"lake {url}: 8 scene(s)"), no_traceback(listing)
        again = run_cli("jobs", "run", str(path), "--scheduler", cluster.address, env=aws, timeout=600)
        assert again.returncode == 0, no_traceback(again)
        assert "0 scene(s) to ingest, 8 done before (skipped)" in again.stdout
        s3.upload_file(str(write_scene(tmp_path / "up_7.tif", 77)), s3_bucket, "incoming/up_7.tif")  # new ETag
        third = run_cli("jobs", "run", str(path), "--scheduler", cluster.address, env=aws, timeout=600)
        assert third.returncode == 0, no_traceback(third)
        assert _ingested(third.stdout) == ["up_7.tif"]
    finally:
        stop_cluster(cluster)


def test_ctrl_c_stops_a_run_cleanly_and_a_rerun_finishes(
        manifest: Callable[..., Path], scenes: Path, tmp_path: Path) -> None:
    for i in range(6, 12):
        write_scene(scenes / f"scene_{i}.tif", i, bands=48, size=192)
    path = manifest()  # no --scheduler: a LocalCluster of the manifest's 2 workers
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "cubelake.cli", "jobs", "run", str(path)], stdout=f,
                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while "ingested " not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    out = log.read_text()
    assert "Traceback" not in out, out
    assert "interrupted: job" in out
    assert "run it again to finish" in out
    from cubelake.jobs import Ledger
    from cubelake.lake import Lake

    ledger = Ledger(Lake(tmp_path / "lake"), "nightly")
    assert ledger.runs()[-1]["state"] == "interrupted"
    assert ledger.lease_info()["released"]  # type: ignore[index]
    res = run_cli("jobs", "run", str(path), timeout=600)
    assert res.returncode == 0, no_traceback(res)
    assert sorted(lake_state(tmp_path / "lake")) == sorted(f"scene_{i}" for i in range(12))


def test_a_worker_killed_from_outside_while_it_runs_a_scene(
        manifest: Callable[..., Path], scenes: Path, tmp_path: Path) -> None:
    from distributed import Client

    for i in range(6, 12):
        write_scene(scenes / f"scene_{i}.tif", i, bands=48, size=192)
    cluster = start_cluster(tmp_path / "dask", [{}, {}, {}])
    try:
        path = manifest(steps={"ingest": {"products": ["cog", "zarr"], "chunk": 64}})
        proc = subprocess.Popen([sys.executable, "-m", "cubelake.cli", "jobs", "run", str(path), "--scheduler",
                                 cluster.address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        victim = None
        with Client(cluster.address, timeout="10s", set_as_default=False) as c:
            deadline = time.monotonic() + 120
            while victim is None and time.monotonic() < deadline:
                busy = [a for a, keys in c.processing().items() if any(str(k).startswith("ingest-") for k in keys)]
                if busy:
                    name = str(c.scheduler_info()["workers"][busy[0]]["name"])  # "w<i>": the i-th process
                    victim = cluster.workers[int(name[1:])].pid
                time.sleep(0.02)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)  # in the middle of a scene
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
        assert "Traceback" not in out
        lake = tmp_path / "lake"
        expected = sorted(f"scene_{i}" for i in range(12))
        assert sorted(lake_state(lake)) == expected
        for sid in expected:
            check_scene_complete(lake / "scenes" / sid)
        assert sum(w.poll() is not None for w in cluster.workers) == 1
    finally:
        stop_cluster(cluster)
