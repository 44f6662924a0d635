"""Lakes on object storage: the same ingest, catalog search and loader on a local lake and an S3 lake.

One run starts an S3-protocol server (moto's ``moto_server``, **its own process** on 127.0.0.1,
credentials "testing"), so its CPU and memory are not counted in the client's figures; its CPU
seconds and peak RSS are recorded beside them. Then, in the same run:

1. **Ingest.** Two synthetic HSI-like scenes (``bench/synth.py``, int16, ``--bands`` bands, width
   4096, pixel-interleaved 256-tiled GeoTIFF; ``--size-gib`` and ``--small-gib``) are ingested by
   ``cubelake ingest --products cog,zarr`` as a subprocess under GNU time (wall s, peak RSS, CPU s)
   into (a) a local lake and (b) an S3 lake (``--lake s3://ingest/<run>``, AWS_* variables,
   CUBELAKE_STAGING for the local build folder). As root the page cache is dropped before each
   ingest, so both read the source cold. MB/s = source bytes (10^6) / wall s. The upload share is
   S3 wall - local wall. Ceiling: the scene's product files (from the local lake) uploaded with
   one plain ``obstore.put`` per file (8 MiB parts, 4 in flight: the library's settings), in a
   subprocess under GNU time; S3 ingest is compared with local ingest + that raw upload.
2. **Catalog search.** ``--items`` synthetic STAC items (``bench/catalog_synth.py``) indexed in a
   local lake (``CatalogIndex.insert_items`` into the lake's ``catalog.sqlite``, as reindex does)
   and published to an S3 lake through ``ObjectLakeCatalog``'s own publication path (a snapshot
   built in local staging, uploaded, the pointer ``catalog/index.json`` moved by conditional
   PUT). The items' JSON objects are not uploaded (search never reads them). Query kinds: bbox,
   datetime (one month), wavelength (``--limit 100``), and bbox+datetime+wavelength
   (``catalog_synth.make_queries``, ~100 hits). Latency of one search returning ids:
   *cold* (empty CUBELAKE_CACHE, new catalog: lake.json GET, pointer HEAD+GET, snapshot download,
   SQLite open, query), *warm open* (cached snapshot, new catalog: the same small requests, no
   download), *warm session* (one open catalog: SQLite only), and the local lake opened per
   search and held open. Both lakes must return the same ids for every query.
3. **Loader.** ``--loader-scenes`` synthetic scenes (``--loader-shape``, distinct seeds) ingested
   with products cog, zarr and refs into a local and an S3 lake; objects stay small (Zarr chunk
   objects ~9 MB, each scene's COG ~18 MB) because moto reads the whole object on every GET.
   ``CubeDataset(hits, lake=..., prefer=(zarr|refs))`` over the catalog's hits, 32x32 windows
   (all bands), batches of 64, float32, in-process (2 decode threads, 512 MiB budget), a new
   dataset per epoch; sliding epochs for zarr and refs, random windows for zarr. Ceiling: the same
   chunks' stored bytes read into memory first, then decoded by the loader's own decoder and cast
   to float32 on 2 threads (decode + cast, no I/O, no window cutting).

    python bench/s3_lake.py --json /tmp/bench/s3_lake.json
    python bench/s3_lake.py --quick            # ~3 minutes (smoke test)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules
from common import can_drop_caches, lo_rx  # noqa: E402
from ingest_throughput import (  # noqa: E402
    busy_cpu_seconds,
    ensure_scene,
    measure,
    scene_shape,
    wait_quiet,
    write_profile,
)

BIN = Path(sys.executable).parent
MB = 1e6
MiB = 1024**2
CHUNK = 256
WIN = 32
BATCH = 64
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
         "AWS_ALLOW_HTTP": "true"}


# -- the S3 server ----------------------------------------------------------------------------------


class Moto:
    """``moto_server`` in its own process on a free loopback port; samples its RSS and CPU."""

    def __init__(self, log: Path, nice: int = 0) -> None:
        import psutil

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "w")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=(lambda: set_nice(nice)) if nice else None)
        t0 = time.monotonic()
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                break
            if self.proc.poll() is not None or time.monotonic() - t0 > 30:
                raise RuntimeError(f"moto_server did not start (see {log})")
            time.sleep(0.1)
        self.ps = psutil.Process(self.proc.pid)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.peak_rss = max(self.peak_rss, self.ps.memory_info().rss)
            self._stop.wait(0.2)

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, **CREDS}

    def options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing", "region": "us-east-1"}

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=name)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def range_get_ms(moto: Moto, url: str, repeats: int = 5) -> float:
    """Median ms of a 16 KiB range GET on the object at ``url`` (moto's per-GET cost for that object)."""
    from cubelake.storage import object_at

    store, key = object_at(url, moto.options())
    ts = []
    for i in range(repeats):
        t0 = time.perf_counter()
        store.get_ranges(key, [4096 * i], [4096 * i + 16384])
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1000


# -- helpers ----------------------------------------------------------------------------------------


def child_env(moto: Moto, work: Path) -> dict[str, str]:
    return {**os.environ, **moto.env(), "CUBELAKE_STAGING": str(work / "staging"), "CUBELAKE_CACHE": str(work / "cache"),
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}


def s3_tree_bytes(url: str, options: dict[str, str]) -> tuple[int, int]:
    """(objects, bytes) under an S3 prefix."""
    from cubelake.storage import open_store

    n = size = 0
    for o in open_store(url, options).list(""):
        n += 1
        size += o.size
    return n, size


def delete_prefix(url: str, options: dict[str, str]) -> None:
    from cubelake.storage import open_store

    open_store(url, options).delete_prefix("")


def raw_upload(src: str, url: str) -> None:
    """The ceiling, run as its own process: one plain ``obstore.put`` per file of ``src`` under ``url``."""
    import obstore
    from obstore.store import S3Store

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    store = S3Store(bucket, endpoint=os.environ["AWS_ENDPOINT_URL"], access_key_id="testing", secret_access_key="testing",
                    region="us-east-1", virtual_hosted_style_request=False, client_options={"allow_http": True})
    root = Path(src)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        obstore.put(store, f"{prefix}/{f.relative_to(root).as_posix()}", f, chunk_size=8 * MiB, max_concurrency=4)


def set_nice(nice: int) -> None:
    """This process and its scheduler autogroup (its session's) at niceness ``nice`` (Linux; as root for < 0)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write(f"{nice}\n")


def read_through(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(16 * MiB):
            pass


class OtherCores:
    """CPU that processes other than this one and moto used while a block ran (cores, averaged)."""

    def __init__(self, moto: Moto) -> None:
        self.moto = moto

    def __enter__(self) -> OtherCores:
        self.t0, self.b0, self.m0 = time.perf_counter(), busy_cpu_seconds(), self.moto.cpu_s()
        self.s0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
        return self

    def __exit__(self, *exc: object) -> None:
        own = (sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
               - self.s0) + (self.moto.cpu_s() - self.m0)
        wall = time.perf_counter() - self.t0
        self.cores = max(0.0, busy_cpu_seconds() - self.b0 - own) / wall if wall else 0.0


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# -- 1. ingest ----------------------------------------------------------------------------------------


def part_ingest(a: argparse.Namespace, moto: Moto, work: Path) -> dict[str, Any]:
    import rasterio

    drop = can_drop_caches() and a.drop_caches
    profile = write_profile(work / "bench_profile.yaml", 3)
    env = child_env(moto, work)
    moto.create_bucket("ingest")
    moto.create_bucket("raw")
    sizes = {"small": a.small_gib, "large": a.size_gib}
    scenes = {}
    for tag, gib in sizes.items():
        h, w = scene_shape(gib, a.bands)
        scenes[tag] = ensure_scene(a.scenes, h, w, a.bands)
    out: dict[str, Any] = {"page_cache_dropped": drop, "scenes": {}, "runs": []}
    for tag, src in scenes.items():
        with rasterio.open(src) as ds:
            out["scenes"][tag] = {"path": str(src), "shape": [ds.count, ds.height, ds.width],
                                  "bytes": ds.count * ds.height * ds.width * 2}
    names = ", ".join(f"{t} {v['bytes'] / 2**30:.2f} GiB" for t, v in out["scenes"].items())
    print(f"\n[1] ingest: scenes {names}; page cache {'dropped before each ingest' if drop else 'kept'}", flush=True)
    for rnd in range(a.repeats):
        for tag, src in scenes.items():
            nbytes = out["scenes"][tag]["bytes"]
            local = work / "ingest" / f"local_{tag}"
            shutil.rmtree(local, ignore_errors=True)
            local.parent.mkdir(parents=True, exist_ok=True)
            run_id = f"{tag}-{rnd}-{uuid.uuid4().hex[:6]}"
            url = f"s3://ingest/{run_id}"
            rows = {}
            for kind, lake in (("local", str(local)), ("s3", url)):
                cmd = [str(BIN / "cubelake"), "-q", "ingest", str(src), "--lake", lake, "--profile", str(profile),
                       "--products", "cog,zarr", "--workers", "2"]
                waited = wait_quiet(a.quiet_wait)
                if not drop:
                    read_through(src)  # the source warm in the page cache for both lakes alike
                c0 = moto.cpu_s()
                r = measure(cmd, work / f"ingest_{kind}_{tag}.log", drop=drop, env=env, nice=a.nice)
                mc = moto.cpu_s() - c0
                other = max(0.0, r["other_cores"] * r["wall_s"] - mc)  # moto is ours, not another process
                r.update(moto_cpu_s=round(mc, 2), other_cores=round(other / r["wall_s"], 3), scene=tag, lake=kind,
                         round=rnd, mbps=nbytes / MB / r["wall_s"], waited_for_quiet_s=round(waited, 1))
                rows[kind] = r
                print(f"  {tag:<5} {kind:<5} round {rnd}: {r['wall_s']:6.1f} s  {r['mbps']:5.0f} MB/s  "
                      f"RSS {r['peak_rss_mib']:5.0f} MiB  CPU {r['cpu_s']:5.1f} s  moto CPU {r['moto_cpu_s']:5.1f} s  "
                      f"others {r['other_cores']:.2f} cores", flush=True)
            # the product bytes: the local scene folder (item.json aside) against what the S3 lake holds
            folder = next((local / "scenes").glob("*/scene.json")).parent
            local_bytes = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "item.json")
            n_obj, s3_bytes = s3_tree_bytes(f"{url}/scenes/{folder.name}/v", moto.options())
            # the ceiling: the same files, one plain obstore put each, in its own process
            raw_url = f"s3://raw/{run_id}"
            up_dir = work / "upload_src"
            shutil.rmtree(up_dir, ignore_errors=True)
            shutil.copytree(folder, up_dir, ignore=shutil.ignore_patterns("item.json"))  # warm, like a staged build
            wait_quiet(a.quiet_wait)
            c0 = moto.cpu_s()
            raw = measure([sys.executable, str(Path(__file__).resolve()), "--raw-upload", str(up_dir), raw_url],
                          work / f"raw_upload_{tag}.log", drop=False, env=env, nice=a.nice)
            mc = moto.cpu_s() - c0
            raw.update(moto_cpu_s=round(mc, 2), other_cores=round(max(0.0, raw["other_cores"] * raw["wall_s"] - mc)
                                                                  / raw["wall_s"], 3), scene=tag, lake="raw_upload", round=rnd,
                       product_bytes=local_bytes, mbps_products=local_bytes / MB / raw["wall_s"])
            n_raw, raw_bytes = s3_tree_bytes(raw_url, moto.options())
            print(f"  {tag:<5} raw obstore put of {local_bytes / MB:.0f} MB ({n_raw} objects): {raw['wall_s']:5.1f} s "
                  f"{raw['mbps_products']:5.0f} MB/s  RSS {raw['peak_rss_mib']:4.0f} MiB  moto CPU {raw['moto_cpu_s']:.1f} s",
                  flush=True)
            probe = {}
            if tag == "large" and rnd == a.repeats - 1:
                cog = next(f for f in folder.iterdir() if f.suffix == ".tif")
                chunk = next(f for f in (folder / f"{folder.name}.zarr").rglob("c/*/*/*") if f.is_file())
                probe = {"cog_object_bytes": cog.stat().st_size,
                         "cog_16k_range_get_ms": range_get_ms(moto, f"{raw_url}/{cog.name}"),
                         "zarr_chunk_object_bytes": chunk.stat().st_size,
                         "zarr_chunk_16k_range_get_ms": range_get_ms(moto, f"{raw_url}/{chunk.relative_to(folder).as_posix()}")}
                print(f"  moto 16 KiB range GET: COG object ({probe['cog_object_bytes'] / MB:.0f} MB) "
                      f"{probe['cog_16k_range_get_ms']:.1f} ms, Zarr chunk object ({probe['zarr_chunk_object_bytes'] / MB:.1f} MB) "
                      f"{probe['zarr_chunk_16k_range_get_ms']:.1f} ms", flush=True)
            out["runs"].append({"scene": tag, "round": rnd, "local": rows["local"], "s3": rows["s3"], "raw_upload": raw,
                                "product_bytes_local": local_bytes, "product_bytes_s3": s3_bytes, "s3_objects": n_obj,
                                "raw_bytes": raw_bytes, "probe": probe, "s3_url": url})
            if s3_bytes != local_bytes or raw_bytes != local_bytes:
                raise RuntimeError(f"{tag}: product bytes differ: local {local_bytes}, S3 lake {s3_bytes}, raw {raw_bytes}")
            for u in (url, raw_url):
                delete_prefix(u, moto.options())
            shutil.rmtree(up_dir, ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
    out["summary"] = summarise_ingest(out)
    return out


def summarise_ingest(out: dict[str, Any]) -> dict[str, Any]:
    summ = {}
    for tag, sc in out["scenes"].items():
        runs = [r for r in out["runs"] if r["scene"] == tag]
        loc = med([r["local"]["wall_s"] for r in runs])
        s3 = med([r["s3"]["wall_s"] for r in runs])
        raw = med([r["raw_upload"]["wall_s"] for r in runs])
        pb = runs[0]["product_bytes_local"]
        summ[tag] = {
            "source_bytes": sc["bytes"], "product_bytes": pb, "runs": len(runs),
            "local_s": loc, "s3_s": s3, "raw_upload_s": raw,
            "local_mbps": sc["bytes"] / MB / loc, "s3_mbps": sc["bytes"] / MB / s3,
            "local_rss_mib": max(r["local"]["peak_rss_mib"] for r in runs),
            "s3_rss_mib": max(r["s3"]["peak_rss_mib"] for r in runs),
            "raw_rss_mib": max(r["raw_upload"]["peak_rss_mib"] for r in runs),
            "local_cpu_s": med([r["local"]["cpu_s"] for r in runs]), "s3_cpu_s": med([r["s3"]["cpu_s"] for r in runs]),
            "raw_cpu_s": med([r["raw_upload"]["cpu_s"] for r in runs]),
            "s3_moto_cpu_s": med([r["s3"]["moto_cpu_s"] for r in runs]),
            "raw_moto_cpu_s": med([r["raw_upload"]["moto_cpu_s"] for r in runs]),
            "upload_share_s": s3 - loc, "upload_share_frac": (s3 - loc) / s3,
            "upload_mbps_in_ingest": pb / MB / (s3 - loc) if s3 > loc else float("nan"),
            "raw_upload_mbps": pb / MB / raw, "ceiling_s": loc + raw, "s3_vs_ceiling": (loc + raw) / s3,
            "s3_vs_local": loc / s3,
        }
    return summ


def print_ingest(doc: dict[str, Any]) -> None:
    s = doc["summary"]
    print("\ningest (median of runs; MB/s = source MB / wall s; RSS = peak of the ingest process)")
    print(f"{'scene':<22}{'lake':<24}{'s':>7}{'MB/s':>7}{'RSS MiB':>9}{'CPU s':>7}{'moto CPU s':>11}")
    for tag, r in s.items():
        name = f"{tag} {r['source_bytes'] / 2**30:.2f} GiB"
        print(f"{name:<22}{'local':<24}{r['local_s']:>7.1f}{r['local_mbps']:>7.0f}{r['local_rss_mib']:>9.0f}"
              f"{r['local_cpu_s']:>7.1f}{'':>11}")
        print(f"{'':<22}{'s3 (moto)':<24}{r['s3_s']:>7.1f}{r['s3_mbps']:>7.0f}{r['s3_rss_mib']:>9.0f}"
              f"{r['s3_cpu_s']:>7.1f}{r['s3_moto_cpu_s']:>11.1f}")
        print(f"{'':<22}{'raw obstore put/file':<24}{r['raw_upload_s']:>7.1f}{r['raw_upload_mbps']:>7.0f}"
              f"{r['raw_rss_mib']:>9.0f}{r['raw_cpu_s']:>7.1f}{r['raw_moto_cpu_s']:>11.1f}   "
              f"(MB/s of {r['product_bytes'] / MB:.0f} MB products)")
    print("\nupload share and ceiling")
    for tag, r in s.items():
        print(f"  {tag}: S3 - local = {r['upload_share_s']:.1f} s ({r['upload_share_frac']:.0%} of the S3 ingest; "
              f"{r['upload_mbps_in_ingest']:.0f} MB/s of products); local + raw upload = {r['ceiling_s']:.1f} s; "
              f"S3 ingest at {r['s3_vs_ceiling']:.2f}x of that ceiling, {r['s3_vs_local']:.2f}x of local speed")


# -- 2. catalog --------------------------------------------------------------------------------------


def catalog_queries(n_items: int, per_kind: int, seed: int) -> dict[str, list[Any]]:
    from catalog_synth import make_queries

    from cubelake.catalog import Query

    rng = np.random.default_rng(seed)
    base = make_queries(per_kind * 2, seed, n_items=n_items, target_hits=100)
    out: dict[str, list[Any]] = {"bbox": [], "datetime": [], "wavelength": [], "bbox+datetime+wavelength": []}
    for q in base[:per_kind]:
        out["bbox"].append(Query(bbox=q.bbox))
    for _ in range(per_kind):
        y, m = int(rng.integers(2015, 2025)), int(rng.integers(1, 13))
        out["datetime"].append(Query(datetime=f"{y}-{m:02d}"))
    for q in base[per_kind:]:
        out["wavelength"].append(Query(wavelength_nm=(q.wl_lo_um * 1000, q.wl_hi_um * 1000), limit=100))
    for q in base[:per_kind]:
        out["bbox+datetime+wavelength"].append(Query(bbox=q.bbox, datetime=(q.start, q.end),
                                                     wavelength_nm=(q.wl_lo_um * 1000, q.wl_hi_um * 1000)))
    return out


def timed_search(open_cat: Callable[[], Any], q: Any, cat: Any = None) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    if cat is None:
        with open_cat() as c:
            ids = [h.id for h in c.search(q)]
    else:
        ids = [h.id for h in cat.search(q)]
    return (time.perf_counter() - t0) * 1000, ids


def part_catalog(a: argparse.Namespace, moto: Moto, work: Path) -> dict[str, Any]:
    from catalog_synth import synthetic_items

    from cubelake.catalog import CatalogIndex, LakeCatalog
    from cubelake.catalog.lake import INDEX_FILE
    from cubelake.catalog.remote import ObjectLakeCatalog
    from cubelake.lake import Lake
    from cubelake.object_lake import ObjectLake

    n = a.items
    print(f"\n[2] catalog: {n} synthetic items", flush=True)
    root = work / "catalog"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    local = Lake(root / "local_lake")
    href = lambda it: f"scenes/{it['id']}/item.json"  # noqa: E731
    t0 = time.perf_counter()
    idx = CatalogIndex(local.root / INDEX_FILE)
    idx.insert_items(synthetic_items(n, a.seed), batch_size=1000, href=href)
    idx.analyze()
    idx.close()
    build_local = time.perf_counter() - t0
    index_bytes = (local.root / INDEX_FILE).stat().st_size
    print(f"  local index: {build_local:.1f} s, {index_bytes / MB:.0f} MB", flush=True)

    moto.create_bucket("catalog")
    url = "s3://catalog/lake"
    os.environ["CUBELAKE_CACHE"] = str(root / "cache_build")

    def fill(ix: Any) -> set[str]:
        ix.insert_items(synthetic_items(n, a.seed), batch_size=1000, href=href)
        ix.analyze()
        return set(ix.collections())

    t0 = time.perf_counter()
    remote = ObjectLakeCatalog(ObjectLake(url, options=moto.options()), create=True)
    # ObjectLakeCatalog's own publication (snapshot in staging, upload, pointer by conditional PUT);
    # the public route, reindex(), would first GET every item.json object, which this benchmark does not upload
    gen = remote._commit(fill, f"bench: {n} synthetic items")
    remote.close()
    build_s3 = time.perf_counter() - t0
    ptr = json.loads(remote.store.get_text("catalog/index.json"))
    print(f"  S3 index published (generation {gen}, {ptr['items']} items): {build_s3:.1f} s incl. its own build",
          flush=True)

    queries = catalog_queries(n, a.queries, a.seed)
    lat: dict[str, dict[str, list[float]]] = {k: {"cold": [], "warm_open": [], "warm_session": [], "local_open": [],
                                                  "local_session": []} for k in queries}
    hits: dict[str, list[int]] = {k: [] for k in queries}
    mismatches = []
    open_s3 = lambda: LakeCatalog(url)  # noqa: E731  (the URL alone: AWS_* variables, as a user's)
    open_local = lambda: LakeCatalog(local.root)  # noqa: E731
    oc = OtherCores(moto).__enter__()
    # cold: a fresh cache per search (the first query of each kind, --cold-repeats times)
    for r in range(a.cold_repeats):
        for kind, qs in queries.items():
            cache = root / f"cache_cold_{r}_{kind.replace('+', '_')}"
            os.environ["CUBELAKE_CACHE"] = str(cache)
            ms, _ = timed_search(open_s3, qs[r % len(qs)])
            lat[kind]["cold"].append(ms)
            shutil.rmtree(cache, ignore_errors=True)
    os.environ["CUBELAKE_CACHE"] = str(root / "cache_warm")
    with open_s3() as c:
        c.search(queries["bbox"][0])  # fills the cache
    with open_s3() as s3_cat, open_local() as loc_cat:
        s3_cat.search(queries["bbox"][0])
        loc_cat.search(queries["bbox"][0])
        for _ in range(a.repeats_catalog):
            for kind, qs in queries.items():
                for q in qs:
                    ms_wo, ids_wo = timed_search(open_s3, q)
                    ms_ws, ids_ws = timed_search(open_s3, q, s3_cat)
                    ms_lo, ids_lo = timed_search(open_local, q)
                    ms_ls, ids_ls = timed_search(open_local, q, loc_cat)
                    lat[kind]["warm_open"].append(ms_wo)
                    lat[kind]["warm_session"].append(ms_ws)
                    lat[kind]["local_open"].append(ms_lo)
                    lat[kind]["local_session"].append(ms_ls)
                    hits[kind].append(len(ids_lo))
                    if not (ids_wo == ids_ws == ids_lo == ids_ls):
                        mismatches.append({"kind": kind, "query": repr(q), "s3": len(ids_wo), "local": len(ids_lo)})
    oc.__exit__()
    # more items into each index: the S3 lake publishes a change set over its base (the snapshot is too
    # large to republish per item, FoldPolicy), a local lake upserts in place
    extra = json.loads(json.dumps(next(synthetic_items(1, a.seed + 1))))
    extra["id"] = "bench-extra-item"
    with open_local() as c:
        t0 = time.perf_counter()
        c.index.upsert(extra, href(extra))
        publish_one_local = time.perf_counter() - t0
    # what a warm open costs on the wire: lake.json GET, pointer HEAD + GET
    from cubelake.storage import open_store

    st = open_store(url, moto.options())
    small = []
    for _ in range(20):
        t0 = time.perf_counter()
        st.get_text("lake.json")
        st.head("catalog/index.json")
        st.get_text("catalog/index.json")
        small.append((time.perf_counter() - t0) * 1000)
    # the CLI, one search each way (interpreter start and imports included)
    cli = {}
    env = child_env(moto, root)
    q = queries["bbox+datetime+wavelength"][0]
    args = ["catalog", "search", f"--bbox={','.join(str(v) for v in q.bbox)}",
            f"--datetime={q.datetime[0]}/{q.datetime[1]}", f"--wavelength={q.wavelength_nm[0]}:{q.wavelength_nm[1]}",
            "--format", "summary"]
    shutil.rmtree(root / "cache_cli", ignore_errors=True)
    for name, lake in (("s3_cold", url), ("s3_warm", url), ("local", str(local.root))):
        t0 = time.perf_counter()
        p = subprocess.run([str(BIN / "cubelake"), *args, "--lake", lake], env={**env, "CUBELAKE_CACHE": str(root / "cache_cli")},
                           capture_output=True, text=True)
        cli[name] = {"wall_ms": (time.perf_counter() - t0) * 1000, "rc": p.returncode,
                     "items": len(json.loads(p.stdout)) if p.returncode == 0 else None,
                     "stderr": p.stderr[-600:] if p.returncode else ""}
        if p.returncode:
            print(f"  CLI search on {lake} failed (exit {p.returncode}): {p.stderr[-600:]}", flush=True)
    upd = index_updates(url, href, n, a.seed, root)  # after the searches and the CLI: it adds items to the S3 lake
    publish_one_s3 = upd["change_publish_s"]
    out = {"items": n, "index_bytes": index_bytes, "build_local_s": build_local, "build_and_publish_s3_s": build_s3,
           "generation": gen, "queries_per_kind": a.queries, "repeats": a.repeats_catalog, "cold_repeats": a.cold_repeats,
           "latency_ms": lat, "hits": hits, "other_cores": oc.cores, "publish_one_item_s3_s": publish_one_s3,
           "publish_one_item_local_s": publish_one_local, "updates": upd, "mismatches": mismatches, "warm_open_requests_ms": med(small), "cli": cli,
           "summary": {k: {m: med(v) for m, v in d.items()} | {"hits_median": med([float(x) for x in hits[k]])}
                       for k, d in lat.items()}}
    shutil.rmtree(root / "local_lake", ignore_errors=True)
    return out



def index_updates(url: str, href: Callable[[dict[str, Any]], str], n: int, seed: int, root: Path,
                  count: int = 20) -> dict[str, Any]:
    """Index updates on the S3 lake through ObjectLakeCatalog's own path: ``count`` items one at a time (each
    a change set over the base), a reader's first and second open after them, a largest change set the
    default policy allows, and one fold (the new base snapshot a large change set turns into)."""
    from catalog_synth import synthetic_items

    from cubelake.catalog import Query
    from cubelake.catalog.changes import Change, ChangeSet, FoldPolicy
    from cubelake.catalog.remote import ObjectLakeCatalog

    extra = list(synthetic_items(count, seed + 1))
    times = []
    for k, it in enumerate(extra):
        it = json.loads(json.dumps(it)) | {"id": f"bench-extra-{k:03d}"}
        with ObjectLakeCatalog(url) as cat:
            t0 = time.perf_counter()
            cat._commit_item(it["id"], Change(0, it, href(it)), "bench: one more item")
            times.append(time.perf_counter() - t0)
    ptr = json.loads(ObjectLakeCatalog(url).store.get_text("catalog/index.json"))
    assert ptr["changes"], ptr
    assert ptr["changes"]["entries"] == count, ptr
    with ObjectLakeCatalog(url) as cat:
        cs_bytes = cat.store.head(ptr["changes"]["key"]).size
        t0 = time.perf_counter()
        cat.search(Query(ids=["bench-extra-000"]))
        view_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ObjectLakeCatalog(url) as cat:
        assert [h.id for h in cat.search(Query(ids=["bench-extra-000"]))] == ["bench-extra-000"]
    view_warm = time.perf_counter() - t0
    policy = FoldPolicy()
    per_entry = cs_bytes / count
    per_fold = int(min(policy.max_entries(n), policy.max_bytes / per_entry))
    # the largest change set the policy lets through: publish it as one more change (read, extend, write)
    big = [json.loads(json.dumps(it)) | {"id": f"bench-big-{k:04d}"}
           for k, it in enumerate(synthetic_items(per_fold - count - 1, seed + 2))]
    with ObjectLakeCatalog(url) as cat:
        p, etag = cat._pointer()
        assert p is not None
        assert p.changes is not None
        cs = cat._changes(p) or ChangeSet(p.key)
        for it in big:
            cs = cs.with_change(it["id"], Change(p.generation + 1, it, href(it)))
        key = f"catalog/index/changes/{p.generation + 1:08d}-bench.json.gz"
        cat.store.put(key, cs.encode(), create=True)
        assert cat._move_pointer(dataclasses.replace(p, generation=p.generation + 1, changes=key,
                                                     changes_entries=len(cs.entries)), etag, key)
    with ObjectLakeCatalog(url) as cat:  # a writer with nothing cached: GET, extend, PUT the change set, move
        last = extra[0] | {"id": "bench-extra-last"}
        t0 = time.perf_counter()
        cat._commit_item(last["id"], Change(0, last, href(last)), "bench: one more item")
        max_change = time.perf_counter() - t0
        p, _ = cat._pointer()
        assert p is not None
        assert p.changes_entries == per_fold, p
    with ObjectLakeCatalog(url) as cat:  # one fold: materialise base + changes, upload a new base, move the pointer
        p, etag = cat._pointer()
        t0 = time.perf_counter()
        gen = cat._publish_snapshot(p, etag, lambda ix: set(), "bench: fold")
        fold = time.perf_counter() - t0
        assert gen is not None
    return {"changes": count, "change_publish_s": med(times), "change_set_bytes": cs_bytes, "bytes_per_entry": per_entry,
            "view_build_s": view_build, "view_warm_open_ms": view_warm * 1000, "items_per_fold": per_fold,
            "max_change_publish_s": max_change, "fold_s": fold,
            # a change set grows from one item to the largest: its cost on average is about the mean of the two
            "amortised_s": fold / per_fold + (med(times) + max_change) / 2}


def print_catalog(doc: dict[str, Any]) -> None:
    print(f"\ncatalog search, {doc['items']} items, index snapshot {doc['index_bytes'] / MB:.0f} MB "
          f"(median ms; cold over {doc['cold_repeats']} fresh caches, others over {doc['queries_per_kind']} queries "
          f"x {doc['repeats']} passes)")
    print(f"{'query':<26}{'hits':>6}{'S3 cold':>10}{'S3 warm open':>14}{'S3 session':>12}{'local open':>12}"
          f"{'local session':>15}{'warm/local':>12}")
    for k, s in doc["summary"].items():
        print(f"{k:<26}{s['hits_median']:>6.0f}{s['cold']:>10.1f}{s['warm_open']:>14.2f}{s['warm_session']:>12.2f}"
              f"{s['local_open']:>12.2f}{s['local_session']:>15.2f}{s['warm_open'] / s['local_open']:>11.2f}x")
    print(f"  lake.json GET + pointer HEAD + GET: {doc['warm_open_requests_ms']:.2f} ms (median of 20)")
    u = doc["updates"]
    print(f"  one more item: S3 {u['change_publish_s'] * 1000:.0f} ms (median of {u['changes']}: a change set of "
          f"~{u['bytes_per_entry'] / 1024:.1f} KiB per item over the base), local index upsert "
          f"{doc['publish_one_item_local_s'] * 1000:.1f} ms")
    print(f"  a fold (new {doc['index_bytes'] / MB:.0f} MB base): {u['fold_s']:.2f} s, every {u['items_per_fold']} "
          f"items -> {u['amortised_s'] * 1000:.0f} ms per item amortised (largest change set "
          f"{u['max_change_publish_s'] * 1000:.0f} ms); a reader after a change: first open {u['view_build_s']:.2f} s "
          f"(copy the cached base, apply), then {u['view_warm_open_ms']:.1f} ms")
    print("  CLI (one search, interpreter included): " + ", ".join(f"{k} {v['wall_ms']:.0f} ms ({v['items']} items)"
                                                               for k, v in doc["cli"].items()))
    print(f"  same ids on S3 and local for every query: {'yes' if not doc['mismatches'] else 'NO'}; other processes "
          f"used {doc['other_cores']:.2f} cores meanwhile")


# -- 3. loader ---------------------------------------------------------------------------------------


def loader_scenes(a: argparse.Namespace) -> list[Path]:
    from synth import cached_scenes

    h, w = (int(v) for v in a.loader_shape.split("x"))
    return cached_scenes(a.scenes / f"loader_{h}x{w}x{a.bands}", "tile", a.loader_scenes, height=h, width=w,
                         bands=a.bands, block=CHUNK, seed=1000)




def run_epoch(hits: list[Any], lake: str, prefer: str, mode: str, count: int, seed: int,
              options: dict[str, str] | None) -> dict[str, Any]:
    from cubelake.loaders import CubeDataset, PlanSpec, ReaderConfig, Sampling, Spectral

    t0 = time.perf_counter()
    ds = CubeDataset(hits, lake=lake, prefer=(prefer,), storage_options=options,  # type: ignore[arg-type]
                     sampling=Sampling(mode=mode, size=WIN, stride=WIN, count=count, labels="none"),  # type: ignore[arg-type]
                     spectral=Spectral(normalize="none"), plan=PlanSpec(seed=seed, batch_size=BATCH, chunks_per_round=8),
                     reader=ReaderConfig(cache_bytes=512 * MiB, threads=2), prefetch=8)
    t_open = time.perf_counter() - t0
    kinds = {s.kind for s in ds.sources}
    lo0 = lo_rx()
    n = 0
    checksum = 0.0
    t1 = time.perf_counter()
    for b in ds:
        n += int(b["image"].shape[0])
        checksum += float(b["image"][:, :, 0, 0].double().sum())
    dt = time.perf_counter() - t1
    m = ds.metrics().to_dict()
    return {"samples": n, "seconds": dt, "open_s": t_open, "samples_per_s": n / dt, "kinds": sorted(kinds),
            "bytes_fetched": m["bytes_fetched"], "bytes_decoded": m["bytes_decoded"], "chunks_decoded": m["chunks_decoded"],
            "requests": m["requests"], "loopback_bytes": lo_rx() - lo0, "checksum": checksum}


def ceiling(hits: list[Any], lake: str, prefer: str, threads: int = 2) -> dict[str, Any]:
    """Decode + cast of every chunk's stored bytes, already in memory (the loader's own decoders)."""
    from cubelake.loaders import CubeDataset, Sampling
    from cubelake.storage import split_url

    ds = CubeDataset(hits, lake=lake, prefer=(prefer,), sampling=Sampling(size=WIN, stride=WIN, labels="none"))
    jobs = []
    for src in ds.sources:
        for cy in range(src.grid.n_rows):
            for cx in range(src.grid.n_cols):
                for p in src.pieces(cy, cx):
                    path = split_url(p.url)[1]
                    with open(path, "rb") as f:
                        f.seek(max(0, p.offset))
                        raw = f.read() if p.length < 0 else f.read(p.length)
                    jobs.append((src.decoder, raw))
    stored = sum(len(r) for _, r in jobs)

    def work(job: tuple[Any, bytes]) -> int:
        arr = job[0](job[1], None)
        return int(arr.astype(np.float32).nbytes)

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            decoded = sum(pool.map(work, jobs))
        best = min(best, time.perf_counter() - t0)
    samples = ds.n_samples()
    return {"chunks": len(jobs), "stored_bytes": stored, "float32_bytes": decoded, "seconds": best,
            "samples": samples, "samples_per_s": samples / best, "threads": threads}


def part_loader(a: argparse.Namespace, moto: Moto, work: Path) -> dict[str, Any]:
    from cubelake.catalog import LakeCatalog, Query

    scenes = loader_scenes(a)
    h, w = (int(v) for v in a.loader_shape.split("x"))
    print(f"\n[3] loader: {len(scenes)} scenes of {a.bands}x{h}x{w} int16 ({len(scenes) * a.bands * h * w * 2 / MiB:.0f} MiB raw)",
          flush=True)
    root = work / "loader"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    profile = write_profile(root / "profile.yaml", 3)
    moto.create_bucket("loader")
    url = "s3://loader/lake"
    local = root / "local_lake"
    env = child_env(moto, root)
    ingest_s = {}
    for kind, lake in (("local", str(local)), ("s3", url)):
        t0 = time.perf_counter()
        subprocess.run([str(BIN / "cubelake"), "-q", "ingest", *map(str, scenes), "--lake", lake, "--profile", str(profile),
                        "--products", "cog,zarr,refs", "--workers", "2"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        ingest_s[kind] = time.perf_counter() - t0
        print(f"  ingested into the {kind} lake: {ingest_s[kind]:.1f} s", flush=True)
    os.environ["CUBELAKE_CACHE"] = str(root / "cache")
    with LakeCatalog(url) as c:
        hits_s3 = sorted(c.search(Query()), key=lambda hh: hh.id)
    with LakeCatalog(local) as c:
        hits_local = sorted(c.search(Query()), key=lambda hh: hh.id)
    if [x.id for x in hits_s3] != [x.id for x in hits_local] or len(hits_local) != len(scenes):
        raise RuntimeError(f"catalog hits differ: S3 {len(hits_s3)}, local {len(hits_local)}, scenes {len(scenes)}")
    # object sizes and moto's cost per GET on them
    from cubelake.object_lake import ObjectLake

    ol = ObjectLake(url, create=False, options=moto.options())
    loc0 = ol.scene_location(hits_s3[0].id)
    assert loc0 is not None
    objs = list(ol.store.list(loc0.split(f"{url}/", 1)[1]))
    cog = max((o for o in objs if o.key.endswith(".tif")), key=lambda o: o.size)
    chunk = max((o for o in objs if "/c/" in o.key), key=lambda o: o.size)
    probe = {"cog_object_bytes": cog.size, "cog_16k_range_get_ms": range_get_ms(moto, f"{url}/{cog.key}"),
             "zarr_chunk_object_bytes": chunk.size, "zarr_chunk_16k_range_get_ms": range_get_ms(moto, f"{url}/{chunk.key}")}
    print(f"  objects: COG {cog.size / MB:.1f} MB ({probe['cog_16k_range_get_ms']:.1f} ms per 16 KiB GET), largest Zarr "
          f"chunk {chunk.size / MB:.1f} MB ({probe['zarr_chunk_16k_range_get_ms']:.1f} ms)", flush=True)

    per_scene = (h // WIN) * (w // WIN)
    rows: dict[str, Any] = {}
    for prefer, mode in (("zarr", "sliding"), ("refs", "sliding"), ("cog", "sliding"), ("zarr", "random")):
        key = f"{prefer}/{mode}"
        rows[key] = {}
        for kind, hits, lake, opts in (("local", hits_local, str(local), None), ("s3", hits_s3, url, moto.options())):
            eps = []
            for e in range(a.epochs):
                c0 = moto.cpu_s()
                with OtherCores(moto) as oc:
                    r = run_epoch(hits, lake, prefer, mode, per_scene, a.seed + e, opts)
                r["moto_cpu_s"] = moto.cpu_s() - c0
                r["other_cores"] = oc.cores
                eps.append(r)
            rows[key][kind] = {"epochs": eps, "samples_per_s": med([x["samples_per_s"] for x in eps]),
                               "samples": eps[0]["samples"]}
            print(f"  {key:<13} {kind:<5}: " + ", ".join(f"{x['samples_per_s']:.0f}" for x in eps) + " samples/s "
                  f"(fetched {eps[0]['bytes_fetched'] / MB:.0f} MB, loopback {eps[0]['loopback_bytes'] / MB:.0f} MB, "
                  f"moto CPU {eps[0]['moto_cpu_s']:.1f} s; others {max(x['other_cores'] for x in eps):.2f} cores)",
                  flush=True)
        cs = [x["checksum"] for x in rows[key]["local"]["epochs"]]
        cs3 = [x["checksum"] for x in rows[key]["s3"]["epochs"]]
        rows[key]["same_samples"] = cs == cs3
    ceil = {}
    for prefer in ("zarr", "refs", "cog"):
        ceil[prefer] = ceiling(hits_local, str(local), prefer)
        c = ceil[prefer]
        print(f"  ceiling {prefer}: {c['chunks']} chunks, {c['stored_bytes'] / MB:.0f} MB stored -> decode+cast "
              f"{c['seconds']:.2f} s = {c['samples_per_s']:.0f} samples/s (2 threads)", flush=True)
    out = {"scenes": len(scenes), "shape": [a.bands, h, w], "ingest_s": ingest_s, "probe": probe, "rows": rows,
           "ceiling": ceil, "epochs": a.epochs}
    return out


def ceiling_of(prefer: str, lake: str) -> str:
    """Which ceiling a row's chunks have: a local lake's refs point at the source in place, an S3 lake's at its COG."""
    return "cog" if prefer == "refs" and lake == "s3" else prefer


