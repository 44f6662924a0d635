"""Geo-aware loading on a synthetic world lake: geohash shards against today's strips, region balance, areas.

**The lake** (default 72 scenes: 3 cities x 20 + 12 scattered). ``--cities`` hot cities (Berlin,
Lagos, Sao Paulo, ...) each hold ``--per-city`` overlapping scenes (centres jittered by ``--jitter-m``, normal, in UTM metres), and ``--sparse``
single scenes lie scattered over the world (seeded, >= 50 km apart). Every scene is a synthetic
HSI-like GeoTIFF (``bench/synth.py``; ``--size`` x ``--size`` pixels, ``--bands`` int16 bands, 30 m)
in the UTM zone of its centre, ingested with ``cubelake.ingest.ingest(products=("zarr",), chunk=64)``
so the catalog holds every footprint. The lake is kept in ``--workdir`` and reused while its
parameters match (``--fresh`` rebuilds it). Samples: 32 x 32 windows every 16 pixels, all bands,
batches of 64, float32, ``Spectral(normalize="none")``, Zarr product.

**Sharding** (``--world`` simulated ranks, ``--epochs`` epochs). Four set-ups: ``PlanSpec(shard_by=
"strips")`` (today: scenes, or strips of scenes, balanced by sample count, reassigned per epoch by a
seeded permutation) and ``PlanSpec(shard_by="geohash", geohash_precision=6)``, each without and with
``RegionBalance(precision=6, downsample=True, alpha=0.5)``. Every rank runs in its own spawned
process, one after another (a 2-core machine cannot run four ranks side by side without them
timing each other; set-ups interleaved: rank 0 of each, then rank 1 of each, ...), as ``CubeDataset(..., rank=r, world_size=W, disk_cache=<its own folder>)``
iterated through ``DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=False)``:
each epoch forks a fresh worker, so decoded chunks do not survive an epoch in memory (as with
PyTorch's default non-persistent workers) and only the rank's disk cache carries bytes across
epochs. Per rank and epoch: ``LoaderMetrics`` bytes_fetched (bytes read from the lake, not from
the disk cache), chunks_decoded, disk hits, the epoch's wall time around the loop (worker start
included), and the windows served. From the plans (pure, in this process): ``shard_report``
(samples and chunks per rank, chunks and cells more than one rank reads, max/min samples), each
rank's chunk set per epoch and over the run, and the bytes each rank should fetch (the stored size
of the chunks its plan needs that it did not read in an earlier epoch), checked against the
measured bytes_fetched. ``--precisions``: epoch 0's split at other geohash precisions (pure), and
the cells of that precision. Served windows are checked: no window is served by two ranks, each rank serves
its plan's count, and one window per rank and epoch equals the Zarr product's pixels.

**Region balance** (pure, from ``ds.epoch_table(e)``): samples per epoch before/after downsampling;
hot cells (a hot-city scene has a window centred in them) against sparse cells (only scattered
scenes): median samples per cell and per km^2 (the 20:1 check), kept fraction against
``1 / (1 + log1p(n))``, mean loss weight against ``1 + alpha * (1 - n / max n)``.

**Area of interest.** ``CubeDataset.from_search(lake, bbox=<square of side --aoi-km on the first
city>)`` for each side, against the largest square's catalog hits whole (``CubeDataset(hits,
lake=lake)``, no area); in-process, 2 decode threads, a new dataset for each of ``--repeats``
epochs (median reported), the kinds alternating, all in one spawned process. Ceiling: the same chunks' stored bytes read into memory, then blosc-decoded with
numcodecs straight into a reused buffer and cast to float32 (``np.copyto``), on 2 threads, best of
3: what this machine can do for the bytes each epoch reads. The loader's epoch time is given as a
multiple of it.

The page cache is warm for every run (every lake file is read before the timed runs): "bytes
fetched" are bytes the loader read from the lake's files, which a real deployment reads from
object storage.

    .venv/bin/python bench/geo.py --json bench/results/geo.json   # ~4.5 min on 2 cores, ~3.5 min with the lake cached
    .venv/bin/python bench/geo.py --quick                         # smoke check, 16 scenes: ~1 min
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules

from common import isolated  # noqa: E402

WIN, STRIDE, CHUNK, GSD, BATCH = 32, 16, 64, 30.0, 64
PRECISION = 6
ALPHA = 0.5
MB = 1e6
LAKE_VERSION = 1
CITIES = (("berlin", 13.405, 52.520), ("lagos", 3.379, 6.524), ("saopaulo", -46.633, -23.550),
          ("delhi", 77.209, 28.614), ("chicago", -87.630, 41.878))


# -- the synthetic world ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """One scene: its name (the scene id), centre (degrees), jitter (m), and whether it is a hot-city scene."""

    name: str
    lon: float
    lat: float
    dx_m: float
    dy_m: float
    city: str | None


def _km_between(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 12742.0 * math.asin(min(1.0, math.sqrt(a)))


def place_scenes(cities: int, per_city: int, sparse: int, jitter_m: float, seed: int) -> list[Placement]:
    """Hot scenes around the first ``cities`` city centres, and ``sparse`` scattered ones (>= 50 km from all)."""
    if not 0 <= cities <= len(CITIES):
        raise ValueError(f"--cities must be 0..{len(CITIES)}, got {cities}")
    rng = np.random.default_rng(seed)
    out = []
    for name, lon, lat in CITIES[:cities]:
        for i in range(per_city):
            dx, dy = rng.normal(0, jitter_m, 2) if i else (0.0, 0.0)
            out.append(Placement(f"hot_{name}_{i:02d}", lon, lat, float(dx), float(dy), name))
    taken = [(lon, lat) for _, lon, lat in CITIES[:cities]]
    while len(out) < cities * per_city + sparse:
        lon, lat = float(rng.uniform(-170, 170)), float(rng.uniform(-55, 62))
        if all(_km_between(lon, lat, a, b) > 50 for a, b in taken):
            taken.append((lon, lat))
            out.append(Placement(f"sparse_{len(out) - cities * per_city:03d}", lon, lat, 0.0, 0.0, None))
    return out


def utm_epsg(lon: float, lat: float) -> int:
    """The WGS84 UTM zone of a point (EPSG:326zz north, 327zz south)."""
    return (32600 if lat >= 0 else 32700) + int((lon + 180) // 6) % 60 + 1


def write_placed(path: Path, p: Placement, size: int, bands: int, seed: int) -> None:
    """A synthetic scene (``synth.write_scene``) moved to ``p``: its UTM CRS, 30 m pixels, centred on the jittered point."""
    import rasterio
    from pyproj import Transformer
    from rasterio.transform import from_origin
    from synth import write_scene

    tmp = path.with_suffix(".partial.tif")
    write_scene(tmp, height=size, width=size, bands=bands, block=min(size, 256), seed=seed)
    epsg = utm_epsg(p.lon, p.lat)
    x, y = Transformer.from_crs("EPSG:4326", f"EPSG:{epsg}", always_xy=True).transform(p.lon, p.lat)
    half = size / 2 * GSD
    with rasterio.open(tmp, "r+") as ds:
        ds.crs = f"EPSG:{epsg}"
        ds.transform = from_origin(x + p.dx_m - half, y + p.dy_m + half, GSD, GSD)
    tmp.rename(path)


def ensure_lake(work: Path, places: list[Placement], size: int, bands: int, fresh: bool) -> tuple[Path, dict[str, Any]]:
    """The lake of ``places`` in ``work/lake``: reused when built with the same parameters, else written and ingested."""
    lake, src = work / "lake", work / "src"
    params = {"version": LAKE_VERSION, "size": size, "bands": bands, "chunk": CHUNK, "gsd": GSD,
              "places": [asdict(p) for p in places]}
    marker = lake / "bench_geo_params.json"
    if not fresh and marker.is_file() and json.loads(marker.read_text()) == params:
        print(f"reusing {lake} ({len(places)} scenes)", flush=True)
        return lake, {"reused": True}
    shutil.rmtree(lake, ignore_errors=True)
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    print(f"writing {len(places)} scenes of {bands}x{size}x{size} int16 into {src} ...", flush=True)
    t0 = time.perf_counter()
    paths = []
    for i, p in enumerate(places):
        paths.append(src / f"{p.name}.tif")
        write_placed(paths[-1], p, size, bands, seed=1000 + i)
    t_write = time.perf_counter() - t0
    from cubelake.ingest import IngestOptions, ingest
    from cubelake.ingest.profile import SensorProfile

    profile = SensorProfile.model_validate({"name": "bench", "products": {"chunk": CHUNK, "level": 3},
                                            "bad_bands": {"wavelength_windows_nm": []}})
    print(f"ingesting into {lake} (zarr, chunk {CHUNK}) ...", flush=True)
    t0 = time.perf_counter()
    res = ingest(paths, lake, IngestOptions(products=("zarr",), chunk=CHUNK, profile=profile, workers=2))
    bad = [(r.path, r.outcome, r.message) for r in res if r.outcome.value != "ingested"]
    if bad or len(res) != len(places):
        raise RuntimeError(f"ingest failed for {len(bad)} of {len(places)} scenes: {bad[:3]}")
    t_ingest = time.perf_counter() - t0
    marker.write_text(json.dumps(params))
    print(f"  written in {t_write:.1f} s, ingested in {t_ingest:.1f} s", flush=True)
    return lake, {"reused": False, "write_s": t_write, "ingest_s": t_ingest}


def scene_folders(lake: Path, places: list[Placement]) -> list[str]:
    return [str(lake / "scenes" / p.name) for p in places]


def warm_page_cache(root: Path) -> int:
    n = 0
    for f in sorted(x for x in root.rglob("*") if x.is_file()):
        n += len(f.read_bytes())
    return n


def tree_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.exists() else 0


def busy_cpu_seconds() -> float:
    """Non-idle CPU seconds of the whole machine since boot (as bench/ingest_throughput.py counts them)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (a DataLoader worker once the epoch ends)."""
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


# -- child processes --------------------------------------------------------------------------------


def make_dataset(scenes: Sequence[str], shard_by: str, balance: bool, seed: int, **kw: Any) -> Any:
    """The benchmark's dataset: 32 x 32 windows every 16 px, batches of 64, raw values, Zarr."""
    from cubelake.loaders import CubeDataset, PlanSpec, RegionBalance, Sampling, Spectral

    return CubeDataset(list(scenes), sampling=Sampling(size=WIN, stride=STRIDE, labels="none"),
                       spectral=Spectral(normalize="none"), prefer=("zarr",),
                       plan=PlanSpec(seed=seed, batch_size=BATCH, shard_by=shard_by, geohash_precision=PRECISION),
                       balance=RegionBalance(precision=PRECISION, downsample=True, alpha=ALPHA) if balance else None,
                       **kw)


