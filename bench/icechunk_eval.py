"""Icechunk against the lake's own S3 layout (plain Zarr v3 under a version prefix + a pointer).

Everything runs against a moto S3 server started on 127.0.0.1 by this script (credentials
"testing"). Each measured phase runs in a fresh spawned process, so peak RSS and caches do not
leak from one method to the next; the moto server runs in the parent process.

Data: the real San Diego AVIRIS cube (``hsi_abu_anomaly/sandiego_plane.mat``, 100 x 100 x 189
uint16) tiled to ``--side`` x ``--side`` pixels. So that the copies are not byte-identical (zstd
would find the repeats and compress the tiled cube far better than the real one), every 100 x 100
copy gets a random one of the 8 flips/rotations and a random offset of -32..32 per band (seeded);
the script prints the compression ratio of the real cube beside the tiled one to show this.

Settings for both methods: array ``data`` (band, y, x), chunks ``(bands, --chunk, --chunk)``,
cubelake's Zarr codec (``ZarrCodecSpec()``: blosc zstd level 3, byte shuffle, 1 MiB blocks),
zarr-python's default async concurrency.

  (a) lake     zarr-python 3 on ``zarr.storage.ObjectStore(obstore S3Store)`` under
               ``scenes/<id>/v/<version>/<id>.zarr``, then one conditional PUT of
               ``scenes/<id>/HEAD.json`` (obstore ``mode="create"``). Readers GET the pointer first.
  (b) icechunk an Icechunk repository on the same server (``icechunk.s3_storage``), writable
               session on ``main``, the same zarr calls, then ``session.commit``.

Measured per method: write MB/s (uncompressed bytes / time of ``arr[:] = cube``), commit time,
objects and bytes stored, full read MB/s (``arr[:]``), random ``--window``-pixel windows with all
bands (sequential, like a per-sample reader), raw chunk-bytes fetch (the loader's access path: (a)
GETs the chunk objects by key with obstore; (b) has no chunk paths, so ``IcechunkStore.get`` of the
Zarr key, which resolves the manifest), and peak RSS above the process's baseline (psutil, sampled
every 5 ms). Also which plain clients (zarr without icechunk, GDAL's Zarr driver, xarray) can read
each layout.

(b2) Virtual chunks: a COG written by GDAL's COG driver (rasterio; ZSTD, 256 tiles, pixel
interleave, predictor 1 and 2) from a ``--cog-side`` crop of the cube, uploaded to S3, referenced
(i) by virtualizarr + virtual-tiff into Icechunk, (ii) by hand with ``store.set_virtual_ref``
(predictor 1 only: standard zarr codecs), (iii) by kerchunk ``tiff_to_zarr`` + fsspec's reference
filesystem; values compared with rasterio's, and read speeds against rasterio over /vsis3/.

(c) Concurrency: two Icechunk sessions committing to ``main`` (disjoint chunks, the same chunk,
truly simultaneous in two threads with and without ``rebase_with``), against two writers racing a
conditional PUT of the pointer (``mode="create"`` and ``mode={"e_tag": ...}``).

    pip install icechunk virtualizarr virtual-tiff    # optional benchmark extras
    python bench/icechunk_eval.py --json /tmp/bench/icechunk_eval.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import platform
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

BUCKET = "lake"
MB = 1e6
REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"
SOURCE = "hsi_abu_anomaly/sandiego_plane.mat"


def need_icechunk() -> Any:
    try:
        import icechunk
    except ImportError:
        raise SystemExit("bench/icechunk_eval.py needs Icechunk, an optional benchmark extra: "
                         "pip install icechunk   (and for the virtual-chunk part: "
                         "pip install virtualizarr virtual-tiff); on Python 3.11 pip gives icechunk 1.1.x, "
                         "2.x needs Python >= 3.12") from None
    return icechunk


# ---------------------------------------------------------------- data


def real_cube(real: Path) -> np.ndarray:
    """The real cube as (band, y, x) uint16."""
    import scipy.io

    data = scipy.io.loadmat(real / SOURCE)["data"]  # (y, x, band)
    return np.ascontiguousarray(np.moveaxis(np.asarray(data), 2, 0)).astype(np.uint16)


def tiled_cube(real: np.ndarray, side: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    nb, th, tw = real.shape
    out = np.empty((nb, side, side), np.uint16)
    for y in range(0, side, th):
        for x in range(0, side, tw):
            t = np.rot90(real, k=int(rng.integers(4)), axes=(1, 2))
            if rng.integers(2):
                t = t[:, :, ::-1]
            off = rng.integers(-32, 33, size=(nb, 1, 1))
            t = np.clip(t.astype(np.int32) + off, 0, 65535).astype(np.uint16)
            h, w = min(th, side - y), min(tw, side - x)
            out[:, y:y + h, x:x + w] = t[:, :h, :w]
    return out


def ensure_cube(work: Path, real: Path, side: int) -> Path:
    p = work / f"cube_{side}.npy"
    if not p.exists():
        np.save(p, tiled_cube(real_cube(real), side))
    return p


def ratio(a: np.ndarray, chunk: int) -> float:
    from numcodecs import Blosc

    codec = Blosc(cname="zstd", clevel=3, shuffle=Blosc.SHUFFLE, blocksize=1 << 20)
    raw = comp = 0
    for y in range(0, a.shape[1], chunk):
        for x in range(0, a.shape[2], chunk):
            c = np.ascontiguousarray(a[:, y:y + chunk, x:x + chunk])
            raw += c.nbytes
            comp += len(codec.encode(c))
    return raw / comp


# ---------------------------------------------------------------- S3 helpers


def s3_opts(ep: str) -> dict[str, Any]:
    return {"endpoint": ep, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "aws_region": "us-east-1"}


def obstore_s3(ep: str, prefix: str | None = None) -> Any:
    from obstore.store import S3Store

    o = s3_opts(ep)
    return S3Store(BUCKET, prefix=prefix, endpoint=o["endpoint"], access_key_id="testing",
                   secret_access_key="testing", region="us-east-1", client_options={"allow_http": True})


def ic_storage(ep: str, prefix: str) -> Any:
    ic = need_icechunk()
    return ic.s3_storage(bucket=BUCKET, prefix=prefix, region="us-east-1", endpoint_url=ep, allow_http=True,
                         access_key_id="testing", secret_access_key="testing", force_path_style=True)


def listing(ep: str, prefix: str) -> dict[str, Any]:
    """Objects and bytes under ``prefix``, total and by the next path component."""
    import obstore

    by: dict[str, list[int]] = {}
    n = size = 0
    for batch in obstore.list(obstore_s3(ep), prefix=prefix.rstrip("/") + "/"):
        for o in batch:
            rest = o["path"][len(prefix.rstrip("/")) + 1:]
            top = rest.split("/")[0] if "/" in rest else "(top)"
            e = by.setdefault(top, [0, 0])
            e[0] += 1
            e[1] += o["size"]
            n += 1
            size += o["size"]
    return {"objects": n, "bytes": size, "by_prefix": {k: {"objects": v[0], "bytes": v[1]} for k, v in sorted(by.items())}}


# ---------------------------------------------------------------- child-process harness


class PeakRSS:
    """Peak resident set size above the value at ``start()``, sampled every 5 ms."""

    def __init__(self) -> None:
        import psutil

        self.p = psutil.Process()
        self.peak = 0
        self.base = 0
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def start(self) -> PeakRSS:
        self.base = self.peak = self.p.memory_info().rss
        self._stop.clear()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.p.memory_info().rss)

    def stop(self) -> float:
        self._stop.set()
        assert self._t is not None
        self._t.join()
        self.peak = max(self.peak, self.p.memory_info().rss)
        return (self.peak - self.base) / MB


def in_child(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()


def codec() -> Any:
    from cubelake.ingest.zarr_writer import ZarrCodecSpec

    return ZarrCodecSpec().codec()


def make_arrays(group: Any, cube: np.ndarray, chunk: int) -> Any:
    nb = cube.shape[0]
    arr = group.create_array("data", shape=cube.shape, chunks=(nb, chunk, chunk), dtype=cube.dtype,
                             compressors=[codec()], fill_value=0, dimension_names=("band", "y", "x"))
    group.create_array("wavelength", data=np.linspace(400.0, 2500.0, nb), dimension_names=("band",))
    return arr


# ---------------------------------------------------------------- (a) and (b): write


def write_lake(ep: str, cube_path: str, chunk: int, version: str, scene: str) -> dict[str, Any]:
    import obstore
    import zarr
    from zarr.storage import ObjectStore

    cube = np.load(cube_path)
    prefix = f"scenes/{scene}/v/{version}/{scene}.zarr"
    rss = PeakRSS().start()
    t0 = time.perf_counter()
    g = zarr.create_group(ObjectStore(obstore_s3(ep, prefix)), zarr_format=3)
    arr = make_arrays(g, cube, chunk)
    arr[:] = cube
    t1 = time.perf_counter()
    head = json.dumps({"version": version, "zarr": f"v/{version}/{scene}.zarr"}).encode()
    obstore.put(obstore_s3(ep), f"scenes/{scene}/HEAD.json", head, mode="create")
    t2 = time.perf_counter()
    peak = rss.stop()
    return {"write_s": t1 - t0, "commit_s": t2 - t1, "write_mbps": cube.nbytes / MB / (t1 - t0),
            "write_peak_rss_mb": peak, "prefix": prefix}


def write_icechunk(ep: str, cube_path: str, chunk: int, prefix: str, scene: str) -> dict[str, Any]:
    ic = need_icechunk()
    import zarr

    cube = np.load(cube_path)
    rss = PeakRSS().start()
    t0 = time.perf_counter()
    repo = ic.Repository.create(ic_storage(ep, prefix))
    session = repo.writable_session("main")
    g = zarr.create_group(session.store, zarr_format=3)
    arr = make_arrays(g, cube, chunk)
    arr[:] = cube
    t1 = time.perf_counter()
    snap = session.commit(f"ingest {scene}")
    t2 = time.perf_counter()
    peak = rss.stop()
    return {"write_s": t1 - t0, "commit_s": t2 - t1, "write_mbps": cube.nbytes / MB / (t1 - t0),
            "write_peak_rss_mb": peak, "snapshot": snap}


# ---------------------------------------------------------------- (a) and (b): read


def windows(shape: tuple[int, ...], n: int, w: int, seed: int = 1) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(0, shape[1] - w + 1)), int(rng.integers(0, shape[2] - w + 1))) for _ in range(n)]


def open_lake(ep: str, scene: str) -> tuple[Any, Any, str]:
    import obstore
    import zarr
    from zarr.storage import ObjectStore

    head = json.loads(bytes(obstore.get(obstore_s3(ep), f"scenes/{scene}/HEAD.json").bytes()))
    prefix = f"scenes/{scene}/{head['zarr']}"
    store = ObjectStore(obstore_s3(ep, prefix), read_only=True)
    return zarr.open_group(store, mode="r"), store, prefix


def open_icechunk(ep: str, prefix: str) -> tuple[Any, Any]:
    ic = need_icechunk()
    import zarr

    repo = ic.Repository.open(ic_storage(ep, prefix))
    store = repo.readonly_session("main").store
    return zarr.open_group(store, mode="r"), store


async def fetch_all(get: Callable[[str], Any], keys: list[str], conc: int) -> int:
    sem = asyncio.Semaphore(conc)

    async def one(k: str) -> int:
        async with sem:
            b = await get(k)
            return len(b)

    return sum(await asyncio.gather(*(one(k) for k in keys)))


def read_bench(method: str, ep: str, prefix: str, n_windows: int, w: int, conc: int, scene: str) -> dict[str, Any]:
    import obstore
    from zarr.core.buffer import default_buffer_prototype

    rss = PeakRSS().start()
    t0 = time.perf_counter()
    if method == "lake":
        g, _store, zprefix = open_lake(ep, scene)
    else:
        g, store = open_icechunk(ep, prefix)
    arr = g["data"]
    t_open = time.perf_counter() - t0
    nb, h, wd = arr.shape
    _cb, ch, cw = arr.chunks
    keys = [f"data/c/0/{y}/{x}" for y in range(-(-h // ch)) for x in range(-(-wd // cw))]

    # raw chunk bytes by key, no decode (the loader's access path)
    t0 = time.perf_counter()
    if method == "lake":
        raw_store = obstore_s3(ep, zprefix)

        async def get(k: str) -> Any:
            return (await obstore.get_async(raw_store, k)).bytes()  # type: ignore[union-attr]
        nbytes = asyncio.run(fetch_all(get, keys, conc))
    else:
        proto = default_buffer_prototype()

        async def get(k: str) -> Any:
            b = await store.get(k, prototype=proto)
            return b.to_bytes()
        nbytes = asyncio.run(fetch_all(get, keys, conc))
    t_raw = time.perf_counter() - t0

    t0 = time.perf_counter()
    full = arr[:]
    t_full = time.perf_counter() - t0
    crc = int(np.frombuffer(full.tobytes(), np.uint64).sum() & 0xFFFFFFFF)
    del full

    wins = windows(arr.shape, n_windows, w)
    t0 = time.perf_counter()
    for y, x in wins:
        arr[:, y:y + w, x:x + w]
    t_win = time.perf_counter() - t0
    peak = rss.stop()
    raw_total = arr.nbytes
    return {"open_s": t_open, "raw_fetch_mbps": nbytes / MB / t_raw, "raw_fetch_chunks_per_s": len(keys) / t_raw,
            "full_read_mbps": raw_total / MB / t_full, "full_read_s": t_full, "checksum": crc,
            "windows_per_s": n_windows / t_win, "window_useful_mbps": n_windows * nb * w * w * 2 / MB / t_win,
            "read_peak_rss_mb": peak}


def readability(ep: str, lake_prefix: str, ic_prefix: str) -> dict[str, Any]:
    """Which clients that know nothing of Icechunk can open each layout."""
    import rasterio
    import xarray as xr
    import zarr
    from rasterio.session import AWSSession
    from zarr.storage import ObjectStore

    out: dict[str, Any] = {}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = f"ok: {fn()}"
        except Exception as e:  # the message is the result
            out[name] = f"FAILS: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"

    attempt("zarr-python on (a)", lambda: zarr.open_group(ObjectStore(obstore_s3(ep, lake_prefix), read_only=True),
                                                          mode="r")["data"].shape)
    attempt("zarr-python on (b) prefix", lambda: zarr.open_group(ObjectStore(obstore_s3(ep, ic_prefix), read_only=True),
                                                                 mode="r")["data"].shape)
    attempt("xarray open_zarr on (a)", lambda: dict(xr.open_zarr(ObjectStore(obstore_s3(ep, lake_prefix), read_only=True),
                                                                 consolidated=False).sizes))
    host = ep.split("://", 1)[1]
    env = {"AWS_HTTPS": "NO", "AWS_VIRTUAL_HOSTING": "FALSE", "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR"}
    sess = AWSSession(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1",
                      endpoint_url=host)

    def gdal(prefix: str) -> Any:
        with rasterio.Env(session=sess, **env), rasterio.open(f'ZARR:"/vsis3/{BUCKET}/{prefix}":/data') as ds:
            a = ds.read(1, window=((0, 8), (0, 8)))
            return f"{ds.count} bands {ds.height}x{ds.width}, band 1 [0:8,0:8] sum {int(a.sum())}"

    attempt("GDAL Zarr driver on (a)", lambda: gdal(lake_prefix))
    attempt("GDAL Zarr driver on (b) prefix", lambda: gdal(ic_prefix))
    return out


# ---------------------------------------------------------------- (b2) virtual chunks


def write_cog(cube: np.ndarray, path: Path, predictor: int) -> None:
    import rasterio
    import rasterio.shutil
    from rasterio.io import MemoryFile
    from rasterio.transform import from_origin

    nb, h, w = cube.shape
    with MemoryFile() as mf:
        with mf.open(driver="GTiff", width=w, height=h, count=nb, dtype=cube.dtype,
                     transform=from_origin(480000, 3620000, 3.5, 3.5), crs="EPSG:32611") as ds:
            ds.write(cube)
        with mf.open() as src:
            rasterio.shutil.copy(src, path, driver="COG", BLOCKSIZE=256, COMPRESS="ZSTD", LEVEL=3,
                                 PREDICTOR=str(predictor), OVERVIEWS="NONE", NUM_THREADS=2)


def virtual_bench(ep: str, cube_path: str, work: str, cog_side: int, cog_bands: int, n_windows: int,
                  w: int) -> dict[str, Any]:
    ic = need_icechunk()
    import obstore
    import rasterio
    import tifffile
    import zarr
    from rasterio.session import AWSSession

    cube = np.load(cube_path, mmap_mode="r")[:cog_bands, :cog_side, :cog_side]
    cube = np.ascontiguousarray(cube)
    nb = cube.shape[0]
    host = ep.split("://", 1)[1]
    sess = AWSSession(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1",
                      endpoint_url=host)
    genv = {"AWS_HTTPS": "NO", "AWS_VIRTUAL_HOSTING": "FALSE", "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
            "GDAL_CACHEMAX": 8}
    s3fs_opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": ep, "region_name": "us-east-1"}}
    wins = windows(cube.shape, n_windows, w, seed=2)
    res: dict[str, Any] = {"cog_shape": list(cube.shape), "gdal_cachemax_mb": 8}
    root = obstore_s3(ep)

    def err(e: BaseException) -> str:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"

    def speeds(read_full: Callable[[], np.ndarray], read_win: Callable[[int, int], np.ndarray],
               truth_yxb: np.ndarray) -> dict[str, Any]:
        """Full read and windows; arrays are (y, x, band)."""
        t_full = float("inf")
        for _ in range(2):  # best of 2
            t0 = time.perf_counter()
            full = read_full()
            t_full = min(t_full, time.perf_counter() - t0)
        equal = bool(np.array_equal(full, truth_yxb))
        t0 = time.perf_counter()
        weq = True
        for y, x in wins:
            weq &= bool(np.array_equal(read_win(y, x), truth_yxb[y:y + w, x:x + w]))
        t_win = time.perf_counter() - t0
        return {"equal_to_rasterio": equal and weq, "full_read_mbps": truth_yxb.nbytes / MB / t_full,
                "windows_per_s": n_windows / t_win}

    container = ic.VirtualChunkContainer(f"s3://{BUCKET}/", ic.s3_store(
        region="us-east-1", endpoint_url=ep, allow_http=True, s3_compatible=True, force_path_style=True))
    creds = ic.containers_credentials({f"s3://{BUCKET}/": ic.s3_static_credentials(
        access_key_id="testing", secret_access_key="testing")})

    def new_repo(prefix: str) -> Any:
        cfg = ic.RepositoryConfig.default()
        cfg.set_virtual_chunk_container(container)
        return ic.Repository.create(ic_storage(ep, prefix), config=cfg, authorize_virtual_chunk_access=creds)

    def reopen(prefix: str) -> Any:
        return ic.Repository.open(ic_storage(ep, prefix), authorize_virtual_chunk_access=creds)

    for pred in (1, 2):
        r: dict[str, Any] = {}
        res[f"predictor{pred}"] = r
        local = Path(work) / f"cog_pred{pred}.tif"
        write_cog(cube, local, pred)
        key = f"cogs/{local.name}"
        obstore.put(root, key, local.read_bytes())
        url = f"s3://{BUCKET}/{key}"
        r["cog_bytes"] = local.stat().st_size
        # moto reads the whole object for every GET: measure what one small ranged GET costs here
        t0 = time.perf_counter()
        for _ in range(10):
            obstore.get_range(root, key, start=0, length=16384)
        r["ranged_get_16k_ms"] = (time.perf_counter() - t0) / 10 * 1000

        # ground truth and baseline: rasterio over /vsis3/
        with rasterio.Env(session=sess, **genv), rasterio.open(f"/vsis3/{BUCKET}/{key}") as ds:
            truth = np.ascontiguousarray(np.moveaxis(ds.read(), 0, 2))
            assert np.array_equal(truth, np.moveaxis(cube, 0, 2)), "rasterio disagrees with the written cube"

            def rio_win(y: int, x: int, ds: Any = ds) -> np.ndarray:
                return np.moveaxis(ds.read(window=((y, y + w), (x, x + w))), 0, 2)

            r["rasterio"] = speeds(lambda ds=ds: np.moveaxis(ds.read(), 0, 2), rio_win, truth)

        # kerchunk + fsspec reference filesystem
        try:
            import imagecodecs.numcodecs
            import kerchunk.tiff
            from kerchunk.utils import refs_as_store

            imagecodecs.numcodecs.register_codecs(verbose=False)
            t0 = time.perf_counter()
            refs = kerchunk.tiff.tiff_to_zarr(url, remote_options=s3fs_opts)
            t_refs = time.perf_counter() - t0
            kstore = refs_as_store(refs, read_only=True, remote_protocol="s3",
                                   remote_options={**s3fs_opts, "asynchronous": True})
            ka = zarr.open_array(kstore, mode="r", zarr_format=2)
            r["kerchunk"] = {"refs_s": t_refs, "shape": list(ka.shape),
                             **speeds(lambda ka=ka: ka[:], lambda y, x, ka=ka: ka[y:y + w, x:x + w], truth)}
        except Exception as e:
            r["kerchunk"] = {"error": err(e), "trace": traceback.format_exc()[-1500:]}

        # (i) virtualizarr + virtual-tiff -> Icechunk
        try:
            from obspec_utils.registry import ObjectStoreRegistry
            from virtual_tiff import VirtualTIFF
            from virtualizarr import open_virtual_dataset

            prefix = f"icechunk-virtual/vt-pred{pred}-{uuid.uuid4().hex[:6]}"
            t0 = time.perf_counter()
            reg = ObjectStoreRegistry({f"s3://{BUCKET}": root})
            vds = open_virtual_dataset(url, registry=reg, parser=VirtualTIFF(ifd=0))
            repo = new_repo(prefix)
            s = repo.writable_session("main")
            vds.vz.to_icechunk(s.store)
            s.commit("virtual COG")
            t_build = time.perf_counter() - t0
            var = next(iter(vds.data_vars))
            g = zarr.open_group(reopen(prefix).readonly_session("main").store, mode="r")
            va = g[var]
            info = {"build_and_commit_s": t_build, "variable": var, "shape": list(va.shape),
                    "codecs": [type(c).__name__ for c in (*va.filters, va.serializer, *va.compressors)]}
            if tuple(va.shape) == truth.shape:
                r["icechunk_virtualtiff"] = {**info, **speeds(lambda va=va: va[:], lambda y, x, va=va: va[y:y + w, x:x + w], truth)}
            elif tuple(va.shape) == cube.shape:
                r["icechunk_virtualtiff"] = {**info, **speeds(lambda va=va: np.moveaxis(va[:], 0, 2),
                                                              lambda y, x, va=va: np.moveaxis(va[:, y:y + w, x:x + w], 0, 2), truth)}
            else:
                r["icechunk_virtualtiff"] = {**info, "error": "unexpected shape"}
        except Exception as e:
            r["icechunk_virtualtiff"] = {"error": err(e), "trace": traceback.format_exc()[-1500:]}

        # (ii) manifest refs by hand: TIFF tile offsets -> set_virtual_ref (standard zarr codecs only)
        if pred == 1:
            try:
                from zarr.codecs import BytesCodec, ZstdCodec

                prefix = f"icechunk-virtual/manual-{uuid.uuid4().hex[:6]}"
                t0 = time.perf_counter()
                with tifffile.TiffFile(local) as tf:
                    page = tf.pages[0]
                    offsets, counts = list(page.dataoffsets), list(page.databytecounts)
                    tl, tw = page.tilelength, page.tilewidth
                repo = new_repo(prefix)
                s = repo.writable_session("main")
                g = zarr.create_group(s.store, zarr_format=3)
                wd = truth.shape[1]
                g.create_array("data", shape=truth.shape, chunks=(tl, tw, nb), dtype=truth.dtype,
                               serializer=BytesCodec(endian="little"), compressors=[ZstdCodec()], fill_value=0,
                               dimension_names=("y", "x", "band"))
                ntx = -(-wd // tw)
                for i, (off, n) in enumerate(zip(offsets, counts, strict=True)):
                    s.store.set_virtual_ref(f"data/c/{i // ntx}/{i % ntx}/0", url, offset=int(off), length=int(n))
                s.commit("virtual COG by hand")
                t_build = time.perf_counter() - t0
                ma = zarr.open_group(reopen(prefix).readonly_session("main").store, mode="r")["data"]
                r["icechunk_manual"] = {"build_and_commit_s": t_build, "tiles": len(offsets),
                                        **speeds(lambda ma=ma: ma[:], lambda y, x, ma=ma: ma[y:y + w, x:x + w], truth)}
            except Exception as e:
                r["icechunk_manual"] = {"error": err(e), "trace": traceback.format_exc()[-1500:]}
    return res


# ---------------------------------------------------------------- (c) concurrency


def concurrency(ep: str, trials: int) -> dict[str, Any]:
    ic = need_icechunk()
    import obstore
    import zarr
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    out: dict[str, Any] = {}

    def err(e: BaseException) -> str:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"

    def fresh_repo() -> Any:
        repo = ic.Repository.create(ic_storage(ep, f"icechunk-conc/{uuid.uuid4().hex[:8]}"))
        s = repo.writable_session("main")
        g = zarr.create_group(s.store, zarr_format=3)
        g.create_array("data", shape=(4, 8), chunks=(1, 8), dtype="i4", fill_value=0)
        s.commit("init")
        return repo

    def two_sessions(repo: Any, rows: tuple[int, int]) -> tuple[Any, Any]:
        s1, s2 = repo.writable_session("main"), repo.writable_session("main")
        zarr.open_array(s1.store, path="data")[rows[0]] = 1
        zarr.open_array(s2.store, path="data")[rows[1]] = 2
        return s1, s2

    # sequential: the second writer commits after the first, then rebases with a solver
    solvers = {"BasicConflictSolver() (default: UseOurs)": lambda: ic.BasicConflictSolver(),
               "BasicConflictSolver(on_chunk_conflict=Fail)":
                   lambda: ic.BasicConflictSolver(on_chunk_conflict=ic.VersionSelection.Fail),
               "ConflictDetector()": lambda: ic.ConflictDetector()}
    for label, rows in (("disjoint chunks", (0, 1)), ("same chunk", (0, 0))):
        for sname, solver in solvers.items():
            repo = fresh_repo()
            s1, s2 = two_sessions(repo, rows)
            s1.commit("writer 1 (row := 1)")
            r: dict[str, Any] = {"writer1": "committed"}
            try:
                s2.commit("writer 2")
                r["writer2_commit"] = "committed (no conflict)"
            except ic.ConflictError as e:
                r["writer2_commit"] = err(e)
                try:
                    s2.rebase(solver())
                    s2.commit("writer 2 after rebase (row := 2)")
                    r["writer2_rebase"] = "rebased and committed"
                except ic.RebaseFailedError as e2:
                    r["writer2_rebase"] = err(e2) + f" conflicts={[str(c) for c in e2.conflicts][:2]}"
            final = zarr.open_array(repo.readonly_session("main").store, path="data", mode="r")[:2, 0]
            r["main_rows_0_1_first_value"] = final.tolist()
            out[f"icechunk sequential, {label}, rebase with {sname}"] = r

    # truly simultaneous commits from two threads
    def race(commit_fns: list[Callable[[], Any]]) -> list[str]:
        barrier = threading.Barrier(len(commit_fns))
        res = [""] * len(commit_fns)

        def run(i: int) -> None:
            barrier.wait()
            try:
                commit_fns[i]()
                res[i] = "ok"
            except Exception as e:  # the outcome is the result
                res[i] = type(e).__name__
        ts = [threading.Thread(target=run, args=(i,)) for i in range(len(commit_fns))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return res

    for label, kw in (("no rebase", {}), ("rebase_with=BasicConflictSolver", {"rebase_with": ic.BasicConflictSolver()})):
        tally: dict[str, int] = {}
        lost = 0
        t_commit: list[float] = []
        for _ in range(trials):
            repo = fresh_repo()
            s1, s2 = two_sessions(repo, (0, 1))

            def c(s: Any, kw: dict[str, Any] = kw, t_commit: list[float] = t_commit) -> None:
                t0 = time.perf_counter()
                s.commit("race", **kw)
                t_commit.append(time.perf_counter() - t0)
            res = race([lambda s1=s1: c(s1), lambda s2=s2: c(s2)])
            key = " + ".join(sorted(res))
            tally[key] = tally.get(key, 0) + 1
            final = zarr.open_array(repo.readonly_session("main").store, path="data", mode="r")[:2]
            want = {"ok": 1}
            got = int((final[0] == 1).all()) + int((final[1] == 2).all())
            if got < sum(want.get(x, 0) for x in res):
                lost += 1
        out[f"icechunk simultaneous ({label}), {trials} trials"] = {
            "outcomes": tally, "lost_updates": lost, "median_commit_s": float(np.median(t_commit)) if t_commit else None}

    # the lake's pointer: conditional PUT (create, then compare-and-swap on the ETag)
    root = obstore_s3(ep)
    tally_c: dict[str, int] = {}
    tally_u: dict[str, int] = {}
    t_put: list[float] = []
    for i in range(trials):
        key = f"scenes/race-{uuid.uuid4().hex[:8]}/HEAD.json"

        def create(v: str, key: str = key) -> None:
            t0 = time.perf_counter()
            obstore.put(root, key, json.dumps({"version": v}).encode(), mode="create")
            t_put.append(time.perf_counter() - t0)
        res = race([lambda: create("v1"), lambda: create("v2")])
        k = " + ".join(sorted(res))
        tally_c[k] = tally_c.get(k, 0) + 1
        etag = obstore.head(root, key)["e_tag"]

        def update(v: str, key: str = key, etag: Any = etag) -> None:
            obstore.put(root, key, json.dumps({"version": v}).encode(), mode={"e_tag": etag})
        res = race([lambda i=i: update(f"v3-{i}"), lambda i=i: update(f"v4-{i}")])
        k = " + ".join(sorted(res))
        tally_u[k] = tally_u.get(k, 0) + 1
    out[f"pointer create (mode='create'), {trials} trials"] = {"outcomes": tally_c, "median_put_s": float(np.median(t_put)),
                                                               "loser_error": AlreadyExistsError.__name__}
    out[f"pointer update (mode={{'e_tag': ...}}), {trials} trials"] = {"outcomes": tally_u,
                                                                     "loser_error": PreconditionError.__name__}
    return out


def gc_check(ep: str, prefix: str, chunk: int, cube_path: str) -> dict[str, Any]:
    """Rewrite the scene in a second commit, expire the first snapshot, run Icechunk's GC."""
    ic = need_icechunk()
    import zarr

    cube = np.load(cube_path)
    repo = ic.Repository.open(ic_storage(ep, prefix))
    before = listing(ep, prefix)
    s = repo.writable_session("main")
    arr = zarr.open_array(s.store, path="data")
    arr[:] = cube + 1
    s.commit("re-ingest")
    mid = listing(ep, prefix)
    t0 = time.perf_counter()
    expired = repo.expire_snapshots(datetime.now(UTC))
    t1 = time.perf_counter()
    summary = repo.garbage_collect(datetime.now(UTC))
    t2 = time.perf_counter()
    after = listing(ep, prefix)
    return {"objects_before": before["objects"], "objects_after_rewrite": mid["objects"],
            "objects_after_gc": after["objects"], "bytes_after_gc": after["bytes"], "expired_snapshots": len(expired),
            "expire_s": t1 - t0, "gc_s": t2 - t1,
            "gc_summary": {k: getattr(summary, k) for k in dir(summary) if not k.startswith("_")}}