def print_loader(doc: dict[str, Any]) -> None:
    print(f"\nloader ({doc['scenes']} scenes of {'x'.join(map(str, doc['shape']))}; median samples/s over {doc['epochs']} "
          "epochs; ceiling = decode + cast of the same stored chunks held in memory, 2 threads)")
    print(f"{'product / windows':<18}{'lake':<7}{'samples':>8}{'samples/s':>10}{'fetched MB':>11}{'ceiling':>9}"
          f"{'of ceiling':>11}{'S3/local':>9}{'same':>6}")
    for key, r in doc["rows"].items():
        prefer = key.split("/")[0]
        for lake in ("local", "s3"):
            x = r[lake]
            c = doc["ceiling"][ceiling_of(prefer, lake)]["samples_per_s"]
            ratio = f"{x['samples_per_s'] / r['local']['samples_per_s']:.2f}x" if lake == "s3" else ""
            same = ("yes" if r["same_samples"] else "NO") if lake == "s3" else ""
            print(f"{key if lake == 'local' else '':<18}{lake:<7}{x['samples']:>8}{x['samples_per_s']:>10.0f}"
                  f"{x['epochs'][0]['bytes_fetched'] / MB:>11.0f}{c:>9.0f}{x['samples_per_s'] / c:>10.0%}{ratio:>9}{same:>6}")
    for name, c in doc["ceiling"].items():
        print(f"  ceiling {name}: {c['chunks']} chunks, {c['stored_bytes'] / MB:.0f} MB stored, {c['seconds']:.2f} s")