def _check_window(ds: Any, batch: dict[str, Any]) -> bool:
    """The batch's first window equals the Zarr product's pixels (as float32)."""
    import zarr

    sid = batch["scene"][0]
    r, c, h, w = (int(v) for v in batch["window"][0].tolist())
    src = next(s for s in ds.sources if s.scene_id == sid)
    arr: Any = zarr.open_group(src.url, mode="r")["data"]
    want = np.asarray(arr[:, r:r + h, c:c + w]).astype(np.float32)
    return bool(np.array_equal(batch["image"][0].numpy(), want))


def run_rank(scenes: list[str], shard_by: str, balance: bool, rank: int, world: int, epochs: int, cache_dir: str,
             seed: int) -> dict[str, Any]:
    """One simulated rank: ``epochs`` epochs, each through a fresh (forked) DataLoader worker, one disk cache."""
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    ds = make_dataset(scenes, shard_by, balance, seed, rank=rank, world_size=world, disk_cache=cache_dir)
    out: dict[str, Any] = {"open_s": time.perf_counter() - t0, "epochs": []}
    index = {s.scene_id: i for i, s in enumerate(ds.sources)}
    for e in range(epochs):
        ds.set_epoch(e)
        loader = DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=False,
                            multiprocessing_context="fork")
        served: list[np.ndarray] = []
        ok = None
        b0, c0 = busy_cpu_seconds(), own_cpu_seconds()
        t1 = time.perf_counter()
        for b in loader:
            if ok is None:
                ok = _check_window(ds, b)
            rows = b["window"][:, :2].numpy()
            sc = np.array([index[s] for s in b["scene"]], np.int64)
            served.append(np.column_stack([sc, rows]).astype(np.int64))
        dt = time.perf_counter() - t1
        own = own_cpu_seconds() - c0
        others = max(0.0, busy_cpu_seconds() - b0 - own) / dt
        m = ds.metrics(e).to_dict()
        keep = ("bytes_fetched", "bytes_decoded", "chunks_decoded", "redecodes", "disk_hits", "disk_misses", "requests",
                "samples", "wall_s", "decode_s", "fetch_s", "assemble_s", "shared_chunks")
        rows_served = np.concatenate(served) if served else np.zeros((0, 3), np.int64)
        out["epochs"].append({"epoch": e, "seconds": dt, "cpu_s": own, "other_cores": others, "check": ok,
                              "served": rows_served, **{k: m[k] for k in keep}})
    out["disk_cache_bytes"] = tree_bytes(Path(cache_dir))
    return out


