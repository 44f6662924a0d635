"""Catalog search (issue 4): cubelake's SQLite index against stac-geoparquet read with pyarrow.

One run, one set of items, one set of queries, for both sides:

1. ``--items`` synthetic STAC 1.1 items (``bench/catalog_synth.py``: six sensor collections over
   the globe and 2015-2024, 7 to 425 bands each, ~3 % crossing the antimeridian; seeded, made
   again for each consumer: lazily for the baseline, all before the timed pass for cubelake).
2. **cubelake**: ``CatalogIndex(db).insert_items(items, batch_size)`` then ``analyze()`` (as
   ``cubelake catalog reindex`` does); timed. The items are generated first, timed and reported
   apart, and held in memory (~3 GB at 1M items; the garbage collector frozen over them, so it
   does not walk them): ``insert_items`` writes each batch on a thread of its own while it reads
   the next, so generation inside the timed pass would overlap index work and its time could not
   be subtracted. items/s is the index's own rate. ``--stream-items`` generates them inside the
   pass instead (timed apart), as runs before the writer thread did (honest only for serial writing).
3. **baseline**: the same items written with ``stac_geoparquet.arrow`` (``parse_stac_items_to_arrow``
   + ``to_parquet``, ``--parquet-chunk`` items per row group; ~80 % of its time is
   stac-geoparquet's deep copy of every input dict), timed the same way. Searched by
   ``geoparquet_search``: bbox and datetime filters pushed to pyarrow's dataset reader (row
   groups pruned on their statistics: items are written in time order, so datetime prunes), the
   wavelength check on the rows that pass, then shapely's exact intersection.
4. ``--queries`` searches (bbox + datetime interval + wavelength range; ``make_queries`` sizes
   each box for ~``--target-hits`` items at ``--items``): one untimed warm-up query per side,
   then every query on the index (opened once), then every query on the parquet dataset
   (opened once). Latency = wall time of one search call returning the list of ids (ms).
5. Both sides must return the same id set for every query; the first mismatch is printed with
   each differing item's own data, and the run exits 1.

Before the run, the baseline's wavelength rule is checked against cubelake's own
(``cubelake.catalog.coverage``) on every band set and query range used.

    python bench/catalog.py --items 1000000 --queries 200 --json /tmp/bench/catalog.json
    python bench/catalog.py --quick          # 20,000 items
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import shapely

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules
from catalog_synth import (  # noqa: E402
    _POOL,
    GAP_FRACTION,
    BenchQuery,
    covers,
    geoparquet_search,
    make_queries,
    merged_intervals_nm,
    open_geoparquet,
    query_geometry,
    synthetic_items,
    write_geoparquet,
)

from cubelake.catalog import CatalogIndex, Query  # noqa: E402

QUICK_ITEMS = 20_000


class TimedIter:
    """Wraps an iterator and adds up the seconds spent in its ``__next__`` (item generation)."""

    def __init__(self, it: Iterator[dict[str, Any]]) -> None:
        self.it = it
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # this process's CPU time in generation (the machine may be shared)
        self.count = 0

    def __iter__(self) -> TimedIter:
        return self

    def __next__(self) -> dict[str, Any]:
        t, c = time.perf_counter(), time.process_time()
        try:
            item = next(self.it)
        finally:
            self.seconds += time.perf_counter() - t
            self.cpu_seconds += time.process_time() - c
        self.count += 1
        return item


def _rates(n: int, wall: float, gen: float, cpu: float | None = None, gen_cpu: float | None = None) -> dict[str, float]:
    """Items/s net of generation; with ``cpu``/``gen_cpu`` (process CPU seconds) also per CPU second,
    which other work on a shared machine does not dilute."""
    out = {"wall_s": wall, "generation_s": gen, "net_s": wall - gen,
           "items_per_s": n / (wall - gen) if wall > gen else float("nan"),
           "items_per_s_incl_generation": n / wall}
    if cpu is not None and gen_cpu is not None:
        out |= {"cpu_s": cpu, "generation_cpu_s": gen_cpu, "net_cpu_s": cpu - gen_cpu,
                "items_per_cpu_s": n / (cpu - gen_cpu) if cpu > gen_cpu else float("nan")}
    return out


def _db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists())


def _remove_db(db: Path) -> None:
    for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        p.unlink(missing_ok=True)


# -- building -----------------------------------------------------------------------------------
def build_index(db: Path, n: int, seed: int, time_ordered: bool, batch_size: int,
                stream: bool = False) -> dict[str, Any]:
    _remove_db(db)
    gen = TimedIter(synthetic_items(n, seed, time_ordered=time_ordered))
    items: Iterator[dict[str, Any]] | list[dict[str, Any]] = gen
    if not stream:  # generated before the timed pass (see the module docstring)
        items = list(gen)
        gc.collect()
        gc.freeze()
    try:
        idx = CatalogIndex(db)
        t0, c0 = time.perf_counter(), time.process_time()
        count = idx.insert_items(items, batch_size=batch_size)
        t1, c1 = time.perf_counter(), time.process_time()
        idx.analyze()
        t2 = time.perf_counter()
    finally:
        del items
        gc.unfreeze()
    idx.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    indexed = len(idx)
    idx.close()
    if count != n or indexed != n:
        raise SystemExit(f"cubelake indexed {count} items ({indexed} in the index), expected {n}")
    # wall/CPU of generation and insertion together, as for a streamed pass: net_s is the insertion alone
    extra, extra_cpu = (0.0, 0.0) if stream else (gen.seconds, gen.cpu_seconds)
    return {"insert": _rates(n, t1 - t0 + extra, gen.seconds, c1 - c0 + extra_cpu, gen.cpu_seconds),
            "analyze_s": t2 - t1, "build_items_per_s": n / (t2 - t0 - (gen.seconds if stream else 0.0)),
            "batch_size": batch_size, "items": "streamed" if stream else "in memory", "bytes": _db_bytes(db)}


def build_parquet(path: Path, n: int, seed: int, time_ordered: bool, chunk: int) -> dict[str, Any]:
    path.unlink(missing_ok=True)
    gen = TimedIter(synthetic_items(n, seed, time_ordered=time_ordered))
    t0 = time.perf_counter()
    write_geoparquet(gen, path, chunk_size=chunk)
    wall = time.perf_counter() - t0
    if gen.count != n:
        raise SystemExit(f"stac-geoparquet consumed {gen.count} items, expected {n}")
    return {"write": _rates(n, wall, gen.seconds), **_parquet_info(path, chunk)}


def _parquet_info(path: Path, chunk: int) -> dict[str, Any]:
    meta = pq.ParquetFile(path).metadata
    return {"bytes": path.stat().st_size, "rows": meta.num_rows, "row_groups": meta.num_row_groups,
            "rows_per_group": chunk}


# -- searching ----------------------------------------------------------------------------------
def cubelake_search(idx: CatalogIndex) -> Callable[[BenchQuery], list[str]]:
    def search(q: BenchQuery) -> list[str]:
        hits = idx.search(Query(bbox=q.bbox, datetime=(q.start, q.end),
                                wavelength_nm=(q.wl_lo_um * 1000.0, q.wl_hi_um * 1000.0), limit=None))
        return [h.id for h in hits]
    return search


def baseline_search(ds: pads.Dataset) -> Callable[[BenchQuery], list[str]]:
    def search(q: BenchQuery) -> list[str]:
        return geoparquet_search(ds, q.bbox, q.start, q.end, q.wl_lo_um, q.wl_hi_um)
    return search


def run_queries(search: Callable[[BenchQuery], list[str]], queries: list[BenchQuery]) -> tuple[list[float], list[list[str]]]:
    search(queries[0])  # warm-up, untimed
    ms, ids = [], []
    for q in queries:
        t = time.perf_counter()
        got = search(q)
        ms.append((time.perf_counter() - t) * 1e3)
        ids.append(got)
    return ms, ids


def summarize(ms: list[float], ids: list[list[str]]) -> dict[str, Any]:
    counts = [len(x) for x in ids]
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "mean_ms": statistics.fmean(ms), "max_ms": max(ms), "min_ms": min(ms),
            "mean_hits": statistics.fmean(counts), "median_hits": float(np.median(counts)),
            "min_hits": min(counts), "max_hits": max(counts)}


# -- checks -------------------------------------------------------------------------------------
def check_coverage_rule(queries: list[BenchQuery]) -> int:
    """The baseline's ``covers`` against cubelake's coverage code on every band set x query range."""
    from cubelake.catalog import coverage as cl

    default = inspect.signature(cl.merge_intervals).parameters["gap_fraction"].default
    if default != GAP_FRACTION:
        raise SystemExit(f"cubelake.catalog.coverage.merge_intervals merges gaps up to {default} x the narrower "
                         f"band, bench/catalog_synth.py assumes {GAP_FRACTION}: update GAP_FRACTION there")
    checked = 0
    for variants in _POOL:
        for name, _p, bands in variants:
            c = [b["eo:center_wavelength"] for b in bands]
            w = [b["eo:full_width_half_max"] for b in bands]
            merged = cl.merge_intervals(cl.band_intervals([x * 1000.0 for x in c], [x * 1000.0 for x in w]))
            for q in queries:
                ours = covers(c, w, q.wl_lo_um, q.wl_hi_um)
                theirs = cl.covers(merged, q.wl_lo_um * 1000.0, q.wl_hi_um * 1000.0)
                if ours != theirs:
                    raise SystemExit(f"wavelength rule differs on band set {name} ({len(bands)} bands), range "
                                     f"{q.wl_lo_um}-{q.wl_hi_um} um: baseline {ours}, cubelake {theirs}; "
                                     f"cubelake merged {merged}")
                checked += 1
    return checked


def describe_items(ds: pads.Dataset, ids: list[str], q: BenchQuery) -> list[dict[str, Any]]:
    """Each item's own data from the parquet file, and whether it meets each part of ``q``."""
    tbl = ds.to_table(columns=["id", "collection", "bbox", "datetime", "geometry", "bands"],
                      filter=pc.field("id").isin(ids))
    qgeom = query_geometry(q.bbox)
    t0 = datetime.fromisoformat(q.start.replace("Z", "+00:00"))
    t1 = datetime.fromisoformat(q.end.replace("Z", "+00:00"))
    out = []
    for row in tbl.to_pylist():
        geom = shapely.from_wkb(row["geometry"])
        c = [b["eo:center_wavelength"] for b in row["bands"]]
        w = [b["eo:full_width_half_max"] for b in row["bands"]]
        out.append({
            "id": row["id"], "collection": row["collection"], "datetime": row["datetime"].isoformat(),
            "bbox": row["bbox"], "geometry": shapely.to_wkt(geom, rounding_precision=6)[:300],
            "bands": len(c), "coverage_nm": [(round(a, 3), round(b, 3)) for a, b in merged_intervals_nm(c, w)],
            "in_time": t0 <= row["datetime"] <= t1, "intersects": bool(shapely.intersects(geom, qgeom)),
            "covers": covers(c, w, q.wl_lo_um, q.wl_hi_um),
        })
    return out


