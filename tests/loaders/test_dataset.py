"""CubeDataset end to end on real ingested products: values, decode counts, workers, resume, labels, spectral."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr
from torch.utils.data import DataLoader

from cubelake.loaders import (
    ChunkReadError,
    CubeDataset,
    LoaderMetrics,
    PlanSpec,
    ProductError,
    ReaderConfig,
    Sampling,
    Spectral,
)

from .conftest import expected_window

RAW = Spectral(normalize="none")


def windows(batches: Any) -> list[tuple[str, int, int]]:
    return [(s, int(w[0]), int(w[1])) for b in batches for s, w in zip(b["scene"], b["window"], strict=True)]


def check_values(batches: list[dict[str, Any]], cubes: dict[str, np.ndarray]) -> int:
    n = 0
    for b in batches:
        for i, (sid, w) in enumerate(zip(b["scene"], b["window"].tolist(), strict=True)):
            want = expected_window(cubes[sid], *w)
            np.testing.assert_array_equal(b["image"][i].numpy(), want, err_msg=f"{sid} window {w}")
            n += 1
    return n


@pytest.mark.parametrize("kind", ["zarr", "refs", "cog"])
def test_every_window_matches_the_source_and_each_chunk_is_decoded_once(synth_lake: dict[str, Any], kind: str) -> None:
    ds = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=32, stride=16, edge="pad", labels="none"),
                     spectral=RAW, plan=PlanSpec(seed=3, batch_size=16, chunks_per_round=4), prefer=(kind,))
    batches = list(ds)
    cubes = {"scene_a": synth_lake["a"], "scene_b": synth_lake["b"]}
    assert check_values(batches, cubes) == ds.n_samples()
    assert len(set(windows(batches))) == ds.n_samples()
    m = ds.metrics()
    plan = ds.plan(0)
    absent = 1 if kind == "zarr" else 0  # zarr stores no object for the all-nodata chunk: it is fill, not decoded
    assert m.chunks_decoded == plan.chunks.shape[0] - absent
    assert m.redecodes == 0
    assert m.samples == ds.n_samples()
    assert m.failed_chunks == 0
    assert m.bytes_used == ds.n_samples() * 24 * 32 * 32 * 2 - _outside_bytes(batches, cubes)
    if kind == "zarr":  # the all-nodata chunk is not stored, and windows lying only in it are not served
        assert ("scene_a", 64, 128) not in set(windows(batches))
        assert m.requests == m.chunks_decoded
    else:  # COG tiles of a row are adjacent in the file: coalesced into fewer requests
        assert m.requests < m.chunks_decoded


def _outside_bytes(batches: list[dict[str, Any]], cubes: dict[str, np.ndarray]) -> int:
    out = 0
    for b in batches:
        for sid, (r, c, h, w) in zip(b["scene"], b["window"].tolist(), strict=True):
            ny, nx = cubes[sid].shape[1:]
            inside = max(0, min(r + h, ny) - max(r, 0)) * max(0, min(c + w, nx) - max(c, 0))
            out += (h * w - inside) * 24 * 2
    return out


@pytest.mark.integration
def test_dataloader_workers_split_chunks_and_cover_the_epoch(synth_lake: dict[str, Any]) -> None:
    ds = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=32, stride=32, labels="none"), spectral=RAW,
                     plan=PlanSpec(seed=1, batch_size=8))
    single = set(windows(ds))
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, pin_memory=True)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        batches = list(ds.timed(loader))
        got = windows(batches)
        assert len(got) == len(set(got))
        assert set(got) == single
        # each batch knows where the DataLoader delivers it: what resuming relies on
        assert [int(b["cursor"]) for b in batches] == list(range(len(batches)))
        epochs.append(got)
    assert epochs[0] != epochs[1]  # a new order every epoch
    m0, m1 = ds.metrics(0), ds.metrics(1)
    plans = [ds.plan(0, worker=w, num_workers=2) for w in range(2)]
    assert m0.samples == len(single)
    assert m0.chunks_decoded == sum(p.chunks.shape[0] for p in plans)
    assert m0.stall_fraction == pytest.approx(m0.wait_s / m0.wall_s)
    assert m0.stall_fraction > 0.5  # a consumer that computes nothing spends its epoch waiting for batches
    assert m0.wall_s > 0
    # persistent workers keep their decoded chunks: the small lake fits the budget, epoch 1 reads nothing
    assert m1.samples == len(single)
    assert m1.requests == 0
    assert m1.chunks_decoded == 0


@pytest.mark.integration
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_neither_repeats_nor_skips(synth_lake: dict[str, Any], workers: int) -> None:
    def make() -> CubeDataset:
        return CubeDataset(synth_lake["scenes"], sampling=Sampling(size=32, stride=24, labels="none"), spectral=RAW,
                           plan=PlanSpec(seed=9, batch_size=8))

    ds = make()
    ds.set_epoch(2)
    full = windows(DataLoader(ds, batch_size=None, num_workers=workers))
    ds = make()
    ds.set_epoch(2)
    first = []
    for i, b in enumerate(DataLoader(ds, batch_size=None, num_workers=workers)):
        first.append(b)
        if i == 6:
            state = ds.state_dict(b)
            break
    resumed = make()
    resumed.load_state_dict(state)
    rest = windows(DataLoader(resumed, batch_size=None, num_workers=workers))
    done = windows(first)
    assert len(done) + len(rest) == len(full)
    assert sorted(done + rest) == sorted(full)
    if workers == 0:
        assert done + rest == full  # the same order, too
    # with workers the DataLoader starts its round-robin at worker 0 again, so only the order of workers' turns differs


def test_ddp_ranks_get_disjoint_equal_shares(synth_lake: dict[str, Any]) -> None:
    got = []
    for rank in range(2):
        ds = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=32, stride=16, labels="none"), spectral=RAW,
                         plan=PlanSpec(seed=4, batch_size=8, drop_last=True), rank=rank, world_size=2)
        batches = list(ds)
        got.append(windows(batches))
        assert all(len(b["scene"]) == 8 for b in batches)
    assert len(got[0]) == len(got[1])
    assert not set(got[0]) & set(got[1])
    assert len(got[0]) + len(got[1]) >= 0.9 * CubeDataset(synth_lake["scenes"], sampling=Sampling(size=32, stride=16)).n_samples()


def test_label_centred_patches_on_real_enmap(enmap_lake: dict[str, Any]) -> None:
    scenes = enmap_lake["scenes"]
    ds = CubeDataset(scenes, sampling=Sampling(mode="labels", size=9, edge="pad"), spectral=RAW,
                     plan=PlanSpec(seed=0, batch_size=32))
    batches = list(ds)
    import rasterio

    n_labelled = 0
    labels = {}
    for s in scenes:
        with rasterio.open(enmap_lake["folder"] / "labels" / f"{s.name}.tif") as src:
            labels[s.name] = src.read(1)
        n_labelled += int((labels[s.name] != 0).sum())
    assert sum(len(b["scene"]) for b in batches) == n_labelled > 0
    cubes = {s.name: xr.open_zarr(s / f"{s.name}.zarr")["data"].values for s in scenes}  # xarray decodes CF
    for b in batches:
        assert b["image"].shape[1:] == (cubes[scenes[0].name].shape[0], 9, 9)
        for i, (sid, (r, c, _h, _w)) in enumerate(zip(b["scene"], b["window"].tolist(), strict=True)):
            assert int(b["label"][i]) == labels[sid][r + 4, c + 4] != 0
            centre = cubes[sid][:, r + 4, c + 4]
            np.testing.assert_allclose(b["image"][i, :, 4, 4].numpy(), np.nan_to_num(centre), rtol=1e-6)
            if r < 0:  # padded rows outside the tile are the fill value
                assert (b["image"][i, :, : -r].numpy() == 0).all()


def test_dense_labels_and_wavelength_selection(enmap_lake: dict[str, Any]) -> None:
    scenes = enmap_lake["scenes"][:1]
    ds = CubeDataset(scenes, sampling=Sampling(size=16, stride=16, labels="dense"),
                     spectral=Spectral(wavelength_ranges_nm=[(450, 700), (1500, 1700)], normalize="none"),
                     plan=PlanSpec(batch_size=4))
    zs = xr.open_zarr(scenes[0] / f"{scenes[0].name}.zarr")
    wl = zs["wavelength"].values
    sel = np.flatnonzero(((wl >= 450) & (wl <= 700)) | ((wl >= 1500) & (wl <= 1700)))
    b = next(iter(ds))
    assert b["image"].shape == (4, sel.size, 16, 16)
    r, c = (int(v) for v in b["window"][0, :2])
    np.testing.assert_allclose(b["image"][0].numpy(), np.nan_to_num(zs["data"].values[sel, r:r + 16, c:c + 16]), rtol=1e-6)
    np.testing.assert_array_equal(b["label"][0].numpy(), zs["labels"].values[r:r + 16, c:c + 16])


def test_normalisation_projection_and_half_precision(synth_lake: dict[str, Any]) -> None:
    scenes = synth_lake["scenes"][1:]
    import json

    bands = json.loads((scenes[0] / "scene.json").read_text())["bands"]
    mean, std = np.array([b["mean"] for b in bands]), np.array([b["std"] for b in bands])
    ds = CubeDataset(scenes, sampling=Sampling(size=8, stride=8, labels="none"), plan=PlanSpec(batch_size=16))
    b = next(iter(ds))
    r, c = (int(v) for v in b["window"][0, :2])
    want = (synth_lake["b"][:, r:r + 8, c:c + 8] - mean[:, None, None]) / std[:, None, None]
    np.testing.assert_allclose(b["image"][0].numpy(), want, rtol=1e-4, atol=1e-4)
    proj = ds.fit_projection(5, max_batches=4)
    assert proj.matrix.shape == (5, 24)
    ds2 = CubeDataset(scenes, sampling=Sampling(size=8, stride=8, labels="none"), plan=PlanSpec(batch_size=16),
                      spectral=Spectral(projection=proj, dtype="float16"))
    b2 = next(iter(ds2))
    assert b2["image"].dtype == torch.float16
    assert b2["image"].shape == (16, 5, 8, 8)
    want_p = np.einsum("kc,chw->khw", proj.matrix, b["image"][0].numpy() - proj.center[:, None, None])
    np.testing.assert_allclose(b2["image"][0].float().numpy(), want_p, rtol=1e-2, atol=1e-2)


def test_statistics_are_computed_when_the_product_has_none(synth_lake: dict[str, Any]) -> None:
    cog = synth_lake["scenes"][1] / "scene_b.tif"  # a bare COG: no scene.json beside it is read
    ds = CubeDataset([cog], sampling=Sampling(size=8, stride=8, labels="none"), plan=PlanSpec(batch_size=512),
                     stats_chunks=100)
    x = torch.cat([b["image"] for b in ds]).numpy()
    assert np.abs(x.mean(axis=(0, 2, 3))).max() < 0.05
    assert np.abs(x.std(axis=(0, 2, 3)) - 1).max() < 0.05


def _corrupt_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    chunk = dst / "scene_b.zarr" / "data" / "c" / "0" / "1" / "2"
    chunk.write_bytes(b"\x00garbage" * 50)
    return dst


def test_a_corrupt_chunk_is_retried_then_dropped_with_a_warning(synth_lake: dict[str, Any], tmp_path: Path) -> None:
    scene = _corrupt_copy(synth_lake["scenes"][1], tmp_path / "scene_b")
    ds = CubeDataset([scene], sampling=Sampling(size=32, stride=32, labels="none"), spectral=RAW,
                     plan=PlanSpec(batch_size=8), reader=ReaderConfig(retries=1, backoff_s=0.001))
    with pytest.warns(RuntimeWarning, match=r"chunk \(row 1, col 2\) of scene scene_b.*dropped"):
        batches = list(ds)
    m = ds.metrics()
    assert m.failed_chunks == 1
    assert m.dropped_samples == 4
    assert len(windows(batches)) == ds.n_samples() - 4
    assert check_values(batches, {"scene_b": synth_lake["b"]}) == ds.n_samples() - 4
    strict = CubeDataset([scene], sampling=Sampling(size=32, stride=32, labels="none"), spectral=RAW,
                         reader=ReaderConfig(retries=0, strict=True))
    with pytest.raises(ChunkReadError, match=r"scene_b.zarr.*chunk \(row 1, col 2\)"):
        list(strict)


def test_disk_cache_serves_a_second_process_without_storage_reads(synth_lake: dict[str, Any], tmp_path: Path) -> None:
    kw: dict[str, Any] = {"sampling": Sampling(size=32, stride=32, labels="none"), "spectral": RAW, "prefer": ("cog",),
                          "disk_cache": tmp_path / "cache"}
    first = CubeDataset(synth_lake["scenes"], **kw)
    a = list(first)
    m1 = first.metrics()
    assert m1.disk_misses > 0
    assert m1.requests > 0
    second = CubeDataset(synth_lake["scenes"], **kw)
    b = list(second)
    m2 = second.metrics()
    assert m2.requests == 0
    assert m2.bytes_fetched == 0
    assert m2.disk_hits == m1.disk_misses
    assert sorted(windows(a)) == sorted(windows(b))
    check_values(b, {"scene_a": synth_lake["a"], "scene_b": synth_lake["b"]})


def test_a_small_cache_budget_bounds_memory_and_counts_redecodes(synth_lake: dict[str, Any]) -> None:
    chunk = 24 * 64 * 64 * 2
    ds = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=32, stride=16, labels="none"), spectral=RAW,
                     plan=PlanSpec(batch_size=16, order="random"), reader=ReaderConfig(cache_bytes=3 * chunk), prefetch=2)
    batches = list(ds)
    check_values(batches, {"scene_a": synth_lake["a"], "scene_b": synth_lake["b"]})
    m = ds.metrics()
    assert m.redecodes > 0
    assert m.chunks_decoded > ds.plan(0).chunks.shape[0]


def test_zarr_over_s3(synth_lake: dict[str, Any], s3_server: Any, s3_bucket: str) -> None:
    client = s3_server.client()
    store = synth_lake["scenes"][0] / "scene_a.zarr"
    for f in store.rglob("*"):
        if f.is_file():
            client.upload_file(str(f), s3_bucket, f"lake/scene_a.zarr/{f.relative_to(store)}")
    ds = CubeDataset([f"s3://{s3_bucket}/lake/scene_a.zarr"], storage_options=s3_server.options,
                     sampling=Sampling(size=32, stride=32, labels="none"), spectral=RAW, plan=PlanSpec(batch_size=8))
    # obstore's runtime does not survive fork: S3 loading in worker processes needs spawned workers
    with pytest.raises(RuntimeError, match="multiprocessing_context='spawn'"):
        list(DataLoader(ds, batch_size=None, num_workers=1))
    batches = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    assert check_values(batches, {"scene_a": synth_lake["a"]}) == ds.n_samples() > 0
    local = CubeDataset([store], sampling=Sampling(size=32, stride=32, labels="none"), spectral=RAW)
    assert sorted(windows(batches)) == sorted(windows(local))


def test_bad_products_are_named(synth_lake: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ProductError, match="no such product"):
        CubeDataset([tmp_path / "missing.zarr"])
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(ProductError, match="unknown product type"):
        CubeDataset([tmp_path / "x.txt"])
    with pytest.raises(ProductError, match="label raster"):
        CubeDataset(synth_lake["scenes"], sampling=Sampling(mode="labels"))
    with pytest.raises(ValueError, match="no band lies"):
        CubeDataset(synth_lake["scenes"], spectral=Spectral(wavelength_ranges_nm=[(2000, 2100)]))


def test_metrics_report_reads_like_a_summary(synth_lake: dict[str, Any]) -> None:
    ds = CubeDataset(synth_lake["scenes"][:1], sampling=Sampling(size=32, stride=32, labels="none"), spectral=RAW)
    batches = sum(1 for _ in ds.timed(ds))
    m = ds.metrics()
    lines = m.report().splitlines()
    assert lines[0].startswith(f"epoch 0: {ds.n_samples()} samples in {batches} batches, {m.wall_s:.2f} s (")
    assert f"stall {m.wait_s / m.wall_s:.1%} (waited {m.wait_s:.2f} s)" in lines[0]
    assert lines[1].startswith(f"  storage: {m.requests} requests, {m.bytes_fetched / 2**20:,.1f} MiB fetched")
    assert m.requests > 0
    assert lines[2].startswith(f"  decode: {ds.plan(0).chunks.shape[0]} chunks (0 again)")
    assert m.to_dict()["samples"] == ds.n_samples()


def test_metrics_report_figures_are_the_counters() -> None:
    mib = 2**20
    m = LoaderMetrics(epoch=3, samples=1000, batches=16, wall_s=2.0, wait_s=0.5, requests=40, bytes_fetched=10 * mib,
                      bytes_used=20 * mib, bytes_decoded=30 * mib, chunks_decoded=12, redecodes=1, cache_hits=30,
                      cache_misses=12, disk_hits=2, disk_misses=5, fetch_s=0.8, decode_s=1.2, chunk_wait_s=0.25,
                      assemble_s=0.6, threads=2, failed_chunks=1, retries=4, throttled=2, dropped_samples=9,
                      invalid_samples=3, hedges=5, hedge_wins=2)
    assert m.report().splitlines()[:4] + m.report().splitlines()[5:] == [
        "epoch 3: 1000 samples in 16 batches, 2.00 s (500 samples/s), stall 25.0% (waited 0.50 s)",
        "  storage: 40 requests, 10.0 MiB fetched (0.50 per byte used), disk cache 2 hits / 5 misses",
        "  decode: 12 chunks (1 again), 30.0 MiB decoded (1.50 per byte used), memory cache 30 hits / 12 misses",
        "  time: fetch 0.80 s, decode 1.20 s (thread time), waiting for chunks 0.25 s, cutting batches 0.60 s",
        # T_c = (2.0 - 0.5) / 16; T_d = max((0.8 + 1.2) / 2 threads, 0.6) / 16: bound 1.5 / 2.0
        "  per batch: compute T_c 93.8 ms, load T_d 62.5 ms: utilisation bound 100%, measured 75%",
        "  errors: 1 chunks failed (4 retries, 2 throttled), 9 samples dropped, 3 below min_valid; 5 hedged requests "
        "(2 won)",
    ]
    assert m.report().splitlines()[4].startswith("  link: 41.9 Mbit/s fetched, 10.2 KiB per sample;")
    slow = LoaderMetrics(samples=64, batches=4, wall_s=1.0, wait_s=0.6, fetch_s=2.0, decode_s=2.0, threads=2)
    assert "load T_d 500.0 ms: utilisation bound 20%, measured 40%" in slow.report()  # T_c 100 ms / T_d 500 ms


def test_catalog_search_results_are_loader_inputs(synth_lake: dict[str, Any]) -> None:
    from cubelake.catalog import LakeCatalog, Query

    with LakeCatalog(synth_lake["lake"]) as cat:
        hits = cat.search(Query(ids=["scene_b"]))
        assert [h.id for h in hits] == ["scene_b"]
        with pytest.raises(ProductError, match="pass lake="):
            CubeDataset(hits)
        ds = CubeDataset(hits, lake=synth_lake["lake"], sampling=Sampling(size=32, stride=32, labels="none"), spectral=RAW)
    batches = list(ds)
    assert {s for b in batches for s in b["scene"]} == {"scene_b"}
    assert check_values(batches, {"scene_b": synth_lake["b"]}) == ds.n_samples() == 6 * 10


def test_a_consumer_that_stops_early_leaves_no_thread_behind(synth_lake: dict[str, Any]) -> None:
    import threading

    ds = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=16, stride=16, labels="none"), spectral=RAW,
                     plan=PlanSpec(batch_size=4), prefetch_batches=3)
    it = iter(ds)
    next(it)
    it.close()  # type: ignore[attr-defined]
    assert not [t for t in threading.enumerate() if t.name == "cubelake-batches"]


def test_cog_over_s3_is_read_by_coalesced_range_requests(synth_lake: dict[str, Any], s3_server: Any, s3_bucket: str) -> None:
    s3_server.client().upload_file(str(synth_lake["scenes"][0] / "scene_a.tif"), s3_bucket, "cogs/scene_a.tif")
    ds = CubeDataset([f"s3://{s3_bucket}/cogs/scene_a.tif"], storage_options=s3_server.options,
                     sampling=Sampling(size=32, stride=32, labels="none"), spectral=RAW, plan=PlanSpec(batch_size=8))
    batches = list(ds)
    assert check_values(batches, {"scene_a": synth_lake["a"]}) == ds.n_samples() > 0
    m = ds.metrics()
    assert 0 < m.requests < m.chunks_decoded  # neighbouring tiles come in one range request


def test_min_valid_drops_windows_in_the_nodata_corner(synth_lake: dict[str, Any]) -> None:
    ds = CubeDataset(synth_lake["scenes"][:1], sampling=Sampling(size=16, stride=16, labels="none", min_valid=0.5),
                     spectral=RAW, plan=PlanSpec(batch_size=32))
    got = set(windows(ds))
    corner = {("scene_a", r, c) for r in (0, 16) for c in (0, 16, 32)}  # rows < 40, cols < 50 are nodata
    assert not got & corner
    assert ("scene_a", 32, 0) in got
    assert ds.metrics().invalid_samples == len(corner)
    assert len(got) == ds.n_samples() - len(corner)


def test_a_batch_cut_on_two_threads_equals_the_one_thread_cut(synth_lake: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Large batches are cut half on a helper thread (upper half of the bands): same pixels, same nodata counts."""
    import cubelake.loaders.batch as batch_mod

    def epoch(split_bytes: int) -> tuple[list[dict[str, Any]], int]:
        monkeypatch.setattr(batch_mod, "SPLIT_BYTES", split_bytes)
        ds = CubeDataset(synth_lake["scenes"], sampling=Sampling(size=24, stride=20, labels="none", min_valid=0.6),
                         spectral=Spectral(normalize="none", fill=-1.0), plan=PlanSpec(batch_size=16, seed=3),
                         prefer=("zarr",))
        got = [{k: b[k].clone() if isinstance(b[k], torch.Tensor) else b[k] for k in ("image", "window", "scene")}
               for b in ds]
        return got, ds.metrics().invalid_samples

    submitted = []
    real_helper = batch_mod._helper

    def counting_helper() -> Any:
        submitted.append(1)
        return real_helper()

    monkeypatch.setattr(batch_mod, "_helper", counting_helper)
    one, invalid_one = epoch(2**62)
    assert not submitted
    two, invalid_two = epoch(0)
    assert len(submitted) == len(two) > 10
    assert invalid_one == invalid_two > 0  # the nodata corner's windows are dropped either way
    assert [b["scene"] for b in one] == [b["scene"] for b in two]
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a["window"], b["window"])
        assert torch.equal(a["image"], b["image"])
    cubes = {"scene_a": synth_lake["a"], "scene_b": synth_lake["b"]}
    for b in two:  # and both are right: every window against the source cube (nodata and outside = -1)
        for sid, w, img in zip(b["scene"], b["window"].tolist(), b["image"], strict=True):
            np.testing.assert_array_equal(img.numpy(), expected_window(cubes[sid], *w, fill=-1.0))