def _read_chunks(ds: Any, chunks: np.ndarray) -> list[tuple[bytes, Any]]:
    """Stored bytes of ``chunks`` ``(scene, flat id)``, read into memory, with each one's source."""
    from cubelake.storage import split_url

    out = []
    for s, flat in chunks.tolist():
        src = ds.sources[int(s)]
        cy, cx = divmod(int(flat), src.grid.n_cols)
        for p in src.pieces(cy, cx):
            with open(split_url(p.url)[1], "rb") as f:
                f.seek(max(0, p.offset))
                out.append((f.read() if p.length < 0 else f.read(p.length), src))
    return out


def ceiling(ds: Any, chunks: np.ndarray, threads: int = 2) -> dict[str, Any]:
    """Best of 3: blosc-decode the chunks' stored bytes (numcodecs, into a reused buffer) and cast to float32."""
    import threading

    import numcodecs
    import zarr

    jobs = _read_chunks(ds, chunks)
    local = threading.local()

    def work(job: tuple[bytes, Any]) -> int:
        raw, src = job
        n = int(np.prod(src.chunk_shape))
        if getattr(local, "n", None) != n:
            local.n, local.i16, local.f32 = n, np.empty(n, "<i2"), np.empty(n, np.float32)
        numcodecs.blosc.decompress(raw, local.i16)
        np.copyto(local.f32, local.i16)
        return n * 4

    # the decode is the Zarr product's: one chunk compared with zarr-python's own read
    s0, f0 = (int(v) for v in chunks[0])
    src = ds.sources[s0]
    cy, cx = divmod(f0, src.grid.n_cols)
    arr: Any = zarr.open_group(src.url, mode="r")["data"]
    want = np.asarray(arr[:, cy * CHUNK:(cy + 1) * CHUNK, cx * CHUNK:(cx + 1) * CHUNK])
    got = np.frombuffer(numcodecs.blosc.decompress(jobs[0][0]), "<i2").reshape(want.shape)
    best = {1: math.inf, threads: math.inf}
    for nt in best:
        for _ in range(3):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(nt) as pool:
                cast = sum(pool.map(work, jobs))
            best[nt] = min(best[nt], time.perf_counter() - t0)
    return {"chunks": len(jobs), "stored_bytes": sum(len(r) for r, _ in jobs), "float32_bytes": cast,
            "seconds_1_thread": best[1], "seconds": best[threads], "threads": threads,
            "decode_matches_zarr": bool(np.array_equal(got, want))}


def _area_epoch(make: Any) -> tuple[Any, dict[str, Any]]:
    t0 = time.perf_counter()
    ds = make()
    t_open = time.perf_counter() - t0
    n = 0
    b0, c0 = busy_cpu_seconds(), own_cpu_seconds()
    t1 = time.perf_counter()
    for b in ds:
        n += len(b["scene"])
    dt = time.perf_counter() - t1
    others = max(0.0, busy_cpu_seconds() - b0 - (own_cpu_seconds() - c0)) / dt
    m = ds.metrics().to_dict()
    return ds, {"open_s": t_open, "seconds": dt, "samples": n, "other_cores": others, **{k: m[k] for k in (
        "bytes_fetched", "bytes_decoded", "bytes_used", "chunks_decoded", "redecodes", "requests")}}


