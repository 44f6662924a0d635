"""Remote training on emulated links (issue 13): cubelake's loader vs per-sample reads, through one link.

One run starts ``moto_server`` in its own process on 127.0.0.1 (see ``bench/s3_lake.py``), writes
``--scenes`` synthetic HSI-like scenes (``bench/synth.py``, int16, ``--bands`` bands, ``--shape``
rows x cols, 256-tiled), ingests them with ``cubelake ingest --products cog,zarr`` into a local
lake and copies that lake to ``s3://rtbench/lake`` (``cubelake lake copy``). Several modest scenes
rather than one large one: moto reads the **whole object** on every GET, so one 600 MB COG would
cost ~375 ms of moto CPU per range request and measure moto, not the link.

Then, for each link preset (``LinkSpec.preset(p, ttfb_ms=40)``; the proxy,
``cubelake.linkemu.LinkEmulator``, runs on a thread of this process, in front of moto):

1. **cubelake**: a sliding-window epoch (``Sampling(size=32, stride=32)``, batches of 64, float32,
   in-process) over the S3 lake through the link, ``prefer=("cog",)`` and ``("zarr",)``, with
   ``ReaderConfig(threads=2)`` (the default), with the planner's recommended concurrency
   (``plan_capacity(ds, compute_s=..., link=<the emulated link>)``, measured on a short run of the
   same dataset) and, for the COG, with ``adaptive=True`` (AIMD from 2 up to 8). Recorded:
   samples/s, wall s, bytes fetched, requests, the emulator's bytes sent, link use = bytes sent /
   (wall x link rate), and the planner's epoch prediction for that setting (fill included).
2. **peers** through the same link: (a) rasterio, one ``src.read(window=...)`` per sample on the
   scenes' COGs over ``/vsis3/`` with GDAL's cloud settings, in this process; (b) the same
   per-sample read inside a map-style torch ``Dataset`` with ``DataLoader(batch_size=64,
   num_workers=2)`` (TorchGeo's ``RasterDataset`` access pattern; TorchGeo itself is not
   installed). Both read ``--peer-samples`` windows drawn at random from the epoch's windows and
   their rate is extrapolated to samples/s (the full epoch is not run), with a GDAL block cache of
   ``PEER_CACHE_MB`` (cubelake's resident set here): the regime of a lake much larger than memory,
   where a long random epoch keeps missing the cache (the rate of the second half is recorded to
   show it does not warm up).

Also: the same cubelake epochs from the **local** lake, and the **ceiling** (every chunk's stored
bytes already in memory, decoded and cast to float32 by the loader's own decoders on 2 threads);
a **consumer with compute** on the 200 Mbit/s link (``time.sleep(T_c)`` per batch, ``T_c`` chosen
so the planner predicts compute-bound and link-bound), stall measured by ``ds.timed``/``metrics``
and compared with the planner's prediction for the emulated link and for the probed link, and a
third run that follows the planner's advice for the fill (2 chunks per round); a **fault** epoch on
the 500 Mbit/s link (5 % of GETs failing: 503, 500, reset, truncate, and stall with a 5 s request
timeout), opening included, against a fault-free one, every batch hashed in order, and the same
faulty epoch with hedged requests (``hedge_after_s=1``).

    python bench/remote_training.py --json bench/results/remote_training.json          # 1 GiB raw
    python bench/remote_training.py --quick --json /tmp/rt_quick.json                  # 128 MiB, smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ingest_throughput import write_profile  # noqa: E402
from s3_lake import BATCH, BIN, CREDS, MB, WIN, MiB, Moto, ceiling  # noqa: E402

TTFB_MS = 40.0
PEER_CACHE_MB = 128
RATES = {"1gbps": 1000e6, "500mbps": 500e6, "200mbps": 200e6}


# -- data ---------------------------------------------------------------------------------------------


def make_scenes(a: argparse.Namespace) -> list[Path]:
    from synth import cached_scenes

    h, w = (int(v) for v in a.shape.split("x"))
    return cached_scenes(a.work / "scenes" / f"{h}x{w}x{a.bands}", "rt", a.scenes, height=h, width=w,
                         bands=a.bands, block=256, seed=2000)


def build_lakes(a: argparse.Namespace, moto: Moto, scenes: list[Path]) -> tuple[Path, str, dict[str, float]]:
    local = a.work / "lake"
    shutil.rmtree(local, ignore_errors=True)
    env = {**os.environ, **moto.env(), "CUBELAKE_STAGING": str(a.work / "staging"),
           "CUBELAKE_CACHE": str(a.work / "cache"), "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    (a.work / "staging").mkdir(exist_ok=True)  # `lake copy` does not create it (a traceback otherwise)
    profile = write_profile(a.work / "profile.yaml", 3)
    times = {}
    t0 = time.perf_counter()
    subprocess.run([str(BIN / "cubelake"), "-q", "ingest", *map(str, scenes), "--lake", str(local), "--profile",
                    str(profile), "--products", "cog,zarr", "--workers", "2"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    times["ingest_local_s"] = time.perf_counter() - t0
    moto.create_bucket("rtbench")
    url = "s3://rtbench/lake"
    t0 = time.perf_counter()
    subprocess.run([str(BIN / "cubelake"), "-q", "lake", "copy", str(local), url], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    times["copy_to_s3_s"] = time.perf_counter() - t0
    return local, url, times


def cog_keys(url: str, hits: list[Any], options: dict[str, str]) -> list[str]:
    """``/vsis3/`` paths of each scene's COG (in hit order)."""
    from cubelake.object_lake import ObjectLake

    ol = ObjectLake(url, create=False, options=options)
    out = []
    for h in hits:
        loc = ol.scene_location(h.id)
        assert loc is not None
        tifs = [o.key for o in ol.store.list(loc.split(f"{url}/", 1)[1]) if o.key.endswith(".tif")
                and "labels" not in o.key]
        out.append(f"/vsis3/rtbench/lake/{tifs[0]}")
    return out