# -- main ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes for a ~3 minute run (a smoke test)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench/s3_lake"), help="work folder (emptied parts)")
    ap.add_argument("--scenes", type=Path, default=Path("/tmp/bench"), help="synthetic scenes are kept here")
    ap.add_argument("--size-gib", type=float, default=None, help="large ingest scene (default 1.0; quick 0.5)")
    ap.add_argument("--small-gib", type=float, default=None, help="small ingest scene (default 0.25; quick 0.25)")
    ap.add_argument("--bands", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=None, help="ingest rounds (default 2; quick 1)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="as root, drop the page cache before each ingest (default: the source is read warm)")
    ap.add_argument("--quiet-wait", type=float, default=10.0,
                    help="before each ingest, wait up to this many seconds for other processes to go idle")
    ap.add_argument("--items", type=int, default=None, help="catalog items (default 100000; quick 10000)")
    ap.add_argument("--queries", type=int, default=None, help="queries per kind (default 5; quick 3)")
    ap.add_argument("--repeats-catalog", type=int, default=None, help="passes over the queries (default 3; quick 2)")
    ap.add_argument("--cold-repeats", type=int, default=None, help="cold searches per kind (default 3; quick 1)")
    ap.add_argument("--loader-scenes", type=int, default=None, help="loader scenes (default 24; quick 4)")
    ap.add_argument("--loader-shape", default="256x512", help="HxW of each loader scene (multiples of 256)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per loader row (default 3; quick 2)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: ingest, catalog, loader")
    ap.add_argument("--nice", type=int, default=0,
                    help="run everything (this process, moto, each measured subprocess in its own scheduler autogroup) at "
                         "this niceness, e.g. -10 as root so that other sessions' processes barely share the CPUs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--raw-upload", nargs=2, metavar=("SRC", "URL"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.raw_upload:
        raw_upload(*a.raw_upload)
        return
    q = a.quick
    defaults = {"size_gib": (1.0, 0.5), "small_gib": (0.25, 0.25), "repeats": (2, 1), "items": (100_000, 10_000),
                "queries": (5, 3), "repeats_catalog": (3, 2), "cold_repeats": (3, 1), "loader_scenes": (24, 4),
                "epochs": (3, 2)}
    for k, (full, quick) in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, quick if q else full)
    skip = {s for s in a.skip.split(",") if s}
    t_start = time.perf_counter()
    work = a.out
    work.mkdir(parents=True, exist_ok=True)
    a.scenes.mkdir(parents=True, exist_ok=True)
    if a.nice:
        set_nice(a.nice)
    moto = Moto(work / "moto_server.log", a.nice)
    os.environ.update(moto.env())
    print(f"moto_server pid {moto.proc.pid} at {moto.endpoint}", flush=True)
    doc: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "argv": sys.argv,
                           "args": {k: str(v) for k, v in vars(a).items() if k != "raw_upload"},
                           "loadavg_start": os.getloadavg()}
    try:
        if "ingest" not in skip:
            doc["ingest"] = part_ingest(a, moto, work)
        if "catalog" not in skip:
            doc["catalog"] = part_catalog(a, moto, work)
        if "loader" not in skip:
            doc["loader"] = part_loader(a, moto, work)
    finally:
        doc["moto"] = {"peak_rss_mib": moto.peak_rss / MiB, "cpu_s": moto.cpu_s()}
        moto.stop()
    doc["client_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    doc["total_s"] = time.perf_counter() - t_start
    import moto as moto_pkg
    import obstore

    doc["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                      "moto": moto_pkg.__version__, "obstore": obstore.__version__, "loadavg_end": os.getloadavg()}
    if "ingest" in doc:
        print_ingest(doc["ingest"])
    if "catalog" in doc:
        print_catalog(doc["catalog"])
    if "loader" in doc:
        print_loader(doc["loader"])
    print(f"\nbenchmark process peak RSS {doc['client_peak_rss_mib']:.0f} MiB; moto_server peak RSS "
          f"{doc['moto']['peak_rss_mib']:.0f} MiB, CPU {doc['moto']['cpu_s']:.0f} s; total {doc['total_s']:.0f} s")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {a.json}")
    bad = bool(doc.get("catalog", {}).get("mismatches")) or any(
        not r["same_samples"] for r in doc.get("loader", {}).get("rows", {}).values())
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