def run_area(lake: str, bboxes: dict[str, list[float]], repeats: int, seed: int) -> dict[str, Any]:
    """The catalog's hits for the largest of ``bboxes`` whole, and each bbox by ``from_search`` (limited to it),
    alternating, ``repeats`` fresh datasets each (in-process, 2 decode threads); then each one's ceiling."""
    from cubelake.catalog import LakeCatalog, Query
    from cubelake.loaders import CubeDataset, PlanSpec, Sampling, Spectral

    kw: dict[str, Any] = {"sampling": Sampling(size=WIN, stride=STRIDE, labels="none"),
                          "spectral": Spectral(normalize="none"), "prefer": ("zarr",),
                          "plan": PlanSpec(seed=seed, batch_size=BATCH)}
    biggest = max(bboxes.values(), key=lambda b: (b[2] - b[0]) * (b[3] - b[1]))
    with LakeCatalog(lake) as cat:
        hits = cat.search(Query(bbox=tuple(biggest)))
    makers: dict[str, Any] = {k: (lambda b=b: CubeDataset.from_search(lake, bbox=tuple(b), **kw)) for k, b in bboxes.items()}
    makers["whole"] = lambda: CubeDataset(hits, lake=lake, **kw)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in makers}
    last: dict[str, Any] = {}
    for _ in range(repeats):
        for key, make in makers.items():
            last[key], row = _area_epoch(make)
            runs[key].append(row)
    out: dict[str, Any] = {"hits": len(hits)}
    for key, ds in last.items():
        meeting = sum(r.n_chunks for r in ds.regions if r is not None) if ds.regions is not None else None
        out[key] = {"scenes": len(ds.sources), "chunks_meeting": meeting, "chunks_total": sum(g.n_chunks for g in ds.grids),
                    "plan_chunks": int(ds.plan(0).chunks.shape[0]), "runs": runs[key],
                    "ceiling": ceiling(ds, ds.plan(0).chunks), "bands": ds.n_bands}
    return out


# -- pure figures, in this process ------------------------------------------------------------------


def chunk_keys(plan: Any) -> set[tuple[int, int]]:
    return {(int(s), int(c)) for s, c in plan.chunks.tolist()}


def stored_sizes(ds: Any) -> dict[tuple[int, int], int]:
    """Stored bytes of every chunk of every scene (what a fetch of it reads)."""
    from cubelake.storage import split_url

    out = {}
    for s, src in enumerate(ds.sources):
        for cy in range(src.grid.n_rows):
            for cx in range(src.grid.n_cols):
                n = 0
                for p in src.pieces(cy, cx):
                    n += p.length if p.length >= 0 else os.path.getsize(split_url(p.url)[1])
                out[(s, cy * src.grid.n_cols + cx)] = n
    return out


def plan_figures(ds: Any, twin: Any, world: int, epochs: int, sizes: dict[tuple[int, int], int]) -> dict[str, Any]:
    """Per epoch, from the plans: ``shard_report``, each rank's chunks, new chunks and their bytes; over the run."""
    from cubelake.loaders import shard_report

    seen: list[set[tuple[int, int]]] = [set() for _ in range(world)]
    per_epoch = []
    for e in range(epochs):
        et, et_twin = ds.epoch_table(e), twin.epoch_table(e)
        if not np.array_equal(et.table.rows, et_twin.table.rows):
            raise RuntimeError(f"epoch {e}: the strips and geohash datasets built different sample tables")
        rep = shard_report(ds.grids, et.table, ds.plan_spec, e, world, cells=et_twin.cells)
        ranks = []
        for r in range(world):
            keys = chunk_keys(ds.plan(e, rank=r, world_size=world))
            new = keys - seen[r]
            ranks.append({"chunks": len(keys), "scenes": len({k[0] for k in keys}), "new_chunks": len(new),
                          "new_bytes": sum(sizes[k] for k in new),
                          "chunk_bytes": sum(sizes[k] for k in keys)})
            seen[r] |= keys
        per_epoch.append({"report": rep, "ranks": ranks, "samples_table": len(et.table)})
    counts: dict[tuple[int, int], int] = {}
    for s in seen:
        for k in s:
            counts[k] = counts.get(k, 0) + 1
    return {"epochs": per_epoch, "run_chunks_per_rank": [len(s) for s in seen],
            "run_bytes_per_rank": [sum(sizes[k] for k in s) for s in seen],
            "run_chunks": len(counts), "run_chunks_multi_rank": sum(v > 1 for v in counts.values()),
            "lake_chunk_bytes": sum(sizes.values())}


def check_served(ranks: list[dict[str, Any]], plans: dict[str, Any], epoch: int) -> dict[str, Any]:
    """Windows served in ``epoch``: none by two ranks; each rank served what its plan says."""
    served = [r["epochs"][epoch]["served"] for r in ranks]
    allrows = np.concatenate(served)
    uniq = np.unique(allrows, axis=0).shape[0] if allrows.size else 0
    want = [x["samples"] for x in plans["epochs"][epoch]["report"]["ranks"]]
    return {"served": int(allrows.shape[0]), "distinct": int(uniq), "per_rank_as_planned": [len(s) for s in served] == want,
            "pixels_equal": all(r["epochs"][epoch]["check"] for r in ranks)}