class EmulatorProcess:
    """``cubelake link emulate`` in its own process (its Python does not share this process's GIL with the
    loader); ``stats`` only once it has stopped, so epochs through it measure link use by the loader's
    bytes fetched."""

    def __init__(self, upstream: str, preset: str, seed: int) -> None:
        from cubelake.linkemu import LinkSpec

        self.link = LinkSpec.preset(preset, ttfb_ms=TTFB_MS)
        self.proc = subprocess.Popen([str(BIN / "cubelake"), "link", "emulate", "--upstream", upstream, "--preset",
                                      preset, "--ttfb-ms", str(TTFB_MS), "--seed", str(seed), "--format", "json"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.endpoint = json.loads(self.proc.stdout.readline())["endpoint"]
        self.stats_at_stop: dict[str, Any] = {}

    def __enter__(self) -> EmulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        self.stats_at_stop = json.loads(out.strip().splitlines()[-1])["stats"]


# -- cubelake -----------------------------------------------------------------------------------------


def make_ds(hits: list[Any], lake: str, prefer: str, options: dict[str, Any] | None, threads: int,
            chunks_per_round: int = 8, **reader: Any) -> Any:
    """The benchmark's dataset; ``reader``: further ReaderConfig settings (adaptive, hedge_after_s)."""
    from cubelake.loaders import CubeDataset, PlanSpec, ReaderConfig, Sampling, Spectral

    return CubeDataset(hits, lake=lake, prefer=(prefer,), storage_options=options,  # type: ignore[arg-type]
                       sampling=Sampling(size=WIN, stride=WIN, labels="none"), spectral=Spectral(normalize="none"),
                       plan=PlanSpec(seed=0, batch_size=BATCH, chunks_per_round=chunks_per_round, order="local"),
                       reader=ReaderConfig(cache_bytes=1024 * MiB, threads=threads, **reader),
                       prefetch=max(chunks_per_round, threads))


def run_epoch(hits: list[Any], lake: str, prefer: str, options: dict[str, Any] | None, threads: int,
              emu: Any = None, moto: Moto | None = None, compute_s: float = 0.0, hashes: bool = False,
              link_rate: float = 0.0, **ds_kw: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    ds = make_ds(hits, lake, prefer, options, threads, **ds_kw)
    t_open = time.perf_counter() - t0
    s0 = emu.stats if emu is not None else None
    c0 = moto.cpu_s() if moto is not None else 0.0
    ds.set_epoch(0)
    n = 0
    digests = []
    waits = []  # the consumer's wait for each batch (ds.timed sums the same; the first one is the pipeline's fill)
    t1 = time.perf_counter()
    tw = t1
    for b in ds.timed(ds):
        waits.append(time.perf_counter() - tw)
        n += int(b["image"].shape[0])
        if hashes:
            digests.append(hashlib.sha256(b["image"].numpy().tobytes()).hexdigest())
        if compute_s:
            time.sleep(compute_s)
        tw = time.perf_counter()
    wall = time.perf_counter() - t1
    m = ds.metrics()
    r: dict[str, Any] = {"prefer": prefer, "threads": threads, "samples": n, "wall_s": wall, "open_s": t_open,
                         "samples_per_s": n / wall, "bytes_fetched": m.bytes_fetched, "requests": m.requests,
                         "retries": m.retries, "failed_chunks": m.failed_chunks, "dropped_samples": m.dropped_samples,
                         "throttled": m.throttled, "hedges": m.hedges, "hedge_wins": m.hedge_wins,
                         "inflight_peak": m.inflight_peak, "inflight_limit": m.inflight_limit,
                         "latency_ms": {q: m.latency_ms(q / 100) for q in (50, 95, 99)}, **ds_kw,
                         "wait_s": m.wait_s, "stall_fraction": m.stall_fraction, "compute_s": compute_s,
                         "first_batch_s": waits[0] if waits else None,
                         "stall_after_first": sum(waits[1:]) / max(wall - waits[0], 1e-9) if waits else None,
                         "samples_per_s_after_first": (n - BATCH) / max(wall - waits[0], 1e-9) if waits else None}
    if moto is not None:
        r["moto_cpu_s"] = moto.cpu_s() - c0
    if emu is not None:
        s1 = emu.stats
        r["link_bytes_sent"] = s1.bytes_sent - s0.bytes_sent
        r["link_requests"] = s1.requests - s0.requests
        r["link_faults"] = {k: s1.faults[k] - s0.faults[k] for k in s1.faults}
        rate = emu.link.bytes_per_s
        r["link_use"] = r["link_bytes_sent"] / (wall * rate) if rate else None
    elif link_rate:  # an emulator in its own process: the useful bytes the loader fetched
        r["link_use"] = m.bytes_fetched / (wall * link_rate)
    if hashes:
        r["batch_hashes"] = digests
        r["epoch_hash"] = hashlib.sha256("".join(digests).encode()).hexdigest()
    return r


def plan(hits: list[Any], url: str, prefer: str, options: dict[str, Any], link: Any, compute_s: float,
         batches: int, threads: int = 2, **ds_kw: Any) -> tuple[Any, Any]:
    from cubelake.loaders import plan_capacity

    ds = make_ds(hits, url, prefer, options, threads, **ds_kw)
    pred, work, _ = plan_capacity(ds, compute_s=compute_s, link=link, batches=batches)
    return pred, work


# -- peers ----------------------------------------------------------------------------------------------


def gdal_env(endpoint: str) -> dict[str, str]:
    return {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR", "CPL_VSIL_CURL_ALLOWED_EXTENSIONS": ".tif",
            "GDAL_HTTP_MULTIPLEX": "YES", "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES", "VSI_CACHE": "TRUE",
            # the block cache a per-sample reader has for a lake much larger than memory: what cubelake's
            # plan keeps resident here (8 chunks of 16 MiB); GDAL's default (5 % of RAM, 1.2 GB) would hold
            # this whole 1 GiB lake and turn a long per-sample run into a cached one (see BENCHMARKS.md)
            "GDAL_CACHEMAX": str(PEER_CACHE_MB),
            "AWS_S3_ENDPOINT": endpoint.split("://", 1)[1], "AWS_HTTPS": "NO", "AWS_VIRTUAL_HOSTING": "FALSE",
            "AWS_ACCESS_KEY_ID": CREDS["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": CREDS["AWS_SECRET_ACCESS_KEY"],
            "AWS_REGION": CREDS["AWS_REGION"]}


def peer_samples(hits: list[Any], h: int, w: int, n: int, seed: int) -> list[tuple[int, int, int]]:
    allw = [(s, r, c) for s in range(len(hits)) for r in range(0, h - WIN + 1, WIN) for c in range(0, w - WIN + 1, WIN)]
    random.Random(seed).shuffle(allw)
    return allw[:n]


class PerSample:
    """A map-style dataset reading one window per ``__getitem__`` (TorchGeo's RasterDataset access pattern)."""

    def __init__(self, paths: list[str], samples: list[tuple[int, int, int]], env: dict[str, str]) -> None:
        self.paths, self.samples, self.env = paths, samples, env
        self._open: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        import rasterio
        import torch
        from rasterio.windows import Window

        s, r, c = self.samples[i]
        if s not in self._open:
            self._open[s] = rasterio.open(self.paths[s])
        arr = self._open[s].read(window=Window(c, r, WIN, WIN))
        return torch.from_numpy(arr.astype(np.float32))


def _worker_ready(worker_id: int) -> None:
    with open(os.environ["RT_READY_FILE"], "a") as f:
        f.write(f"{time.time()}\n")


def run_peer(kind: str, paths: list[str], samples: list[tuple[int, int, int]], endpoint: str, emu: Any) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    # GDAL's settings as environment variables (rasterio.Env refuses AWS keys; workers inherit them);
    # AWS_ENDPOINT_URL (moto itself) is removed so that GDAL can only use AWS_S3_ENDPOINT, the link
    env = gdal_env(endpoint)
    saved = {k: os.environ.get(k) for k in [*env, "AWS_ENDPOINT_URL"]}
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.update(env)
    s0 = emu.stats
    ds = PerSample(paths, samples, env)
    n = 0
    stamps: list[tuple[float, int]] = []  # (time, samples so far): the rate of the second half shows no warm-up
    t0 = time.perf_counter()
    try:
        if kind == "rasterio":
            for i in range(len(ds)):
                n += int(ds[i].shape[0] > 0)
                stamps.append((time.perf_counter(), n))
            for src in ds._open.values():
                src.close()
        else:
            # spawn: a forked worker inherits the parent's GDAL/curl state and read corrupt tiles here
            ready = Path(os.environ["CUBELAKE_CACHE"]) / "rt_ready.txt"
            ready.unlink(missing_ok=True)
            os.environ["RT_READY_FILE"] = str(ready)
            loader = DataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context="spawn",
                                worker_init_fn=_worker_ready)
            for b in loader:
                assert isinstance(b, torch.Tensor)
                n += int(b.shape[0])
                stamps.append((time.perf_counter(), n))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    wall = time.perf_counter() - t0
    s1 = emu.stats
    startup = 0.0
    if kind != "rasterio":  # workers' start-up (spawn, imports) is not the access pattern's cost: left out
        startup = max(float(x) for x in ready.read_text().split()) - (time.time() - wall)
    half = next(((t, k) for t, k in stamps if k >= n // 2), stamps[0])
    second_half = (n - half[1]) / max(stamps[-1][0] - half[0], 1e-9) if n - half[1] > 0 else float("nan")
    return {"kind": kind, "samples": n, "wall_s": wall, "startup_s": startup, "samples_per_s": n / (wall - startup),
            "samples_per_s_second_half": second_half, "gdal_cachemax_mb": PEER_CACHE_MB,
            "samples_per_s_incl_startup": n / wall,
            "link_bytes_sent": s1.bytes_sent - s0.bytes_sent, "link_requests": s1.requests - s0.requests,
            "extrapolated": True}


# -- the run -----------------------------------------------------------------------------------------


def pred_dict(p: Any) -> dict[str, Any]:
    d = p.to_dict()
    return {k: d[k] for k in ("concurrency", "samples_per_s", "stall_fraction", "load_s", "fetch_s", "decode_s",
                              "compute_s", "binding", "recommended_concurrency", "bandwidth_ok", "explanation",
                              "fill_s", "epoch_s", "epoch_samples_per_s", "epoch_stall_fraction")}


def err(measured: float, predicted: float) -> float:
    return 100.0 * (measured - predicted) / predicted if predicted else float("nan")


def part_links(a: argparse.Namespace, moto: Moto, hits: list[Any], url: str, cogs: list[str],
               h: int, w: int, doc: dict[str, Any]) -> None:
    from cubelake.linkemu import LinkEmulator, LinkSpec
    from cubelake.loaders import Link, predict

    doc["links"] = {}
    samples = peer_samples(hits, h, w, a.peer_samples, a.seed)
    for preset in a.links.split(","):
        spec = LinkSpec.preset(preset, ttfb_ms=TTFB_MS)
        link = Link(bandwidth_bps=RATES[preset], ttfb_s=TTFB_MS / 1000)
        out: dict[str, Any] = {"cubelake": [], "peers": []}
        in_process = a.emulator == "thread"
        with (LinkEmulator(moto.endpoint, link=spec, seed=a.seed) if in_process
              else EmulatorProcess(moto.endpoint, preset, a.seed)) as emu:
            opts = {**moto.options(), "endpoint_url": emu.endpoint}
            print(f"\n[{preset}] {spec.describe()} via {emu.endpoint} ({a.emulator})", flush=True)
            for prefer in ("cog", "zarr"):
                pred, work = plan(hits, url, prefer, opts, link, 1e-3, a.plan_batches)
                c_rec = pred.recommended_concurrency
                print(f"  planner ({prefer}): {work.bytes_per_sample / 1e3:.0f} kB/sample, request "
                      f"{work.request_bytes / MB:.1f} MB, decode {work.decode_bytes_per_s / MB:.0f} MB/s -> "
                      f"recommended concurrency {c_rec}", flush=True)
                runs: list[tuple[int, dict[str, Any]]] = [(t, {}) for t in sorted({2, c_rec})]
                if prefer == "cog":  # the AIMD controller finding the concurrency itself, from 2 up to 8
                    runs.append((2, {"adaptive": True, "max_threads": 8}))
                for threads, kw in runs:
                    r = run_epoch(hits, url, prefer, opts, threads, emu=emu if in_process else None, moto=moto,
                                  link_rate=RATES[preset] / 8, **kw)
                    p = predict(link, work, r["inflight_limit"] if kw else threads, cache_budget_bytes=1024 * MiB)
                    r["predicted"] = pred_dict(p)
                    r["workload"] = dataclasses.asdict(work)
                    r["recommended"] = threads == c_rec and not kw
                    out["cubelake"].append(r)
                    how = f"AIMD->{r['inflight_limit']:>2}" if kw else f"threads {threads:>2}"
                    print(f"  cubelake {prefer:<4} {how}: {r['samples_per_s']:7.0f} samples/s "
                          f"(predicted {p.epoch_samples_per_s:6.0f}, {p.binding}), {r['wall_s']:.1f} s, "
                          f"{r['bytes_fetched'] / MB:.0f} MB in {r['requests']} requests, link use "
                          f"{r['link_use']:.0%}, moto CPU {r['moto_cpu_s']:.1f} s", flush=True)
            for kind in () if "peers" in a.skip.split(",") else ("rasterio", "torch_dataloader_2w"):
                r = run_peer(kind, cogs, samples, emu.endpoint, emu)
                out["peers"].append(r)
                print(f"  peer {kind:<20}: {r['samples_per_s']:7.1f} samples/s (second half "
                      f"{r['samples_per_s_second_half']:.1f}; {r['samples']} samples in "
                      f"{r['wall_s']:.1f} s, {r['link_requests']} requests, {r['link_bytes_sent'] / MB:.0f} MB)",
                      flush=True)
        best = max((r for r in out["cubelake"] if r["prefer"] == "cog" and not r.get("adaptive")),
                   key=lambda r: r["samples_per_s"])
        if out["peers"]:
            out["ratio_vs_rasterio"] = best["samples_per_s"] / out["peers"][0]["samples_per_s"]
            out["ratio_vs_torch"] = best["samples_per_s"] / out["peers"][1]["samples_per_s"]
        doc["links"][preset] = out


def part_local(a: argparse.Namespace, hits: list[Any], local: Path, doc: dict[str, Any]) -> None:
    doc["local"] = {}
    print("\n[local]", flush=True)
    for prefer in ("cog", "zarr"):
        eps = [run_epoch(hits, str(local), prefer, None, 2) for _ in range(a.local_epochs)]
        ceil = ceiling(hits, str(local), prefer)
        doc["local"][prefer] = {"epochs": eps, "samples_per_s": max(x["samples_per_s"] for x in eps), "ceiling": ceil}
        print(f"  cubelake {prefer} local: " + ", ".join(f"{x['samples_per_s']:.0f}" for x in eps) +
              f" samples/s; ceiling (decode+cast, 2 threads) {ceil['samples_per_s']:.0f} samples/s", flush=True)


def part_compute(a: argparse.Namespace, moto: Moto, hits: list[Any], url: str, doc: dict[str, Any]) -> None:
    from cubelake.linkemu import LinkEmulator, LinkSpec
    from cubelake.loaders import Link, plan_capacity, predict

    preset = "200mbps"
    link = Link(bandwidth_bps=RATES[preset], ttfb_s=TTFB_MS / 1000)
    out: dict[str, Any] = {"link": preset, "runs": []}
    with LinkEmulator(moto.endpoint, link=LinkSpec.preset(preset, ttfb_ms=TTFB_MS), seed=a.seed) as emu:
        opts = {**moto.options(), "endpoint_url": emu.endpoint}
        print(f"\n[compute] {preset}", flush=True)
        pred0, work0 = plan(hits, url, "cog", opts, link, 1e-3, a.plan_batches)
        c = pred0.recommended_concurrency
        # the probed link: plan_capacity without a link measures the workload again and probes the store
        ds = make_ds(hits, url, "cog", opts, c)
        _, work_p, probed = plan_capacity(ds, compute_s=1e-3, batches=a.plan_batches)
        out["probed_link"] = {"bandwidth_bps": probed.bandwidth_bps, "ttfb_s": probed.ttfb_s}
        td = predict(link, work0, c).load_s
        # the third run follows the planner's advice for the first one (its fill is part of the stall):
        # fewer chunks per round, measured again for that plan
        _, work_k2 = plan(hits, url, "cog", opts, link, 1e-3, a.plan_batches, threads=c, chunks_per_round=2)
        out["predicted_T_d_s"] = td
        out["workload"] = dataclasses.asdict(work0)
        out["workload_2_chunks_per_round"] = dataclasses.asdict(work_k2)
        print(f"  concurrency {c}; predicted T_d {td * 1000:.0f} ms/batch; probed link "
              f"{probed.bandwidth_bps / 1e6:.0f} Mbit/s, TTFB {probed.ttfb_s * 1000:.1f} ms", flush=True)
        for label, tc, cpr, w0, wp in (("compute-bound", 1.5 * td, 8, work0, work_p),
                                        ("link-bound", 0.5 * td, 8, work0, work_p),
                                        ("compute-bound, 2 chunks/round", 1.5 * td, 2, work_k2, None)):
            pe = predict(link, dataclasses.replace(w0, compute_s=tc), c)
            pp = predict(probed, dataclasses.replace(wp or w0, compute_s=tc), c)
            r = run_epoch(hits, url, "cog", opts, c, emu=emu, moto=moto, compute_s=tc, chunks_per_round=cpr)
            r.update(label=label, predicted_emulated=pred_dict(pe), predicted_probed=pred_dict(pp),
                     err_sps_emulated_pct=err(r["samples_per_s"], pe.epoch_samples_per_s),
                     err_sps_probed_pct=err(r["samples_per_s"], pp.epoch_samples_per_s),
                     err_stall_emulated_pp=100 * (r["stall_fraction"] - pe.epoch_stall_fraction))
            out["runs"].append(r)
            print(f"  {label:<14} T_c {tc * 1000:4.0f} ms: {r['samples_per_s']:5.0f} samples/s, stall "
                  f"{r['stall_fraction']:.1%} (after the first batch: {r['samples_per_s_after_first']:.0f}/s, "
                  f"{r['stall_after_first']:.1%}; first batch {r['first_batch_s']:.2f} s) | predicted (emulated link) "
                  f"{pe.epoch_samples_per_s:5.0f}/s stall {pe.epoch_stall_fraction:.1%}, fill {pe.fill_s:.2f} s "
                  f"({pe.binding}) [{r['err_sps_emulated_pct']:+.0f} %] | (probed) "
                  f"{pp.epoch_samples_per_s:5.0f}/s stall {pp.epoch_stall_fraction:.1%} [{r['err_sps_probed_pct']:+.0f} %]",
                  flush=True)
    doc["compute"] = out


def part_faults(a: argparse.Namespace, moto: Moto, hits: list[Any], url: str, doc: dict[str, Any]) -> None:
    from cubelake.linkemu import FaultSpec, LinkEmulator, LinkSpec

    preset = "500mbps"
    kinds = "503,500,reset,truncate,stall"
    out: dict[str, Any] = {"link": preset, "kinds": kinds, "rate": 0.05, "request_timeout_s": 5.0}
    print(f"\n[faults] {preset}, 5 % of GETs: {kinds} (request timeout 5 s)", flush=True)
    for prefer in ("cog", "zarr"):
        res = {}
        faulty = FaultSpec(rate=0.05, kinds=kinds, stall_s=30.0)
        for label, faults, kw in (("clean", FaultSpec(), {}), ("faulty", faulty, {}),
                                  ("faulty_hedged", faulty, {"hedge_after_s": 1.0})):
            with LinkEmulator(moto.endpoint, link=LinkSpec.preset(preset, ttfb_ms=TTFB_MS), faults=faults,
                              seed=a.seed) as emu:
                opts = {**moto.options(), "endpoint_url": emu.endpoint, "request_timeout_s": 5.0}
                t0 = time.perf_counter()
                try:
                    r = run_epoch(hits, url, prefer, opts, a.fault_threads, emu=emu, moto=moto, hashes=True, **kw)
                except Exception as exc:  # a failure to open or read is a result here, not the end of the run
                    st = emu.stats
                    r = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}", "batch_hashes": None,
                         "after_s": time.perf_counter() - t0, "link_requests": st.requests, "link_faults": dict(st.faults),
                         "samples_per_s": 0.0, "samples": 0, "retries": None, "failed_chunks": None}
                    print(f"  {prefer:<4} {label:<6}: FAILED after {r['after_s']:.1f} s: {r['error']}", flush=True)
                    res[label] = r
                    continue
                r["link_faults_total"] = sum(r["link_faults"].values())
                res[label] = r
                print(f"  {prefer:<4} {label:<13}: {r['samples_per_s']:5.0f} samples/s, {r['wall_s']:.1f} s (open "
                      f"{r['open_s']:.1f} s), {r['samples']} samples, link requests {r['link_requests']}, faults "
                      f"{r['link_faults']}, loader retries {r['retries']}, hedges {r['hedges']} ({r['hedge_wins']} "
                      f"won), failed chunks {r['failed_chunks']}", flush=True)
        res["byte_identical"] = res["clean"]["batch_hashes"] == res["faulty"]["batch_hashes"]
        res["byte_identical_hedged"] = res["clean"]["batch_hashes"] == res["faulty_hedged"]["batch_hashes"]
        for k in ("clean", "faulty", "faulty_hedged"):
            res[k].pop("batch_hashes")
        print(f"  {prefer:<4} batches byte-identical: {res['byte_identical']} (hedged: {res['byte_identical_hedged']})",
              flush=True)
        out[prefer] = res
    out["byte_identical"] = all(out[p]["byte_identical"] and out[p]["byte_identical_hedged"] for p in ("cog", "zarr"))
    out["stall_s"] = 30.0
    doc["faults"] = out


# -- report --------------------------------------------------------------------------------------------


def targets(doc: dict[str, Any]) -> dict[str, Any]:
    t: dict[str, Any] = {}
    local_sps = {p: doc["local"][p]["samples_per_s"] for p in doc.get("local", {})}
    rows = []
    for preset, out in doc.get("links", {}).items():
        for r in out["cubelake"]:
            if not r["recommended"]:
                continue
            p = r["predicted"]
            link_ok = p["binding"] in ("compute", "decode")
            row = {"link": preset, "prefer": r["prefer"], "binding": p["binding"],
                   "pred_err_pct": err(r["samples_per_s"], p["epoch_samples_per_s"])}
            if link_ok and r["prefer"] in local_sps:
                row["of_local"] = r["samples_per_s"] / local_sps[r["prefer"]]
                row["met_90pct_local"] = row["of_local"] >= 0.9
            else:
                row["link_use"] = r["link_use"]
                row["met_90pct_link"] = r["link_use"] >= 0.9
            rows.append(row)
        if out["peers"]:
            t[f"ratio_vs_rasterio_{preset}"] = out["ratio_vs_rasterio"]
            t[f"ratio_vs_torch_{preset}"] = out["ratio_vs_torch"]
    t["per_link"] = rows
    if "compute" in doc:
        cb = doc["compute"]["runs"][0]
        t["stall_compute_bound"] = cb["stall_fraction"]
        t["stall_compute_bound_after_first_batch"] = cb["stall_after_first"]
        t["met_stall_5pct"] = cb["stall_fraction"] <= 0.05
        t["prediction_errors_pct"] = {r["label"]: {"emulated": r["err_sps_emulated_pct"],
                                                   "probed": r["err_sps_probed_pct"],
                                                   "stall_pp_emulated": r["err_stall_emulated_pp"]}
                                      for r in doc["compute"]["runs"]}
        k2 = doc["compute"]["runs"][-1]
        t["stall_compute_bound_2_chunks_per_round"] = k2["stall_fraction"]
        t["met_stall_5pct_after_advice"] = k2["stall_fraction"] <= 0.05
    if "faults" in doc:
        t["fault_epoch_byte_identical"] = doc["faults"]["byte_identical"]
    return t


def print_summary(doc: dict[str, Any]) -> None:
    print("\n== summary (samples/s; 32x32 windows, all bands, float32, batches of 64)")
    print(f"{'link':<9}{'product':<6}{'thr':>4}{'samples/s':>11}{'predicted':>11}{'binding':>11}{'wall s':>8}"
          f"{'MB':>7}{'req':>6}{'link use':>10}")
    for preset, out in doc.get("links", {}).items():
        for r in out["cubelake"]:
            thr = f"A{r['inflight_limit']}" if r.get("adaptive") else str(r["threads"])
            print(f"{preset:<9}{r['prefer']:<6}{thr:>4}{r['samples_per_s']:>11.0f}"
                  f"{r['predicted']['epoch_samples_per_s']:>11.0f}{r['predicted']['binding']:>11}{r['wall_s']:>8.1f}"
                  f"{r['bytes_fetched'] / MB:>7.0f}{r['requests']:>6}{r['link_use']:>10.0%}")
        for r in out["peers"]:
            print(f"{preset:<9}{'peer':<6}{'':>4}{r['samples_per_s']:>11.1f}{'':>11}{r['kind']:>22}  "
                  f"({r['samples']} samples, extrapolated)")
        if out["peers"]:
            print(f"{'':<9}cubelake / rasterio {out['ratio_vs_rasterio']:.1f}x, / torch 2 workers "
                  f"{out['ratio_vs_torch']:.1f}x")
    for p, v in doc.get("local", {}).items():
        print(f"{'local':<9}{p:<6}{2:>4}{v['samples_per_s']:>11.0f}   ceiling {v['ceiling']['samples_per_s']:.0f}")
    print("\n== targets")
    print(json.dumps(doc.get("targets", {}), indent=1, default=float))


def _save(fig: Any, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def plots(doc: dict[str, Any], out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        print("matplotlib is not installed: no plots", flush=True)
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    links = list(doc.get("links", {}))
    mbps = [RATES[p] / 1e6 for p in links]
    fig, ax = plt.subplots(figsize=(6, 4))
    for prefer, mk in (("cog", "o"), ("zarr", "s")):
        for rec, ls in ((True, "-"), (False, ":")):
            rows = [next((r for r in doc["links"][p]["cubelake"] if r["prefer"] == prefer and r["recommended"] == rec
                         and not r.get("adaptive")),
                         None) for p in links]
            if any(r is None for r in rows):
                continue
            lab = f"{prefer}, {'planner concurrency' if rec else '2 threads'}"
            ax.plot(mbps, [r["samples_per_s"] for r in rows], ls, marker=mk, label=f"{lab} (measured)")
            ax.plot(mbps, [r["predicted"]["epoch_samples_per_s"] for r in rows], ls, marker=mk, alpha=0.35,
                    label=f"{lab} (predicted)")
    adaptive = [next((r for r in doc["links"][p]["cubelake"] if r.get("adaptive")), None) for p in links]
    if all(r is not None for r in adaptive):
        ax.plot(mbps, [r["samples_per_s"] for r in adaptive], "-.", marker="^", label="cog, AIMD (measured)")
    if all(doc["links"][p]["peers"] for p in links):
        ax.plot(mbps, [doc["links"][p]["peers"][0]["samples_per_s"] for p in links], "--", marker="x", color="k",
                label="rasterio per sample")
    for p in doc.get("local", {}):
        ax.axhline(doc["local"][p]["samples_per_s"], color="grey", lw=0.8, ls="-.")
    ax.set_xlabel("link bandwidth (Mbit/s), TTFB 40 ms")
    ax.set_ylabel("samples/s")
    ax.set_yscale("log")
    ax.set_title("Sliding-window epoch over an emulated link (grey: local)")
    ax.legend(fontsize=6)
    files.append(_save(fig, out_dir / "remote_training_throughput.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    labels, busy, stall = [], [], []
    for p in links:
        for r in doc["links"][p]["cubelake"]:
            if r["recommended"]:
                labels.append(f"{p}\n{r['prefer']}")
                busy.append(1 - r["stall_fraction"])
                stall.append(r["stall_fraction"])
    for r in doc.get("compute", {}).get("runs", []):
        labels.append(f"200mbps cog\n+T_c {r['compute_s'] * 1000:.0f} ms")
        busy.append(1 - r["stall_fraction"])
        stall.append(r["stall_fraction"])
    x = np.arange(len(labels))
    ax.bar(x, busy, label="consumer busy (cutting + compute)")
    ax.bar(x, stall, bottom=busy, label="consumer waiting (stall)")
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_ylabel("share of epoch wall time")
    ax.set_title("Stall breakdown per link (planner concurrency)")
    ax.legend(fontsize=7)
    files.append(_save(fig, out_dir / "remote_training_stall.png"))
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one 128 MiB scene, 100 peer samples (smoke run)")
    ap.add_argument("--scenes", type=int, default=8)
    ap.add_argument("--shape", default="512x1024", help="rows x cols of each scene (default 8 x 128 MiB = 1 GiB raw)")
    ap.add_argument("--bands", type=int, default=128)
    ap.add_argument("--links", default="1gbps,500mbps,200mbps")
    ap.add_argument("--peer-samples", type=int, default=200)
    ap.add_argument("--plan-batches", type=int, default=16)
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--fault-threads", type=int, default=0, help="threads of the fault epochs (0: the planner's)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: links,peers,compute,faults,local")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--emulator", choices=("thread", "process"), default="thread",
                    help="the link emulator of the links part on a thread of this process, or in its own process")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cubelake_remote_training"))
    ap.add_argument("--out", type=Path, default=HERE / "results", help="folder for the plots")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.emulator == "process" and "peers" not in a.skip.split(","):
        ap.error("--emulator process counts link bytes by the loader's own figures: run it with --skip ...,peers")
    if a.quick:
        a.scenes, a.peer_samples, a.plan_batches, a.local_epochs = 1, 100, 4, 1
    a.work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    h, w = (int(v) for v in a.shape.split("x"))
    doc: dict[str, Any] = {"args": {k: str(v) for k, v in vars(a).items()},
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    scenes = make_scenes(a)
    raw = len(scenes) * a.bands * h * w * 2
    print(f"{len(scenes)} scenes of {a.bands}x{h}x{w} int16 = {raw / MiB:.0f} MiB raw", flush=True)
    moto = Moto(a.work / "moto_server.log")
    os.environ.update(moto.env())
    os.environ["CUBELAKE_CACHE"] = str(a.work / "cache")
    try:
        local, url, times = build_lakes(a, moto, scenes)
        doc["setup"] = {**times, "raw_bytes": raw, "scenes": len(scenes), "shape": [a.bands, h, w]}
        print(f"ingest (local) {times['ingest_local_s']:.1f} s, copy to S3 {times['copy_to_s3_s']:.1f} s", flush=True)
        from cubelake.catalog import LakeCatalog, Query

        with LakeCatalog(url) as c:
            hits = sorted(c.search(Query()), key=lambda x: x.id)
        with LakeCatalog(local) as c:
            hits_local = sorted(c.search(Query()), key=lambda x: x.id)
        cogs = cog_keys(url, hits, moto.options())
        doc["setup"]["cog_objects"] = cogs
        skip = set(filter(None, a.skip.split(",")))
        if "local" not in skip:
            part_local(a, hits_local, local, doc)
        if "links" not in skip:
            part_links(a, moto, hits, url, cogs, h, w, doc)
        else:
            doc["links"] = {}
        if a.fault_threads == 0:
            r = next((x for x in doc["links"].get("500mbps", {}).get("cubelake", []) if x["recommended"]), None)
            a.fault_threads = r["threads"] if r else 8
        if "compute" not in skip:
            part_compute(a, moto, hits, url, doc)
        if "faults" not in skip:
            part_faults(a, moto, hits, url, doc)
        doc["moto"] = {"cpu_s": moto.cpu_s(), "peak_rss_mib": moto.peak_rss / MiB}
    finally:
        moto.stop()
    doc["targets"] = targets(doc)
    doc["plots"] = plots(doc, a.out)
    import obstore
    import rasterio
    import torch

    import cubelake

    doc["env"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "cubelake": cubelake.__version__,
                  "torch": torch.__version__, "rasterio": rasterio.__version__, "gdal": rasterio.__gdal_version__,
                  "obstore": obstore.__version__, "loadavg_end": os.getloadavg()}
    with contextlib.suppress(Exception):
        doc["env"]["commit"] = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                                              capture_output=True, text=True).stdout.strip()
    doc["total_s"] = time.perf_counter() - t_all
    print_summary(doc)
    print(f"total {doc['total_s']:.0f} s; plots: {', '.join(doc['plots']) or 'none'}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
