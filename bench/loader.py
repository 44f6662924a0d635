"""Chunk-aware PyTorch loading: cubelake's ``CubeDataset`` against per-sample readers, in one run.

Data: a synthetic HSI-like cube (``bench/synth.py``; ``--size`` x ``--size`` x ``--bands`` int16,
2048 x 2048 x 128 = 1 GiB raw by default) ingested by cubelake into a lake (products cog and zarr,
256 x 256 chunks/tiles, COG ZSTD-3 + predictor 2 pixel-interleaved, Zarr v3 blosc zstd-3 shuffle),
in ``--workdir`` (kept; ``--reuse`` takes the lake as it is instead of ingesting again).

Samples: 32 x 32 windows with all bands, batches of 64, delivered as float32 tensors by every method.
Two sample sets, both taken from cubelake's own sample table so every method reads the same windows:

* ``sliding``: every window at stride 32 (the whole scene once); an *epoch*.
* ``random``:  ``Sampling(mode="random", count=N)`` windows (N = the sliding count by default).

Methods (each in a fresh process, so caches and GDAL settings do not leak from one to the next;
the page cache is warm: every product file is read once before the first timed run):

  (a) rasterio   ``DatasetReader.read(window=...)`` per sample on the lake's COG (TorchGeo's way),
                 GDAL_CACHEMAX = the shared budget split over the DataLoader workers.
  (b) xbatcher   ``xbatcher.loaders.torch.MapDataset(BatchGenerator(da, input_dims={"y": 32, "x": 32}))``
                 over ``xr.open_zarr`` of the store's ``data`` (dask-backed, the default); batch
                 mode (``concat_input_dims``) is off, as it re-reads the source per patch. xbatcher
                 only yields a fixed grid of patches, so for random windows (b) is the step it
                 runs per patch, ``da.isel(y=..., x=...)`` + ``load()``, at the random positions.
  (c) zarr       ``zarr.open_group(store)["data"][:, r:r+32, c:c+32]`` per sample.
  (d) cubelake   ``CubeDataset`` in-process (num_workers=0, 2 decode threads) and through
                 ``DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)``
                 (1 decode thread per worker); ``ReaderConfig(cache_bytes=budget / processes)``.

Baselines run through ``torch.utils.data.DataLoader(batch_size=64, num_workers=--baseline-workers)``
over a map-style dataset, in a random permutation of the windows, and are timed on the first
``--baseline-samples`` samples (or ``--baseline-seconds``, whichever ends first); cubelake runs the
whole epoch. Rates include the DataLoader's start-up (worker start, opening files).

Counted per method:
  useful bytes      samples x bands x 32 x 32 x 2 (the windows' pixels in the stored dtype)
  read bytes        cubelake: ``LoaderMetrics.bytes_fetched``; baselines: ``rchar`` of
                    ``/proc/self/io`` around each sample's read (bytes the process read through
                    read()/pread(); local files are all it reads in that call); over S3: bytes
                    received on the loopback interface (``/proc/net/dev``) during the run
  decoded bytes     cubelake: ``bytes_decoded``; zarr and xbatcher: data-chunk GETs counted by a
                    ``zarr.storage.WrapperStore`` x chunk bytes (zarr-python and xarray keep no
                    decoded chunks, so every GET is one decode); rasterio: *estimated* as read
                    bytes x (raw bytes / COG bytes), since every tile byte GDAL reads is decoded
Checks: every method's first samples are compared with the Zarr product's pixels (equal).

Stall: a consumer spending ``--consumer-ms`` per batch (a 1-thread torch matmul loop, calibrated in
the run) iterates ``ds.timed(loader)``; ``ds.metrics().stall_fraction`` is the share of wall time
the consumer waited. Reported next to the loader's decode and assembly time per batch.

S3: the lake's Zarr store and COG are uploaded to a moto server on 127.0.0.1 (in this process);
cubelake runs the sliding epoch over ``s3://bench/<id>.zarr``; rasterio reads per sample over
``/vsis3/`` (GDAL settings as in FIELD_NOTES) for ``--s3-samples`` samples or ``--s3-seconds``.
moto reads the whole object for each GET, so a range GET of the 0.6 GB COG costs the server far
more than one of a ~9 MB chunk object; the run measures both (``s3_probe``).

Paired rounds (``--rounds N``): the machine's speed drifts between measurements taken minutes apart
(the ceiling of one command moved by 39 % between two runs); each round measures the ceiling, a fresh
in-process epoch and a fresh 2-worker epoch one after the other, takes the ratios within the round and
reports their medians over the rounds.

    python bench/loader.py --json /tmp/bench/loader.json
    python bench/loader.py --size 1024 --baseline-samples 512 --json /tmp/bench/loader_small.json
    python bench/loader.py --reuse --rounds 5 --skip sliding,random,ceiling,stall,s3,baselines
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules
from common import isolated, lo_rx  # noqa: E402
from synth import ensure_scene as ensure_synth_scene  # noqa: E402

# the geometry: chunk side and window side (= stride); main() sets them from --chunk/--window and passes them to the
# processes it spawns through the environment
CHUNK, WIN = (int(v) for v in os.environ.get("CUBELAKE_BENCH_LOADER_GEOMETRY", "256,32").split(","))
BATCH = 64
MB = 1e6
MiB = 1024**2
BUCKET = "bench"


# -- counters -------------------------------------------------------------------------------------


def rchar() -> int:
    """Bytes this process has read through read()/pread() (``/proc/self/io``)."""
    with open("/proc/self/io", "rb") as f:
        data = f.read()
    return int(data.split(b"rchar:", 1)[1].split(b"\n", 1)[0])


def rchar_overhead() -> int:
    """What one :func:`rchar` call adds to ``rchar`` itself (reading ``/proc/self/io``)."""
    return min(-rchar() + rchar() for _ in range(5))




# -- the lake -------------------------------------------------------------------------------------


def scene_paths(lake: Path) -> dict[str, Path] | None:
    for rec in sorted((lake / "scenes").glob("*/scene.json")):
        folder = rec.parent
        sid = folder.name
        cog, zarr_ = folder / f"{sid}.tif", folder / f"{sid}.zarr"
        if cog.is_file() and (zarr_ / "data" / "zarr.json").is_file():
            return {"scene": folder, "cog": cog, "zarr": zarr_, "id": Path(sid)}
    return None


def code_version() -> dict[str, Any]:
    """Which cubelake.loaders this run imports, and the git commit of the tree it comes from (if any)."""
    import subprocess

    import cubelake.loaders

    where = Path(cubelake.loaders.__file__).resolve().parent
    out: dict[str, Any] = {"cubelake_loaders": str(where)}
    try:
        out["git_head"] = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                                         check=True).stdout.strip()
        out["loaders_dirty"] = bool(subprocess.run(["git", "-C", str(where), "status", "--porcelain", "."],
                                                   capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):  # not a git tree: a snapshot may name its commit in COMMIT
        out["git_head"] = next((p.joinpath("COMMIT").read_text().strip() for p in where.parents
                                if p.joinpath("COMMIT").is_file()), None)
    return out


def ensure_lake(work: Path, side: int, bands: int, reuse: bool) -> dict[str, Path]:
    lake = work / (f"lake_{side}x{side}x{bands}" + ("" if CHUNK == 256 else f"_c{CHUNK}"))
    found = scene_paths(lake)
    if reuse and found is not None:
        print(f"reusing {found['scene']}", flush=True)
        return found
    src = ensure_synth_scene(work, side, side, bands, CHUNK)
    from cubelake.ingest import IngestOptions, ingest
    from cubelake.ingest.profile import SensorProfile

    shutil.rmtree(lake, ignore_errors=True)
    profile = SensorProfile.model_validate({"name": "bench", "products": {"chunk": CHUNK, "level": 3},
                                            "bad_bands": {"wavelength_windows_nm": []}})
    print(f"ingesting {src.name} into {lake} (products cog, zarr; chunk {CHUNK}) ...", flush=True)
    t0 = time.perf_counter()
    res = ingest([src], lake, IngestOptions(products=("cog", "zarr"), chunk=CHUNK, profile=profile, workers=2))
    if len(res) != 1 or res[0].outcome not in ("ingested", "unchanged"):
        raise RuntimeError(f"ingest of {src} failed: {[(r.outcome, r.message) for r in res]}")
    print(f"  ingested in {time.perf_counter() - t0:.1f} s", flush=True)
    found = scene_paths(lake)
    if found is None:
        raise RuntimeError(f"{lake}: no scene with a COG and a Zarr store after ingest")
    return found


def tree_bytes(p: Path) -> int:
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def warm_page_cache(paths: list[Path]) -> None:
    for p in paths:
        for f in [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()):
            with open(f, "rb") as fh:
                while fh.read(16 * MiB):
                    pass


# -- running a method in a fresh process ------------------------------------------------------------


# -- baselines ------------------------------------------------------------------------------------


def _counting_store(path: str) -> Any:
    """A local zarr store that counts GETs of data chunks (and their bytes)."""
    import zarr.storage

    class Counting(zarr.storage.WrapperStore):
        gets = 0
        got = 0

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            buf = await self._store.get(key, prototype, byte_range)
            if buf is not None and "/c/" in f"/{key}":
                type(self).gets += 1
                type(self).got += len(buf)
            return buf

    return Counting(zarr.storage.LocalStore(path, read_only=True))


class WindowSet(torch.utils.data.Dataset):
    """One 32 x 32 window (all bands) per item, read the baseline's way; counters per item."""

    def __init__(self, kind: str, path: str, windows: np.ndarray, s3: dict[str, Any] | None = None,
                 xbatcher_grid: bool = False, width: int = 0) -> None:
        self.kind, self.path, self.windows, self.s3 = kind, path, windows, s3
        self.xbatcher_grid, self.width = xbatcher_grid, width
        self._h: Any = None
        self._store: Any = None
        self._overhead = 0
        self._opened = False
        if kind == "xbatcher":  # built in the parent, as a user would, then forked into the workers
            self._open()

    def __len__(self) -> int:
        return len(self.windows)

    def _open(self) -> None:
        self._opened = True
        self._overhead = rchar_overhead()
        if self.kind == "rasterio":
            import rasterio

            if self.s3 is not None:
                from rasterio.session import AWSSession

                env = rasterio.Env(session=AWSSession(aws_access_key_id="testing", aws_secret_access_key="testing",
                                                      region_name="us-east-1", endpoint_url=self.s3["endpoint"]),
                                   AWS_HTTPS="NO", AWS_VIRTUAL_HOSTING="FALSE", GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR")
                env.__enter__()  # for the life of the process
            self._h = rasterio.open(self.path)
        elif self.kind == "zarr":
            import zarr

            self._store = _counting_store(self.path)
            self._h = zarr.open_group(self._store, mode="r")["data"]
        elif self.kind == "xbatcher":
            import xarray as xr
            import xbatcher
            from xbatcher.loaders.torch import MapDataset

            self._store = _counting_store(self.path)
            da = xr.open_zarr(self._store, consolidated=False)["data"]
            self._da = da
            if self.xbatcher_grid:
                self._h = MapDataset(xbatcher.BatchGenerator(da, input_dims={"y": WIN, "x": WIN}))
        else:
            raise ValueError(self.kind)

    def _read(self, r: int, c: int) -> np.ndarray:
        if self.kind == "rasterio":
            from rasterio.windows import Window

            return self._h.read(window=Window(c, r, WIN, WIN))
        if self.kind == "zarr":
            return self._h[:, r:r + WIN, c:c + WIN]
        if self.xbatcher_grid:  # patch index in xbatcher's (y outer, x inner) grid
            t = self._h[(r // WIN) * (self.width // WIN) + c // WIN]
            return t.numpy()
        return self._da.isel(y=slice(r, r + WIN), x=slice(c, c + WIN)).load().values

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not self._opened:
            self._open()
        r, c = (int(v) for v in self.windows[i])
        g0 = type(self._store).gets if self._store is not None else 0
        b0 = type(self._store).got if self._store is not None else 0
        t0 = rchar()
        a = self._read(r, c)
        read = rchar() - t0 - self._overhead
        gets = (type(self._store).gets - g0) if self._store is not None else 0
        got = (type(self._store).got - b0) if self._store is not None else 0
        return {"image": torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)), "rchar": read, "gets": gets,
                "got": got, "window": torch.tensor([r, c])}


def run_baseline(kind: str, path: str, windows: np.ndarray, workers: int, limit: int, limit_s: float,
                 width: int, s3: dict[str, Any] | None = None, xbatcher_grid: bool = False) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    ds = WindowSet(kind, path, windows[:limit], s3=s3, xbatcher_grid=xbatcher_grid, width=width)
    dl = DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=workers,
                    multiprocessing_context="fork" if workers else None)
    n = read = gets = got = 0
    sample: dict[str, Any] = {}
    lo0 = lo_rx()
    t0 = time.perf_counter()
    for b in dl:
        if not sample:
            sample = {"images": b["image"][:2].numpy(), "windows": b["window"][:2].numpy()}
        n += int(b["image"].shape[0])
        read += int(b["rchar"].sum())
        gets += int(b["gets"].sum())
        got += int(b["got"].sum())
        if n >= limit or time.perf_counter() - t0 >= limit_s:
            break
    dt = time.perf_counter() - t0
    lo = lo_rx() - lo0
    return {"samples": n, "seconds": dt, "read_bytes": lo if s3 is not None else read, "chunk_gets": gets,
            "chunk_get_bytes": got, "loopback_bytes": lo, "full_epoch": n >= len(windows), "check": sample,
            "workers": workers, "gdal_cachemax": os.environ.get("GDAL_CACHEMAX")}