def _cell_km2(cell: str) -> float:
    from cubelake.geohash import cell_bounds

    w, s, e, n = cell_bounds(cell)
    return (e - w) * 111.32 * math.cos(math.radians((s + n) / 2)) * (n - s) * 110.57


def balance_figures(ds: Any, hot_scene: np.ndarray, epochs: int) -> dict[str, Any]:
    """Hot vs sparse cells of the balanced dataset: density, kept fraction vs formula, loss weights vs formula."""
    from cubelake.loaders.geo import cell_counts, keep_probability, sample_cells

    base = ds._tables.base(0)  # the sampler's windows before balancing (the same every epoch for sliding windows)
    names, counts, inverse = cell_counts(sample_cells(base, ds.georefs, PRECISION))
    hot_cell = np.zeros(names.size, bool)
    hot_cell[np.unique(inverse[hot_scene[base.rows[:, 0]]])] = True
    area = np.array([_cell_km2(str(c)) for c in names])
    dens = counts / area
    p = keep_probability(counts)
    top = counts.max()
    out: dict[str, Any] = {"cells": int(names.size), "hot_cells": int(hot_cell.sum()),
                           "sparse_cells": int((~hot_cell).sum()), "epochs": []}
    for g, m in (("hot", hot_cell), ("sparse", ~hot_cell)):
        out[g] = {"median_samples_per_cell": float(np.median(counts[m])), "mean_samples_per_cell": float(counts[m].mean()),
                  "median_samples_per_km2": float(np.median(dens[m])), "samples": int(counts[m].sum()),
                  "expected_kept_fraction": float((counts[m] * p[m]).sum() / counts[m].sum()),
                  "expected_mean_weight": float((counts[m] * (1 + ALPHA * (1 - counts[m] / top))).sum() / counts[m].sum())}
    out["density_ratio_median_per_cell"] = out["hot"]["median_samples_per_cell"] / out["sparse"]["median_samples_per_cell"]
    out["density_ratio_median_per_km2"] = out["hot"]["median_samples_per_km2"] / out["sparse"]["median_samples_per_km2"]
    for e in range(epochs):
        et = ds.epoch_table(e)
        rc = et.region_counts()
        if [rc[str(c)][0] for c in names] != counts.tolist():
            raise RuntimeError(f"epoch {e}: region_counts() disagrees with the cells counted here")
        kept = np.array([rc[str(c)][1] for c in names])
        kc = sample_cells(et.table, ds.georefs, PRECISION)
        k_hot = hot_cell[np.searchsorted(names, kc)]
        row: dict[str, float] = {"epoch": e, "before": len(base), "after": len(et.table)}
        for g, m, km in (("hot", hot_cell, k_hot), ("sparse", ~hot_cell, ~k_hot)):
            row[f"{g}_kept_fraction"] = float(kept[m].sum() / counts[m].sum())
            row[f"{g}_mean_weight"] = float(et.weight[km].mean()) if km.any() else float("nan")
        out["epochs"].append(row)
    return out


def precision_sweep(scenes: list[str], world: int, seed: int, precisions: Sequence[int]) -> list[dict[str, Any]]:
    """Epoch 0 split by geohash cells of each precision (and by strips), no balance: ``shard_report`` figures."""
    from cubelake.loaders import CubeDataset, PlanSpec, Sampling, Spectral, shard_report

    rows = []
    for prec in precisions:
        ds = CubeDataset(scenes, sampling=Sampling(size=WIN, stride=STRIDE, labels="none"),
                         spectral=Spectral(normalize="none"), prefer=("zarr",),
                         plan=PlanSpec(seed=seed, batch_size=BATCH, shard_by="geohash", geohash_precision=prec))
        et = ds.epoch_table(0)
        rep = shard_report(ds.grids, et.table, ds.plan_spec, 0, world, cells=et.cells)
        strips = shard_report(ds.grids, et.table, PlanSpec(seed=seed, batch_size=BATCH), 0, world, cells=et.cells)
        assert et.cells is not None
        coarse = np.unique(np.asarray(et.cells).astype(f"<U{prec}"))
        rows.append({"precision": prec, "cells": int(coarse.size), "geohash": _brief(rep), "strips": _brief(strips)})
    return rows


def _brief(rep: dict[str, Any]) -> dict[str, Any]:
    return {k: rep[k] for k in ("chunks", "chunks_multi_rank", "chunks_multi_rank_fraction", "chunk_reads",
                                "cells_multi_rank", "max_min_samples", "dropped", "served")} | {
        "cells_per_rank": [x["cells"] for x in rep["ranks"]], "chunks_per_rank": [x["chunks"] for x in rep["ranks"]]}


# -- the runs -------------------------------------------------------------------------------------


SETUPS = {"strips": ("strips", False), "geohash": ("geohash", False),
          "strips+balance": ("strips", True), "geohash+balance": ("geohash", True)}


def setup_plans(name: str, scenes: list[str], a: argparse.Namespace, sizes: dict[tuple[int, int], int]) -> dict[str, Any]:
    """One sharding set-up's figures from its plans (pure, this process)."""
    shard_by, balance = SETUPS[name]
    ds = make_dataset(scenes, shard_by, balance, a.seed)
    twin = ds if shard_by == "geohash" else make_dataset(scenes, "geohash", balance, a.seed)
    return plan_figures(ds, twin, a.world, a.epochs, sizes)