def compare(queries: list[BenchQuery], ours: list[list[str]], base: list[list[str]],
            ds: pads.Dataset) -> dict[str, Any]:
    bad = []
    for i, (q, a, b) in enumerate(zip(queries, ours, base, strict=True)):
        sa, sb = set(a), set(b)
        if sa != sb or len(sa) != len(a) or len(sb) != len(b):
            bad.append(i)
            if len(bad) == 1:
                only_a, only_b = sorted(sa - sb), sorted(sb - sa)
                print(f"\nMISMATCH on query {i}: {json.dumps(q.to_dict())}")
                print(f"  cubelake {len(a)} ids ({len(a) - len(sa)} duplicates), baseline {len(b)} ids "
                      f"({len(b) - len(sb)} duplicates); only cubelake {len(only_a)}, only baseline {len(only_b)}")
                for label, some in (("only cubelake", only_a[:5]), ("only baseline", only_b[:5])):
                    for d in describe_items(ds, some, q):
                        print(f"  {label}: {json.dumps(d, default=str)}")
    return {"ids_match": not bad, "mismatched_queries": bad}


# -- report -------------------------------------------------------------------------------------
def print_summary(doc: dict[str, Any]) -> None:
    cl, bl = doc["cubelake"], doc["baseline"]
    n = doc["items"]

    def rate(d: dict[str, Any] | None, key: str) -> str:
        return "reused" if d is None else f"{d[key]['items_per_s']:,.0f}"

    rows = [
        ("build items/s (excl. generation)", rate(cl.get("build"), "insert"), rate(bl.get("build"), "write")),
        ("build s (excl. generation)",
         "reused" if cl.get("build") is None else f"{cl['build']['insert']['net_s'] + cl['build']['analyze_s']:.1f}",
         "reused" if bl.get("build") is None else f"{bl['build']['write']['net_s']:.1f}"),
        ("file MB", f"{cl['bytes'] / 1e6:,.1f}", f"{bl['bytes'] / 1e6:,.1f}"),
        ("query p50 ms", f"{cl['query']['p50_ms']:.2f}", f"{bl['query']['p50_ms']:.2f}"),
        ("query p95 ms", f"{cl['query']['p95_ms']:.2f}", f"{bl['query']['p95_ms']:.2f}"),
        ("query mean ms", f"{cl['query']['mean_ms']:.2f}", f"{bl['query']['mean_ms']:.2f}"),
        ("mean / median hits", f"{cl['query']['mean_hits']:.1f} / {cl['query']['median_hits']:.0f}",
         f"{bl['query']['mean_hits']:.1f} / {bl['query']['median_hits']:.0f}"),
    ]
    print(f"\n{n:,} items, {doc['n_queries']} queries (bbox + datetime + wavelength), "
          f"target {doc['target_hits']:.0f} hits each")
    print(f"{'':34s} {'cubelake SQLite':>18s} {'stac-geoparquet':>18s}")
    for name, a, b in rows:
        print(f"{name:34s} {a:>18s} {b:>18s}")
    r = doc["ratios"]
    print(f"baseline / cubelake: p50 {r['p50']:.1f}x, p95 {r['p95']:.1f}x, mean {r['mean']:.1f}x; "
          f"file size {r['bytes']:.2f}x")
    print("cubelake per wavelength range: " + ", ".join(
        f"{k} p50 {v['cubelake_p50_ms']:.2f} ms (baseline {v['baseline_p50_ms']:.2f})"
        for k, v in doc["by_kind"].items()))
    print(f"same id sets on every query: {doc['check']['ids_match']}"
          + ("" if doc["check"]["ids_match"] else f" ({len(doc['check']['mismatched_queries'])} differ)"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ITEMS:,} items (overrides --items)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-hits", type=float, default=100.0, help="items each query should return on average")
    ap.add_argument("--order", choices=("time", "random"), default="time",
                    help="item order (both sides): datetimes increasing with the item index, or i.i.d.")
    ap.add_argument("--batch-size", type=int, default=10_000, help="cubelake insert_items batch (transaction) size")
    ap.add_argument("--stream-items", action="store_true",
                    help="cubelake: generate the items inside the timed pass (timed apart) instead of before it")
    ap.add_argument("--parquet-chunk", type=int, default=5000,
                    help="items per stac-geoparquet record batch = parquet row group (library default 65,536)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/cubelake-bench-catalog"))
    ap.add_argument("--reuse", action="store_true",
                    help="reuse an index / parquet file of the same items left in --workdir (no build timings)")
    ap.add_argument("--json", type=Path, default=None, help="write all results here")
    a = ap.parse_args()
    n = QUICK_ITEMS if a.quick else a.items
    time_ordered = a.order == "time"
    work = a.workdir
    work.mkdir(parents=True, exist_ok=True)
    stem = f"items-n{n}-s{a.seed}-{a.order}"
    db, parquet = work / f"{stem}.sqlite", work / f"{stem}-c{a.parquet_chunk}.parquet"
    t_start = time.perf_counter()
    doc: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                           "args": {k: str(v) for k, v in vars(a).items()}, "items": n, "n_queries": a.queries,
                           "target_hits": a.target_hits, "cubelake": {}, "baseline": {},
                           "load_average_start": os.getloadavg()}

    queries = make_queries(a.queries, a.seed, n_items=n, target_hits=a.target_hits)
    doc["coverage_rule_checks"] = check_coverage_rule(queries)

    if a.reuse and db.exists():
        print(f"reusing {db}")
        doc["cubelake"]["build"] = None
    else:
        print(f"cubelake: indexing {n:,} items into {db} ...", flush=True)
        doc["cubelake"]["build"] = build_index(db, n, a.seed, time_ordered, a.batch_size, a.stream_items)
        b = doc["cubelake"]["build"]
        print(f"  {b['insert']['items_per_s']:,.0f} items/s ({b['insert']['net_s']:.1f} s + analyze "
              f"{b['analyze_s']:.1f} s; generating the items took {b['insert']['generation_s']:.1f} s more); "
              f"{b['insert']['items_per_cpu_s']:,.0f} items per CPU second")
    doc["cubelake"]["bytes"] = _db_bytes(db)
    if a.reuse and parquet.exists():
        print(f"reusing {parquet}")
        doc["baseline"]["build"] = None
        doc["baseline"].update(_parquet_info(parquet, a.parquet_chunk))
    else:
        print(f"stac-geoparquet: writing {n:,} items to {parquet} ...", flush=True)
        info = build_parquet(parquet, n, a.seed, time_ordered, a.parquet_chunk)
        doc["baseline"]["build"] = {"write": info.pop("write")}
        doc["baseline"].update(info)
        w = doc["baseline"]["build"]["write"]
        print(f"  {w['items_per_s']:,.0f} items/s ({w['net_s']:.1f} s; generating the items took "
              f"{w['generation_s']:.1f} s more)")

    print(f"querying ({a.queries} queries each) ...", flush=True)
    idx = CatalogIndex(db, readonly=True)
    cl_ms, cl_ids = run_queries(cubelake_search(idx), queries)
    idx.close()
    ds = open_geoparquet(parquet)
    bl_ms, bl_ids = run_queries(baseline_search(ds), queries)
    doc["cubelake"]["query"] = summarize(cl_ms, cl_ids)
    doc["baseline"]["query"] = summarize(bl_ms, bl_ids)
    doc["check"] = compare(queries, cl_ids, bl_ids, ds)
    cq, bq = doc["cubelake"]["query"], doc["baseline"]["query"]
    doc["ratios"] = {"p50": bq["p50_ms"] / cq["p50_ms"], "p95": bq["p95_ms"] / cq["p95_ms"],
                     "mean": bq["mean_ms"] / cq["mean_ms"], "bytes": doc["cubelake"]["bytes"] / doc["baseline"]["bytes"]}
    doc["by_kind"] = {}
    for kind in sorted({q.kind for q in queries}):
        sel = [i for i, q in enumerate(queries) if q.kind == kind]
        doc["by_kind"][kind] = {"queries": len(sel),
                                "cubelake_p50_ms": float(np.percentile([cl_ms[i] for i in sel], 50)),
                                "baseline_p50_ms": float(np.percentile([bl_ms[i] for i in sel], 50)),
                                "mean_hits": statistics.fmean(len(cl_ids[i]) for i in sel)}
    doc["queries"] = [{**q.to_dict(), "cubelake_ms": cl_ms[i], "baseline_ms": bl_ms[i],
                       "cubelake_hits": len(cl_ids[i]), "baseline_hits": len(bl_ids[i])}
                      for i, q in enumerate(queries)]
    doc["total_s"] = time.perf_counter() - t_start
    doc["load_average_end"] = os.getloadavg()  # 1, 5, 15 min: the machine is shared
    import stac_geoparquet

    doc["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                      "pyarrow_cpu_count": pa.cpu_count(), "pyarrow_io_threads": pa.io_thread_count(),
                      "versions": {"sqlite": sqlite3.sqlite_version, "pyarrow": pa.__version__,
                                   "stac_geoparquet": stac_geoparquet.__version__, "shapely": shapely.__version__,
                                   "numpy": np.__version__}}
    print_summary(doc)
    print(f"total {doc['total_s']:.0f} s; load average (1, 5, 15 min) at the start "
          f"{', '.join(f'{v:.2f}' for v in doc['load_average_start'])}, at the end "
          f"{', '.join(f'{v:.2f}' for v in doc['load_average_end'])}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {a.json}")
    if not doc["check"]["ids_match"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