# -- cubelake -------------------------------------------------------------------------------------


def make_consumer(ms: float) -> tuple[Any, float]:
    """A 1-thread torch matmul loop calibrated to take ``ms`` milliseconds; returns (fn, measured ms)."""
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    for _ in range(5):
        a @ a
    t0 = time.perf_counter()
    for _ in range(50):
        a @ a
    per = (time.perf_counter() - t0) / 50
    k = max(1, round(ms / 1000 / per))

    def work() -> None:
        x = a
        for _ in range(k):
            x = a @ a
        del x

    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return work, statistics.median(times) * 1000


def run_ceiling(zarr_path: str, repeats: int = 3) -> dict[str, Any]:
    """The machine's ceiling for an epoch that covers the scene once: zarr-python decoding the whole array and
    numpy casting it to float32, four ways (best of ``repeats`` each):

    * ``whole``: ``a[...]`` (zarr's own concurrent decode of every chunk), then ``.astype(float32)`` into a new
      array — what issue 18 names;
    * ``streaming2``: chunk by chunk on 2 threads (chunks split between them), each chunk's float32 written to
      the next place of an output area four batches or more in size, allocated and touched before the clock
      starts — as a loader's batches are: every float32 value written once to memory that is not in the CPU's
      cache, no page faults;
    * ``chunkwise`` / ``chunkwise2``: chunk by chunk on 1 / 2 threads into ONE reused chunk-sized float32 buffer,
      which stays in the CPU's cache: decode + cast with no output written to memory at all, a floor no
      loader that hands out float32 batches can reach (it must write them).

    A sliding epoch at stride = window over a scene the windows tile reads exactly these pixels, so
    ``windows / seconds`` is the rate a loader that decodes and casts and does nothing else would reach.
    ``seconds`` (the ceiling the loader is held to) is the faster of ``whole`` and ``streaming2``; ``floor_s``
    the fastest of all four."""
    import zarr

    arr = zarr.open_group(zarr_path, mode="r")["data"]
    bands, height, width = arr.shape
    cy, cx = arr.chunks[1], arr.chunks[2]
    out: dict[str, Any] = {"windows": (height // WIN) * (width // WIN)}
    times: dict[str, list[float]] = {"whole": [], "streaming2": [], "chunkwise": [], "chunkwise2": []}
    origins = [(r, c) for r in range(0, height, cy) for c in range(0, width, cx)]
    chunk_values = bands * cy * cx
    # per thread: at least 2 batches of float32 and 2 chunks, so writes go to memory (> the L3 cache), not to cache
    area_values = max(2 * BATCH * bands * WIN * WIN, 2 * chunk_values)
    areas = [np.ones(area_values, np.float32) for _ in range(2)]  # np.ones: touched before the clock starts

    def cast_chunks(part: list[tuple[int, int]]) -> None:
        buf = np.empty((bands, cy, cx), np.float32)
        for r, c in part:
            np.copyto(buf, arr[:, r:r + cy, c:c + cx], casting="unsafe")

    def stream_chunks(part: list[tuple[int, int]], area: np.ndarray) -> None:
        at = 0
        for r, c in part:
            if at + chunk_values > area.size:
                at = 0
            np.copyto(area[at:at + chunk_values].reshape(bands, cy, cx), arr[:, r:r + cy, c:c + cx], casting="unsafe")
            at += chunk_values

    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(2)
    for _ in range(repeats):
        t0 = time.perf_counter()
        x = arr[...]
        y = x.astype(np.float32)
        times["whole"].append(time.perf_counter() - t0)
        del x, y
        t0 = time.perf_counter()
        list(pool.map(stream_chunks, [origins[0::2], origins[1::2]], areas))
        times["streaming2"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cast_chunks(origins)
        times["chunkwise"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        list(pool.map(cast_chunks, [origins[0::2], origins[1::2]]))
        times["chunkwise2"].append(time.perf_counter() - t0)
    pool.shutdown()
    for k, v in times.items():
        out[f"{k}_s"], out[f"{k}_all"] = min(v), v
    out["seconds"] = min(out["whole_s"], out["streaming2_s"])  # the fastest way that writes its float32 out
    out["floor_s"] = min(out[f"{k}_s"] for k in times)
    out["samples_per_s"] = out["windows"] / out["seconds"]
    out["floor_samples_per_s"] = out["windows"] / out["floor_s"]
    out["area_mib_per_thread"] = area_values * 4 / 2**20
    return out


def _own_cpu() -> float:
    """User + system CPU seconds of this process so far (not its children)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def decode_threads(workers: int) -> int:
    """Decode threads per process: the 2 cores split over the processes that decode."""
    return 2 if workers == 0 else max(1, 2 // workers)


def run_cubelake(product: str, mode: str, count: int, seed: int, cache_bytes: int, threads: int, workers: int,
                 prefetch: int, epochs: int = 1, storage_options: dict[str, Any] | None = None,
                 consumer_ms: float = 0.0) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from cubelake.loaders import CubeDataset, PlanSpec, ReaderConfig, Sampling, Spectral

    sampling = Sampling(mode=mode, size=WIN, stride=WIN, count=count, labels="none")
    ds = CubeDataset([product], sampling=sampling, spectral=Spectral(normalize="none"),
                     plan=PlanSpec(seed=seed, batch_size=BATCH, chunks_per_round=8),
                     reader=ReaderConfig(cache_bytes=cache_bytes // max(1, workers), threads=threads),
                     prefetch=prefetch, prefer=("zarr",), storage_options=storage_options)
    # fork, Linux's default (these runs start in a spawned process, whose default would be spawn; and
    # CubeDataset does not pickle: its sources hold closures)
    loader: Any = ds if workers == 0 else DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=True,
                                                     multiprocessing_context="fork")
    work, measured_ms = make_consumer(consumer_ms) if consumer_ms > 0 else (None, 0.0)
    # the plan's own figure: chunks that must be resident at once to decode each chunk once
    peak = [ds.plan(0, worker=w, num_workers=max(1, workers)).stats["peak_resident"] for w in range(max(1, workers))]
    out: dict[str, Any] = {"epochs": [], "consumer_ms": measured_ms, "cache_bytes_per_process": cache_bytes // max(1, workers),
                           "threads": threads, "workers": workers, "peak_resident_chunks": peak,
                           "budget_chunks_per_process": cache_bytes // max(1, workers) // ds.sources[0].chunk_nbytes}
    for _ in range(epochs):
        r0, lo0, cpu0 = rchar(), lo_rx(), _own_cpu()
        sample: dict[str, Any] = {}
        n = 0
        t0 = time.perf_counter()
        for b in ds.timed(loader):
            if not sample:
                sample = {"images": b["image"][:2].numpy().copy(), "windows": b["window"][:2, :2].numpy().copy()}
            n += int(b["image"].shape[0])
            if work is not None:
                work()
        dt = time.perf_counter() - t0
        m = ds.metrics()
        out["epochs"].append({"samples": n, "seconds": dt, "metrics": m.to_dict(), "rchar": rchar() - r0,
                              "loopback_bytes": lo_rx() - lo0, "check": sample,
                              # this process's CPU (with workers: the training process's receiving alone)
                              "own_cpu_s": _own_cpu() - cpu0, "n_samples_table": ds.n_samples()})
    return out


# -- S3 -------------------------------------------------------------------------------------------


def start_moto() -> tuple[Any, int]:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    return server, int(port)


def upload(port: int, paths: dict[str, Path]) -> dict[str, Any]:
    import boto3
    from boto3.s3.transfer import TransferConfig

    s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    t0 = time.perf_counter()
    sid = str(paths["id"])
    n = 0
    biggest = 0
    root = paths["zarr"]
    for f in sorted(x for x in root.rglob("*") if x.is_file()):
        s3.upload_file(str(f), BUCKET, f"{sid}.zarr/{f.relative_to(root).as_posix()}")
        n += 1
        biggest = max(biggest, f.stat().st_size)
    s3.upload_file(str(paths["cog"]), BUCKET, f"{sid}.tif", Config=TransferConfig(multipart_chunksize=64 * MiB))
    return {"seconds": time.perf_counter() - t0, "zarr_objects": n, "largest_zarr_object": biggest,
            "cog_object": paths["cog"].stat().st_size}


def s3_probe(port: int, keys: dict[str, str], repeats: int = 5) -> dict[str, float]:
    """Median seconds of a 16 KiB range GET on each object (the server's per-GET cost)."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=f"http://127.0.0.1:{port}", access_key_id="testing", secret_access_key="testing",
                    region="us-east-1", virtual_hosted_style_request=False, client_options={"allow_http": True})
    out = {}
    for name, key in keys.items():
        ts = []
        for i in range(repeats):
            t0 = time.perf_counter()
            obstore.get_range(store, key, start=4096 * i, end=4096 * i + 16384)
            ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts)
    return out


# -- checks ---------------------------------------------------------------------------------------


def verify(zarr_path: Path, check: dict[str, Any]) -> bool:
    import zarr

    arr: Any = zarr.open_group(str(zarr_path), mode="r")["data"]
    for img, (r, c) in zip(check["images"], check["windows"], strict=True):
        want = arr[:, int(r):int(r) + WIN, int(c):int(c) + WIN].astype(np.float32)
        if not np.array_equal(img, want):
            return False
    return bool(len(check["images"]))


# -- output ---------------------------------------------------------------------------------------


def summarise(res: dict[str, Any], *, raw_per_sample: int) -> dict[str, Any]:
    n, dt = res["samples"], res["seconds"]
    useful = n * raw_per_sample
    return {"samples": n, "seconds": dt, "samples_per_s": n / dt if dt else 0.0,
            "useful_mb_s": useful / MB / dt if dt else 0.0,
            "read_per_useful": res["read_bytes"] / useful if useful else float("nan"),
            "decoded_per_useful": res["decoded_bytes"] / useful if useful else float("nan"),
            "full_epoch": res["full_epoch"], "read_bytes": res["read_bytes"], "decoded_bytes": res["decoded_bytes"],
            "how": res["how"], "ok": res.get("ok")}


def print_table(title: str, rows: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'method':<44}{'samples':>8}{'epoch':>6}{'s':>8}{'samples/s':>11}{'useful MB/s':>12}"
          f"{'read/useful':>12}{'decoded/useful':>15}{'check':>7}")
    for name, r in rows.items():
        print(f"{name:<44}{r['samples']:>8}{'full' if r['full_epoch'] else 'part':>6}{r['seconds']:>8.1f}"
              f"{r['samples_per_s']:>11.1f}{r['useful_mb_s']:>12.1f}{r['read_per_useful']:>12.2f}"
              f"{r['decoded_per_useful']:>15.2f}{'ok' if r['ok'] else 'FAIL':>7}")


# -- paired rounds ----------------------------------------------------------------------------------


def paired_rounds(n: int, paths: dict[str, Path], windows: int, cache: int, seed: int) -> dict[str, Any]:
    """``n`` rounds of: the ceiling (best of 3 in a fresh process), one in-process sliding epoch and one 2-worker
    epoch (each in a fresh process, two epochs each). Ratios within a round; their medians reported."""
    print(f"\npaired rounds ({n}): ceiling, in-process, 2 workers — sliding windows", flush=True)
    rounds = []
    for i in range(n):
        ceil = isolated(run_ceiling, zarr_path=str(paths["zarr"]))["seconds"]
        runs = {w: isolated(run_cubelake, product=str(paths["scene"]), mode="sliding", count=windows, seed=seed,
                            cache_bytes=cache, threads=decode_threads(w), workers=w, prefetch=8, epochs=2)
                for w in (0, 2)}
        ep = {w: [e["seconds"] * windows / max(1, e["samples"]) for e in r["epochs"]] for w, r in runs.items()}
        main_cpu = [e["own_cpu_s"] for e in runs[2]["epochs"]]
        row = {"ceiling_s": ceil, "in_process_s": ep[0], "workers2_s": ep[2], "workers2_main_cpu_s": main_cpu,
               "in_process_over_ceiling": ceil / ep[0][0], "in_process_2nd_over_ceiling": ceil / ep[0][1],
               "workers_over_in_process": ep[0][0] / ep[2][0], "workers_over_in_process_2nd": ep[0][1] / ep[2][1]}
        rounds.append(row)
        print(f"  round {i + 1}: ceiling {ceil:.3f} s; in-process {ep[0][0]:.3f} / {ep[0][1]:.3f} s; 2 workers "
              f"{ep[2][0]:.3f} / {ep[2][1]:.3f} s (1st / 2nd epoch) -> in-process / ceiling "
              f"{row['in_process_over_ceiling']:.2f}x ({row['in_process_2nd_over_ceiling']:.2f}x), workers / in-process "
              f"{row['workers_over_in_process']:.2f}x ({row['workers_over_in_process_2nd']:.2f}x); training process's "
              f"CPU with 2 workers {main_cpu[0]:.2f} / {main_cpu[1]:.2f} s", flush=True)
    keys = [k for k in rounds[0] if "_over_" in k]
    med = {k: statistics.median(r[k] for r in rounds) for k in keys}
    print("  median of rounds: " + ", ".join(f"{k} {v:.2f}x" for k, v in med.items()), flush=True)
    return {"rounds": rounds, "median": med}


# -- main -----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench/loader"), help="scene and lake (kept)")
    ap.add_argument("--reuse", action="store_true", help="use the lake in --workdir as it is (no new ingest)")
    ap.add_argument("--size", type=int, default=2048, help="scene side in pixels (multiple of 256)")
    ap.add_argument("--bands", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=256, help="chunk side of the lake's products (pixels)")
    ap.add_argument("--window", type=int, default=32, help="window side = sliding stride (pixels)")
    ap.add_argument("--cache-mib", type=int, default=None,
                    help="decoded-data budget in MiB, shared by all processes of a method (cubelake cache_bytes, "
                         "GDAL_CACHEMAX; default 512)")
    ap.add_argument("--random-count", type=int, default=None, help="random windows (default: the sliding count)")
    ap.add_argument("--baseline-samples", type=int, default=2048, help="samples timed per baseline run (0 = all)")
    ap.add_argument("--baseline-seconds", type=float, default=120.0, help="time limit per baseline run")
    ap.add_argument("--baseline-workers", type=int, default=2, help="DataLoader workers of the baselines")
    ap.add_argument("--consumer-ms", default="50,150", help="consumer compute per batch for the stall runs (ms, list)")
    ap.add_argument("--s3-samples", type=int, default=256, help="rasterio /vsis3/ samples (time-limited too)")
    ap.add_argument("--s3-seconds", type=float, default=90.0)
    ap.add_argument("--skip", default="",
                    help="comma-separated parts to skip: sliding, random, stall, s3, baselines, ceiling")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="fresh-process runs of each cubelake method; the median first epoch is reported (all are kept)")
    ap.add_argument("--rounds", type=int, default=0,
                    help="paired rounds: the ceiling, then a fresh in-process epoch, then a fresh 2-worker epoch, "
                         "N times in turn (sliding windows); ratios are taken within each round, and their median "
                         "reported, so the machine's drift between measurements does not enter them")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    skip = {s for s in a.skip.split(",") if s}
    global CHUNK, WIN
    CHUNK, WIN = a.chunk, a.window
    os.environ["CUBELAKE_BENCH_LOADER_GEOMETRY"] = f"{CHUNK},{WIN}"  # the spawned runs see the same geometry
    if a.size % CHUNK:
        ap.error(f"--size must be a multiple of {CHUNK}")
    t_start = time.perf_counter()
    work = a.workdir
    work.mkdir(parents=True, exist_ok=True)
    raw_total = a.size * a.size * a.bands * 2
    cache = (a.cache_mib or 512) * MiB
    cache_mb = cache // MiB
    raw_per_sample = a.bands * WIN * WIN * 2
    if a.size % WIN:
        ap.error(f"--size must be a multiple of --window ({WIN}) so the sliding epoch tiles the scene once")

    paths = ensure_lake(work, a.size, a.bands, a.reuse)
    cog_bytes, zarr_bytes = tree_bytes(paths["cog"]), tree_bytes(paths["zarr"])
    print(f"scene {paths['id']}: {a.bands}x{a.size}x{a.size} int16 = {raw_total / MiB:.0f} MiB raw; "
          f"COG {cog_bytes / MB:.0f} MB, Zarr {zarr_bytes / MB:.0f} MB; budget {cache_mb} MiB per method", flush=True)
    if cache >= raw_total:
        print(f"note: the budget ({cache_mb} MiB) holds the whole decoded cube: caches can serve every re-read", flush=True)
    warm_page_cache([paths["cog"], paths["zarr"]])

    # the windows: cubelake's own tables, so every method reads the same ones
    from cubelake.loaders import CubeDataset, PlanSpec, Sampling, Spectral

    def table(mode: str, count: int) -> np.ndarray:
        ds = CubeDataset([paths["scene"]], sampling=Sampling(mode=mode, size=WIN, stride=WIN, count=count, labels="none"),
                         spectral=Spectral(normalize="none"), plan=PlanSpec(seed=a.seed, batch_size=BATCH), prefer=("zarr",))
        return np.ascontiguousarray(ds.table(0).rows[:, 1:3])

    sliding = table("sliding", 1)
    count = a.random_count or len(sliding)
    random_w = table("random", count)
    rng = np.random.default_rng(a.seed + 1)
    doc: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "loadavg_start": os.getloadavg(), "args": {k: str(v) for k, v in vars(a).items()},
        "scene": {"id": str(paths["id"]), "shape": [a.bands, a.size, a.size], "raw_bytes": raw_total,
                  "cog_bytes": cog_bytes, "zarr_bytes": zarr_bytes, "chunk": [a.bands, CHUNK, CHUNK]},
        "code_start": code_version(), "budget_bytes": cache, "windows": {"sliding": len(sliding), "random": count},
        "baseline": {"samples": a.baseline_samples, "seconds": a.baseline_seconds, "workers": a.baseline_workers},
    }
    bw = a.baseline_workers
    gdal_env = {"GDAL_CACHEMAX": str(max(1, cache_mb // max(1, bw)))}
    chunk_raw = a.bands * CHUNK * CHUNK * 2
    cog_ratio = raw_total / cog_bytes
    results: dict[str, dict[str, Any]] = {}

    def baseline(mode: str, kind: str, windows: np.ndarray, label: str, **kw: Any) -> None:
        if "baselines" in skip:
            return
        limit = a.baseline_samples or len(windows)
        order = windows[rng.permutation(len(windows))]
        path = str(paths["cog"] if kind == "rasterio" else paths["zarr"])
        print(f"  {label} ...", flush=True)
        r = isolated(run_baseline, env=gdal_env if kind == "rasterio" else None, kind=kind, path=path, windows=order,
                     workers=bw, limit=limit, limit_s=a.baseline_seconds, width=a.size, **kw)
        if kind == "rasterio":
            r["decoded_bytes"] = r["read_bytes"] * cog_ratio
            r["how"] = "read: rchar; decoded: est. read x raw/COG bytes"
        else:
            r["decoded_bytes"] = r["chunk_gets"] * chunk_raw
            r["how"] = "read: rchar; decoded: counted chunk GETs x chunk bytes"
        r["ok"] = verify(paths["zarr"], r.pop("check"))
        results[f"{mode}/{kind}"] = {**r, "summary": summarise(r, raw_per_sample=raw_per_sample), "label": label}

    def cubelake(mode: str, windows_n: int, workers: int, label: str, key: str, **kw: Any) -> dict[str, Any]:
        print(f"  {label} ...", flush=True)
        threads = decode_threads(workers)
        product = kw.pop("product", str(paths["scene"]))
        # each run a fresh process; the run with the median first epoch stands for the method (--repeats)
        runs = [isolated(run_cubelake, product=product, mode=mode, count=count, seed=a.seed, cache_bytes=cache,
                         threads=threads, workers=workers, prefetch=8, **kw) for _ in range(a.repeats)]
        runs.sort(key=lambda run: run["epochs"][0]["seconds"])
        r = runs[len(runs) // 2]
        r["first_epoch_s_all_runs"] = [run["epochs"][0]["seconds"] for run in runs]
        ep = r["epochs"][0]
        m = ep["metrics"]
        row = {"samples": ep["samples"], "seconds": ep["seconds"], "read_bytes": m["bytes_fetched"],
               "decoded_bytes": m["bytes_decoded"], "full_epoch": ep["samples"] >= windows_n,
               "how": "LoaderMetrics (bytes_fetched, bytes_decoded)", "ok": verify(paths["zarr"], ep.pop("check"))}
        for e in r["epochs"][1:]:
            e.pop("check", None)
        results[key] = {**r, **row, "summary": summarise(row, raw_per_sample=raw_per_sample), "label": label}
        return results[key]

    if "ceiling" not in skip:
        print("\nceiling: zarr-python decode + float32 cast of the whole array ...", flush=True)
        doc["ceiling"] = isolated(run_ceiling, zarr_path=str(paths["zarr"]))
        c = doc["ceiling"]
        print(f"  whole a[...] + astype: {c['whole_s']:.3f} s; chunk by chunk on 2 threads, float32 written to memory: "
              f"{c['streaming2_s']:.3f} s -> ceiling {c['samples_per_s']:.0f} windows/s ({c['windows']} windows of {WIN} px)\n"
              f"  into one cache-resident buffer (no output written): {c['chunkwise_s']:.3f} s (1 thread), "
              f"{c['chunkwise2_s']:.3f} s (2 threads) -> floor {c['floor_samples_per_s']:.0f} windows/s", flush=True)

    for mode, windows in (("sliding", sliding), ("random", random_w)):
        if mode in skip:
            continue
        print(f"\n{mode} windows: {len(windows)} ({'every window at stride ' + str(WIN) + '' if mode == 'sliding' else 'random positions'})",
              flush=True)
        cubelake(mode, len(windows), 0, "(d) cubelake CubeDataset, in-process", f"{mode}/cubelake", epochs=2)
        cubelake(mode, len(windows), 2, "(d) cubelake CubeDataset, DataLoader 2 workers", f"{mode}/cubelake_w2", epochs=2)
        baseline(mode, "rasterio", windows, f"(a) rasterio per sample, COG, GDAL_CACHEMAX {gdal_env['GDAL_CACHEMAX']} MB x {bw}")
        if mode == "sliding":
            baseline(mode, "xbatcher", windows, "(b) xbatcher MapDataset over xr.open_zarr", xbatcher_grid=True)
        else:
            baseline(mode, "xbatcher", windows, "(b) xarray isel+load per sample (xbatcher's step)")
        baseline(mode, "zarr", windows, "(c) zarr per-sample slicing")

    if a.rounds:
        doc["rounds"] = paired_rounds(a.rounds, paths, len(sliding), cache, a.seed)

    if "stall" not in skip:
        print("\nstall: consumer compute per batch", flush=True)
        doc["stall"] = []
        for ms in [float(x) for x in a.consumer_ms.split(",") if x]:
            for workers in (0, 2):
                key = f"stall/{ms:g}ms/w{workers}"
                r = cubelake("sliding", len(sliding), workers, f"cubelake sliding, T_c {ms:g} ms, {workers} workers", key,
                             consumer_ms=ms)
                m = r["epochs"][0]["metrics"]
                b = max(1, m["batches"])
                # decode/assembly per batch: summed over workers, per batch delivered
                doc["stall"].append({"consumer_ms_target": ms, "consumer_ms": r["consumer_ms"], "workers": workers,
                                     "stall_fraction": m["stall_fraction"], "batches": m["batches"],
                                     "decode_ms_per_batch": m["decode_s"] / b * 1000,
                                     "assemble_ms_per_batch": m["assemble_s"] / b * 1000,
                                     "wait_s": m["wait_s"], "wall_s": m["wall_s"],
                                     "samples_per_s": r["summary"]["samples_per_s"]})

    if "s3" not in skip:
        print("\nS3 (moto server on 127.0.0.1) ...", flush=True)
        server, port = start_moto()
        try:
            up = upload(port, paths)
            sid = str(paths["id"])
            probe = isolated(s3_probe, port=port, keys={"zarr chunk object": f"{sid}.zarr/data/c/0/0/0",
                                                          "COG object": f"{sid}.tif"})
            opts = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "testing", "secret": "testing", "region": "us-east-1"}
            doc["s3"] = {"upload": up, "range_get_16k_s": probe}
            r = cubelake("sliding", len(sliding), 0, "(d) cubelake over S3, in-process", "s3/cubelake",
                         product=f"s3://{BUCKET}/{sid}.zarr", storage_options=opts)
            r["loopback_bytes"] = r["epochs"][0]["loopback_bytes"]
            print("  (a) rasterio per sample over /vsis3/ ...", flush=True)
            order = sliding[rng.permutation(len(sliding))]
            rr = isolated(run_baseline, env=gdal_env, kind="rasterio", path=f"/vsis3/{BUCKET}/{sid}.tif", windows=order,
                          workers=bw, limit=a.s3_samples, limit_s=a.s3_seconds, width=a.size,
                          s3={"endpoint": f"127.0.0.1:{port}"})
            rr["decoded_bytes"] = rr["read_bytes"] * cog_ratio
            rr["how"] = "read: loopback bytes received; decoded: est. read x raw/COG bytes"
            rr["ok"] = verify(paths["zarr"], rr.pop("check"))
            results["s3/rasterio"] = {**rr, "summary": summarise(rr, raw_per_sample=raw_per_sample),
                                      "label": "(a) rasterio per sample over /vsis3/"}
        finally:
            server.stop()

    # -- report
    doc["results"] = results
    for mode in ("sliding", "random", "s3"):
        rows = {v["label"]: v["summary"] for k, v in results.items() if k.startswith(mode + "/")}
        if rows:
            print_table(f"{mode} ({'2nd epochs are in the JSON' if mode != 's3' else 'S3'})", rows)
    ratios: dict[str, dict[str, float]] = {}
    for mode in ("sliding", "random", "s3"):
        for cl in ("cubelake", "cubelake_w2"):
            c = results.get(f"{mode}/{cl}")
            if c is None:
                continue
            for base in ("rasterio", "xbatcher", "zarr"):
                b = results.get(f"{mode}/{base}")
                if b is not None and b["summary"]["samples_per_s"] > 0:
                    ratios[f"{mode}: {cl} / {base}"] = c["summary"]["samples_per_s"] / b["summary"]["samples_per_s"]
    ceil = doc.get("ceiling")
    for key, label in (("sliding/cubelake", "sliding: cubelake in-process / ceiling"),
                       ("sliding/cubelake_w2", "sliding: cubelake 2 workers / ceiling")):
        if ceil is not None and key in results:
            ratios[label] = results[key]["summary"]["samples_per_s"] / ceil["samples_per_s"]
            ratios[label.replace("ceiling", "floor")] = results[key]["summary"]["samples_per_s"] / ceil["floor_samples_per_s"]
            # the second epoch of the same process: the memory it decodes and cuts into is no longer fresh
            later = results[key]["epochs"][1:2]
            if later:
                ratios[label.replace(" /", ", 2nd epoch /")] = ceil["seconds"] / later[0]["seconds"] * (
                    later[0]["samples"] / ceil["windows"])
    for mode in ("sliding", "random"):
        c0, c2 = results.get(f"{mode}/cubelake"), results.get(f"{mode}/cubelake_w2")
        if c0 is not None and c2 is not None:
            ratios[f"{mode}: cubelake 2 workers / in-process"] = c2["summary"]["samples_per_s"] / c0["summary"]["samples_per_s"]
    doc["ratios"] = ratios
    if ratios:
        print("\nratios (samples/s)")
        for k, v in ratios.items():
            print(f"  {k:<40} {v:8.2f}x")
    if doc.get("stall"):
        print("\nstall (sliding epoch; decode = chunk decode thread time per batch; assemble = cutting windows into the batch)")
        print(f"{'T_c ms':>8}{'workers':>9}{'stall':>8}{'decode ms/batch':>17}{'assemble ms/batch':>19}{'samples/s':>11}")
        for s in doc["stall"]:
            print(f"{s['consumer_ms']:>8.1f}{s['workers']:>9}{s['stall_fraction']:>8.1%}{s['decode_ms_per_batch']:>17.1f}"
                  f"{s['assemble_ms_per_batch']:>19.1f}{s['samples_per_s']:>11.1f}")
    if "s3" in doc:
        print(f"\nS3: upload {doc['s3']['upload']['seconds']:.0f} s; 16 KiB range GET (moto, median): " +
              ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in doc["s3"]["range_get_16k_s"].items()))
    for k, res in results.items():
        if len(res.get("first_epoch_s_all_runs", [])) > 1:
            print(f"{k}: first epoch in {len(res['first_epoch_s_all_runs'])} fresh processes: "
                  + ", ".join(f"{t:.3f}" for t in res["first_epoch_s_all_runs"]) + " s (the median run is reported)")
        if "epochs" in res and len(res["epochs"]) > 1:
            e = res["epochs"][1]
            print(f"{k}: 2nd epoch {e['samples']} samples in {e['seconds']:.2f} s ({e['samples'] / e['seconds']:.0f}/s)")
    print("\ncubelake chunk decodes (distinct chunks needed / decoded; plan's peak resident chunks vs budget per process)")
    for k, res in results.items():
        if "epochs" in res:
            m = res["epochs"][0]["metrics"]
            print(f"  {k:<22} {m['chunks_decoded'] - m['redecodes']:>5} / {m['chunks_decoded']:>5}   peak resident "
                  f"{max(res['peak_resident_chunks']):.0f} vs budget {res['budget_chunks_per_process']} chunks")
    c = results.get("sliding/cubelake")
    if c is not None:
        e = c["epochs"][0]
        print(f"check: in-process cubelake rchar {e['rchar'] / MB:.1f} MB vs bytes_fetched "
              f"{e['metrics']['bytes_fetched'] / MB:.1f} MB")

    doc["code_end"] = code_version()
    if doc["code_end"] != doc["code_start"]:
        print(f"WARNING: the loader's code changed during the run: {doc['code_start']} -> {doc['code_end']}")
    print(f"code: {doc['code_start']}")
    doc["total_s"] = time.perf_counter() - t_start
    import numcodecs
    import rasterio
    import xarray
    import xbatcher
    import zarr

    doc["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                      "loadavg_end": os.getloadavg(),
                      "versions": {"torch": torch.__version__, "zarr": zarr.__version__, "numcodecs": numcodecs.__version__,
                                   "xarray": xarray.__version__, "xbatcher": xbatcher.__version__,
                                   "rasterio": rasterio.__version__, "gdal": rasterio.__gdal_version__}}
    print(f"\ntotal {doc['total_s']:.0f} s")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)) + "\n")
        print(f"wrote {a.json}")
    if any(v.get("ok") is False for v in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