def run_ranks(names: Sequence[str], scenes: list[str], a: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every rank of every set-up in its own process with its own (new) disk cache; set-ups interleaved
    (rank 0 of each, then rank 1 of each, ...) so a change in the machine's load hits them alike."""
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(a.world):
        for name in names:
            shard_by, balance = SETUPS[name]
            cache = a.workdir / "cache" / name / f"rank{r}"
            shutil.rmtree(cache, ignore_errors=True)
            t0 = time.perf_counter()
            res = isolated(run_rank, scenes=scenes, shard_by=shard_by, balance=balance, rank=r, world=a.world,
                           epochs=a.epochs, cache_dir=str(cache), seed=a.seed)
            res["process_s"] = time.perf_counter() - t0
            out[name].append(res)
            print(f"  {name} rank {r} ({res['process_s']:.1f} s in all, open {res['open_s']:.1f} s): " + ", ".join(
                f"e{x['epoch']} {x['samples']} samples {x['seconds']:.2f} s {x['bytes_fetched'] / MB:.1f} MB"
                for x in res["epochs"]), flush=True)
    return out


def summarise_setup(plans: dict[str, Any], ranks: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    """Per epoch: the ranks' measured figures beside the plans'; over the run: totals."""
    epochs = []
    for e in range(a.epochs):
        rows = [r["epochs"][e] for r in ranks]
        rep = plans["epochs"][e]["report"]
        epochs.append({
            "epoch": e, "check": check_served(ranks, plans, e),
            "samples_per_rank": [x["samples"] for x in rows], "max_min_samples": rep["max_min_samples"],
            "dropped": rep["dropped"], "chunks_multi_rank": rep["chunks_multi_rank"], "chunks": rep["chunks"],
            "chunks_multi_rank_fraction": rep["chunks_multi_rank_fraction"],
            "cells_per_rank": [x["cells"] for x in rep["ranks"]], "cells_multi_rank": rep["cells_multi_rank"],
            "plan_chunks_per_rank": [x["chunks"] for x in plans["epochs"][e]["ranks"]],
            "scenes_per_rank": [x["scenes"] for x in plans["epochs"][e]["ranks"]],
            "plan_new_bytes_per_rank": [x["new_bytes"] for x in plans["epochs"][e]["ranks"]],
            "fetched_per_rank": [x["bytes_fetched"] for x in rows], "decoded_per_rank": [x["chunks_decoded"] for x in rows],
            "redecodes": sum(x["redecodes"] for x in rows), "disk_hits_per_rank": [x["disk_hits"] for x in rows],
            "seconds_per_rank": [x["seconds"] for x in rows], "other_cores": [x["other_cores"] for x in rows],
            "samples_table": plans["epochs"][e]["samples_table"]})
    for r in ranks:
        for x in r["epochs"]:
            x.pop("served")
    return {"epochs": epochs, "ranks": ranks, "plans": {k: v for k, v in plans.items() if k != "epochs"},
            "reports": [p["report"] for p in plans["epochs"]],
            "run": {"fetched": sum(sum(e["fetched_per_rank"]) for e in epochs),
                    "fetched_per_rank": [sum(e["fetched_per_rank"][r] for e in epochs) for r in range(a.world)],
                    "seconds_max_rank_sum": sum(max(e["seconds_per_rank"]) for e in epochs),
                    "disk_cache_bytes": [r["disk_cache_bytes"] for r in ranks]}}


def area_part(lake: Path, a: argparse.Namespace) -> dict[str, Any]:
    name, lon, lat = CITIES[0]
    bboxes = {}
    for km in sorted(float(k) for k in a.aoi_km.split(",") if k):
        dlat, dlon = km / 2 / 110.57, km / 2 / (111.32 * math.cos(math.radians(lat)))
        bboxes[f"aoi {km:g} km"] = [lon - dlon, lat - dlat, lon + dlon, lat + dlat]
    out: dict[str, Any] = {"city": name, "bboxes": bboxes}
    out.update(isolated(run_area, lake=str(lake), bboxes=bboxes, repeats=a.repeats, seed=a.seed))
    for key in [*bboxes, "whole"]:
        r = out[key]
        r["seconds_median"] = statistics.median(x["seconds"] for x in r["runs"])
        r["float32_out_bytes"] = r["runs"][0]["samples"] * r["bands"] * WIN * WIN * 4
        print(f"  {key}: {r['scenes']} scenes, {r['runs'][0]['samples']} samples, {r['runs'][0]['bytes_fetched'] / MB:.1f} MB, "
              f"epochs " + ", ".join(f"{x['seconds']:.2f}" for x in r["runs"]) + f" s; ceiling {r['ceiling']['seconds']:.3f} s",
              flush=True)
    return out


# -- output ---------------------------------------------------------------------------------------


def _span(xs: Sequence[float], fmt: str = "{:.0f}") -> str:
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def _table(title: str, cols: Sequence[str]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right")
    return t


def print_sharding(doc: dict[str, Any]) -> None:
    from rich.console import Console

    con = Console(width=240)
    t = _table(f"sharding: {doc['world']} ranks, one process each, own disk cache; MB = 10^6 bytes",
               ["set-up", "epoch", "samples/rank", "max/min", "chunks decoded/rank", "chunks >1 rank",
                "scenes/rank", "fetched MB/rank", "fetched MB all", "plan: new MB all", "disk hits", "epoch s/rank",
                "other cores", "cells/rank", "cells >1 rank", "checks"])
    for name, s in doc["sharding"].items():
        for e in s["epochs"]:
            c = e["check"]
            ok = c["served"] == c["distinct"] and c["per_rank_as_planned"] and c["pixels_equal"]
            t.add_row(name, str(e["epoch"]), _span(e["samples_per_rank"]), f"{e['max_min_samples']:.3f}",
                      _span(e["decoded_per_rank"]), f"{e['chunks_multi_rank']} / {e['chunks']}", _span(e["scenes_per_rank"]),
                      _span([x / MB for x in e["fetched_per_rank"]], "{:.1f}"), f"{sum(e['fetched_per_rank']) / MB:.1f}",
                      f"{sum(e['plan_new_bytes_per_rank']) / MB:.1f}", str(sum(e["disk_hits_per_rank"])),
                      _span(e["seconds_per_rank"], "{:.2f}"), _span(e["other_cores"], "{:.2f}"),
                      _span(e["cells_per_rank"]), str(e["cells_multi_rank"]), "ok" if ok else "FAIL")
    con.print(t)
    t = _table(f"over the run ({doc['epochs']} epochs)", ["set-up", "fetched MB all ranks", "vs strips",
               "distinct chunks/rank", "disk cache MB/rank", "chunks read by >1 rank", "sum of slowest rank's epoch s"])
    for name, s in doc["sharding"].items():
        base = doc["sharding"].get(name.replace("geohash", "strips"))
        ratio = f"{s['run']['fetched'] / base['run']['fetched']:.2f}x" if base and base["run"]["fetched"] else "-"
        p = s["plans"]
        t.add_row(name, f"{s['run']['fetched'] / MB:.1f}", ratio, _span(p["run_chunks_per_rank"]),
                  _span([x / MB for x in s["run"]["disk_cache_bytes"]], "{:.1f}"),
                  f"{p['run_chunks_multi_rank']} / {p['run_chunks']}", f"{s['run']['seconds_max_rank_sum']:.2f}")
    con.print(t)


def print_rest(doc: dict[str, Any]) -> None:
    from rich.console import Console

    con = Console(width=240)
    t = _table("split by geohash precision (epoch 0, no balance; shard_report)",
               ["precision", "cells", "geohash: chunks >1 rank", "chunk reads", "max/min", "cells/rank",
                "cells >1 rank", "strips: chunks >1 rank", "strips: cells >1 rank"])
    for r in doc.get("precision_sweep", []):
        g, s = r["geohash"], r["strips"]
        t.add_row(str(r["precision"]), str(r["cells"]), f"{g['chunks_multi_rank']} ({g['chunks_multi_rank_fraction']:.1%})",
                  str(g["chunk_reads"]), f"{g['max_min_samples']:.3f}", _span(g["cells_per_rank"]),
                  str(g["cells_multi_rank"]), str(s["chunks_multi_rank"]), str(s["cells_multi_rank"]))
    con.print(t)
    b = doc["balance"]
    print(f"\nregion balance (precision {PRECISION}, alpha {ALPHA}): {b['cells']} cells, {b['hot_cells']} hot, "
          f"{b['sparse_cells']} sparse; median samples per cell hot {b['hot']['median_samples_per_cell']:.0f} / sparse "
          f"{b['sparse']['median_samples_per_cell']:.0f} = {b['density_ratio_median_per_cell']:.1f}:1; per km^2 "
          f"{b['hot']['median_samples_per_km2']:.0f} / {b['sparse']['median_samples_per_km2']:.1f} = "
          f"{b['density_ratio_median_per_km2']:.1f}:1")
    t = _table("", ["epoch", "samples before", "after", "hot kept", "expected", "sparse kept", "expected",
                    "hot mean weight", "expected", "sparse mean weight", "expected"])
    for e in b["epochs"]:
        t.add_row(str(e["epoch"]), str(e["before"]), str(e["after"]), f"{e['hot_kept_fraction']:.3f}",
                  f"{b['hot']['expected_kept_fraction']:.3f}", f"{e['sparse_kept_fraction']:.3f}",
                  f"{b['sparse']['expected_kept_fraction']:.3f}", f"{e['hot_mean_weight']:.3f}",
                  f"{b['hot']['expected_mean_weight']:.3f}", f"{e['sparse_mean_weight']:.3f}",
                  f"{b['sparse']['expected_mean_weight']:.3f}")
    con.print(t)
    ar = doc["area"]
    keys = [*ar["bboxes"], "whole"]
    t = _table(f"areas of interest: squares on {ar['city']} (from_search) vs the {ar['hits']} hits of the largest whole "
               f"(median of {len(ar['whole']['runs'])} fresh datasets; ceiling = decode + cast of the epoch's chunks, "
               "2 threads)",
               ["epoch", "scenes", "chunks read / all", "samples", "fetched MB", "decoded MB", "epoch s",
                "ceiling s", "epoch / ceiling", "float32 out / cast", "samples/s", "other cores"])
    for key in keys:
        r = ar[key]
        x = r["runs"][0]
        med = r["seconds_median"]
        t.add_row(key, str(r["scenes"]), f"{x['chunks_decoded']} / {r['chunks_total']}", str(x["samples"]),
                  f"{x['bytes_fetched'] / MB:.1f}", f"{x['bytes_decoded'] / MB:.1f}", f"{med:.2f}",
                  f"{r['ceiling']['seconds']:.3f}", f"{med / r['ceiling']['seconds']:.1f}x",
                  f"{r['float32_out_bytes'] / r['ceiling']['float32_bytes']:.1f}x", f"{x['samples'] / med:,.0f}",
                  _span([y["other_cores"] for y in r["runs"]], "{:.2f}"))
    con.print(t)
    w = ar["whole"]
    for key in ar["bboxes"]:
        o = ar[key]
        print(f"whole / {key}: bytes fetched {w['runs'][0]['bytes_fetched'] / o['runs'][0]['bytes_fetched']:.2f}x, chunks "
              f"{w['runs'][0]['chunks_decoded'] / o['runs'][0]['chunks_decoded']:.2f}x, samples "
              f"{w['runs'][0]['samples'] / o['runs'][0]['samples']:.2f}x, epoch time "
              f"{w['seconds_median'] / o['seconds_median']:.2f}x")


# -- main -----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench/geo"), help="scenes, lake and disk caches (kept)")
    ap.add_argument("--fresh", action="store_true", help="rebuild the lake even when one with these parameters exists")
    ap.add_argument("--cities", type=int, default=3, help=f"hot cities (1..{len(CITIES)})")
    ap.add_argument("--per-city", type=int, default=20, help="overlapping scenes per hot city")
    ap.add_argument("--sparse", type=int, default=12, help="scattered single scenes")
    ap.add_argument("--jitter-m", type=float, default=250.0, help="std of a hot scene's offset from its city centre, m")
    ap.add_argument("--size", type=int, default=256, help="scene height = width, pixels (multiple of 64)")
    ap.add_argument("--bands", type=int, default=16)
    ap.add_argument("--world", type=int, default=4, help="simulated ranks")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, of {', '.join(SETUPS)}")
    ap.add_argument("--precisions", default="4,5,6,7", help="geohash precisions of the split sweep (pure)")
    ap.add_argument("--aoi-km", default="2,4", help="sides of the square areas on the first city, km (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh epochs per area run (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="smoke check: 1 city x 10 + 6 sparse scenes, 2 epochs, strips and geohash only, 1 repeat")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.quick:
        a.cities, a.per_city, a.sparse, a.epochs, a.repeats = 1, 10, 6, 2, 1
        a.setups, a.precisions = "strips,geohash", "6"
        a.workdir = a.workdir.with_name(a.workdir.name + "_quick")
    if a.size % CHUNK:
        ap.error(f"--size must be a multiple of {CHUNK}")
    unknown = set(a.setups.split(",")) - set(SETUPS)
    if unknown:
        ap.error(f"--setups: unknown {sorted(unknown)}; choose from {', '.join(SETUPS)}")
    if a.cities < 1:
        ap.error("--cities must be at least 1 (the area of interest lies on the first city)")
    return a


def machine() -> dict[str, Any]:
    import numcodecs
    import torch
    import zarr

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_end": os.getloadavg(), "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
            "versions": {"torch": torch.__version__, "zarr": zarr.__version__, "numcodecs": numcodecs.__version__}}


def main() -> None:
    a = parse_args()
    from loader import code_version

    t_start = time.perf_counter()
    a.workdir.mkdir(parents=True, exist_ok=True)
    places = place_scenes(a.cities, a.per_city, a.sparse, a.jitter_m, a.seed)
    lake, built = ensure_lake(a.workdir, places, a.size, a.bands, a.fresh)
    scenes = scene_folders(lake, places)
    warm = warm_page_cache(lake)
    doc: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "loadavg_start": os.getloadavg(),
                           "args": {k: str(v) for k, v in vars(a).items()}, "code_start": code_version(),
                           "lake": {"path": str(lake), "scenes": len(places), "hot": a.cities * a.per_city,
                                    "sparse": a.sparse, "bytes": warm, "built": built,
                                    "places": [asdict(p) for p in places]},
                           "world": a.world, "epochs": a.epochs}
    print(f"lake: {len(places)} scenes ({a.cities} x {a.per_city} hot, {a.sparse} sparse), {warm / MB:.0f} MB "
          "(read once: warm page cache)", flush=True)
    ds = make_dataset(scenes, "geohash", True, a.seed)
    hot = np.array([s.scene_id.startswith("hot_") for s in ds.sources])
    doc["balance"] = balance_figures(ds, hot, a.epochs)
    sizes = stored_sizes(ds)
    names = a.setups.split(",")
    plans = {n: setup_plans(n, scenes, a, sizes) for n in names}
    print(f"\nsharding: {', '.join(names)}; {a.world} ranks, {a.epochs} epochs", flush=True)
    ranks = run_ranks(names, scenes, a)
    doc["sharding"] = {n: summarise_setup(plans[n], ranks[n], a) for n in names}
    print_sharding(doc)
    doc["precision_sweep"] = precision_sweep(scenes, a.world, a.seed, [int(p) for p in a.precisions.split(",") if p])
    print("\narea of interest", flush=True)
    doc["area"] = area_part(lake, a)
    print_rest(doc)
    doc["code_end"] = code_version()
    if doc["code_end"] != doc["code_start"]:
        print(f"WARNING: the loader's code changed during the run: {doc['code_start']} -> {doc['code_end']}")
    doc["machine"] = machine()
    doc["total_s"] = time.perf_counter() - t_start
    print(f"\ncode: {doc['code_start']}\ntotal {doc['total_s']:.0f} s")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)) + "\n")
        print(f"wrote {a.json}")
    checks = [e["check"] for s in doc["sharding"].values() for e in s["epochs"]]
    bad = [c for c in checks if not (c["served"] == c["distinct"] and c["per_rank_as_planned"] and c["pixels_equal"])]
    if bad or not all(doc["area"][k]["ceiling"]["decode_matches_zarr"] for k in [*doc["area"]["bboxes"], "whole"]):
        print(f"FAILED checks: {bad}")
        sys.exit(1)


if __name__ == "__main__":
    main()