# ---------------------------------------------------------------- main


def start_moto() -> tuple[Any, str]:
    import os

    from moto.server import ThreadedMotoServer

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(k, "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    ep = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=ep, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return srv, ep


def fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in header:
            t.add_column(h)
        for r in rows:
            t.add_row(*[fmt(c) for c in r])
        Console(width=160).print(t)
    except ImportError:
        print(f"\n{title}\n" + " | ".join(header))
        for r in rows:
            print(" | ".join(fmt(c) for c in r))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", type=int, default=1024, help="tiled cube side in pixels (default 1024)")
    ap.add_argument("--chunk", type=int, default=128, help="chunk side in pixels; chunks hold all bands (default 128)")
    ap.add_argument("--window", type=int, default=32, help="random window side (default 32)")
    ap.add_argument("--windows", type=int, default=200, help="random windows per method (default 200)")
    ap.add_argument("--cog-side", type=int, default=512, help="side of the COG crop for virtual chunks (default 512)")
    ap.add_argument("--cog-bands", type=int, default=40,
                    help="bands of the COG crop (default 40: the COG object stays near 16 MB; moto reads whole objects)")
    ap.add_argument("--cog-windows", type=int, default=50)
    ap.add_argument("--trials", type=int, default=10, help="concurrency trials (default 10)")
    ap.add_argument("--concurrency", type=int, default=8, help="concurrent raw chunk GETs (default 8)")
    ap.add_argument("--repeats", type=int, default=2, help="write/read rounds per method, best kept (default 2)")
    ap.add_argument("--real", type=Path, default=REAL, help="folder of the real data (shared/data/real)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench/icechunk"))
    ap.add_argument("--json", type=Path, help="write all results here")
    a = ap.parse_args()
    ic = need_icechunk()
    import zarr

    a.workdir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    cube_path = str(ensure_cube(a.workdir, a.real, a.side))
    cube = np.load(cube_path, mmap_mode="r")
    real = real_cube(a.real)
    info = {"source": SOURCE, "real_shape": list(real.shape), "cube_shape": list(cube.shape), "dtype": str(cube.dtype),
            "cube_mb": cube.nbytes / MB, "chunks": [cube.shape[0], a.chunk, a.chunk],
            "ratio_real_cube": ratio(real, a.chunk), "ratio_tiled_cube": ratio(np.asarray(cube[:, :512, :512]), a.chunk),
            "icechunk": ic.__version__, "zarr": zarr.__version__, "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(), "date": datetime.now(UTC).isoformat(timespec="seconds")}
    print(json.dumps(info, indent=1))
    srv, ep = start_moto()
    results: dict[str, Any] = {"info": info, "args": {k: str(v) for k, v in vars(a).items()}}
    try:
        runs: dict[str, list[dict[str, Any]]] = {"lake": [], "icechunk": []}
        stored: dict[str, Any] = {}
        ic_prefix = ""
        for rep in range(a.repeats):
            # a fresh scene id per round for the lake, a fresh repository for icechunk
            scene = f"sandiego-tiled-{rep}"
            w_lake = in_child(write_lake, ep, cube_path, a.chunk, uuid.uuid4().hex[:12], scene)
            ic_prefix = f"icechunk/{scene}"
            w_ic = in_child(write_icechunk, ep, cube_path, a.chunk, ic_prefix, scene)
            r_lake = in_child(read_bench, "lake", ep, "", a.windows, a.window, a.concurrency, scene)
            r_ic = in_child(read_bench, "icechunk", ep, ic_prefix, a.windows, a.window, a.concurrency, scene)
            assert r_lake["checksum"] == r_ic["checksum"], "the two stores returned different data"
            runs["lake"].append({**w_lake, **r_lake})
            runs["icechunk"].append({**w_ic, **r_ic})
            stored = {"lake": listing(ep, w_lake["prefix"]), "icechunk": listing(ep, ic_prefix)}
            print(f"round {rep + 1}: lake write {w_lake['write_mbps']:.0f} MB/s, icechunk write {w_ic['write_mbps']:.0f} MB/s")
        results["runs"] = runs
        results["stored"] = stored
        lake_prefix = runs["lake"][-1]["prefix"]
        results["readability"] = in_child(readability, ep, lake_prefix, ic_prefix)
        results["gc"] = in_child(gc_check, ep, ic_prefix, a.chunk, cube_path)
        results["virtual"] = in_child(virtual_bench, ep, cube_path, str(a.workdir), a.cog_side, a.cog_bands,
                                      a.cog_windows, a.window)
        results["concurrency"] = in_child(concurrency, ep, a.trials)
    finally:
        srv.stop()
    results["total_s"] = time.perf_counter() - t_start

    def med(m: str, k: str) -> float:
        return float(np.median([r[k] for r in results["runs"][m]]))

    rows = []
    for m, label in (("lake", "(a) zarr + version prefix + pointer PUT"), ("icechunk", f"(b) icechunk {ic.__version__}")):
        st = results["stored"][m]
        rows.append([label, med(m, "write_mbps"), med(m, "commit_s") * 1000, med(m, "full_read_mbps"),
                     med(m, "windows_per_s"), med(m, "raw_fetch_mbps"), med(m, "open_s") * 1000,
                     st["objects"], st["bytes"] / MB, med(m, "write_peak_rss_mb"), med(m, "read_peak_rss_mb")])
    print_table(f"(a) vs (b): {info['cube_shape']} uint16 ({info['cube_mb']:.0f} MB), chunks {info['chunks']}, blosc zstd-3 shuffle",
                ["method (median of rounds)", "write MB/s", "commit ms", "full read MB/s", f"{a.window}² windows/s", "raw chunk GET MB/s",
                 "open ms", "objects", "stored MB", "write peak RSS MB", "read peak RSS MB"], rows)
    for m in ("lake", "icechunk"):
        print(m, json.dumps(results["stored"][m]["by_prefix"]))
    print_table("readability by clients that do not know Icechunk", ["client", "result"],
                [[k, v] for k, v in results["readability"].items()])
    vrows = []
    for pk, pv in results["virtual"].items():
        if not pk.startswith("predictor"):
            continue
        for mk in ("rasterio", "kerchunk", "icechunk_virtualtiff", "icechunk_manual"):
            if mk in pv:
                v = pv[mk]
                vrows.append([pk, mk, v.get("equal_to_rasterio", "-"), v.get("full_read_mbps"), v.get("windows_per_s"),
                              " ".join(v.get("codecs", [])), v.get("error", "")[:90]])
    vp = results["virtual"]["predictor1"]
    print_table(f"(b2) virtual chunks of a COG on S3 {results['virtual']['cog_shape']}, {vp['cog_bytes'] / MB:.1f} MB "
                f"(one ranged 16 KiB GET on it: {vp['ranged_get_16k_ms']:.1f} ms)",
                ["COG", "method", "equal", "full read MB/s", f"{a.window}² windows/s", "zarr codecs", "error"], vrows)
    print_table("(c) concurrency", ["scenario", "result"], [[k, json.dumps(v)] for k, v in results["concurrency"].items()])
    print("gc:", json.dumps(results["gc"], default=str))
    print(f"total {results['total_s']:.0f} s")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
