"""STAC API benchmark: ``/search`` latency at 100k items against the CLI's search, and throughput with 8 clients.

A lake of ``--items`` synthetic items (``catalog_synth``: six sensors, real band sets, footprints,
2015-2024) is written once (item files + index) under ``--dir``; ``cubelake catalog serve`` runs on it
as a separate process, as users run it. For the same queries (bbox + datetime + the items' bands
covering a wavelength range, ~``--hits`` matches each):

* **API**: ``GET /search?bbox=..&datetime=..&filter=cubelake:covers_wavelength(lo, hi)&limit=L`` on one
  kept-alive connection; p50/p95 of the wall time per request (all matches fit in one page);
* **CLI, in process**: ``LakeCatalog.search`` + reading the matched item files, what
  ``cubelake catalog search --format json`` does after start-up (the same index, the same files);
* **CLI, as a command**: ``cubelake catalog search ... --format json`` per query (start-up included);
* **ceiling**: the matched items' files read and joined as bytes, the least any server of these files does;
* **throughput**: 8 threads, each with its own connection, send the queries in a loop for
  ``--seconds``; requests/s and the latency quantiles under that load.

    python bench/stac_api.py --items 100000 --queries 200 --json /tmp/bench/stac_api.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from catalog_synth import BenchQuery, make_queries, synthetic_items

CLI = str(Path(sys.executable).with_name("cubelake"))


def build_lake(root: Path, n: int, seed: int) -> float:
    """Write ``n`` items (files and index) into a new lake at ``root``; returns the seconds taken."""

    from cubelake.catalog.index import CatalogIndex
    from cubelake.testing.lakes import synthetic_lake

    t0 = time.perf_counter()
    synthetic_lake(root, synthetic_items(n, seed))
    with CatalogIndex(root / "catalog.sqlite") as idx:
        idx.analyze()
    (root / "bench.json").write_text(json.dumps({"items": n, "seed": seed}))
    return time.perf_counter() - t0


def _filter(q: BenchQuery) -> str:
    return f"cubelake:covers_wavelength({q.wl_lo_um * 1000:.3f}, {q.wl_hi_um * 1000:.3f})"


def _bbox(q: BenchQuery) -> str:
    return ",".join(f"{v:.6f}" for v in q.bbox)


def _quantiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {"p50_ms": round(statistics.median(ms), 2), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 2),
            "mean_ms": round(statistics.fmean(ms), 2), "n": len(ms)}


def api_latency(url: str, queries: list[BenchQuery], limit: int) -> tuple[dict[str, float], list[list[str]]]:
    import httpx

    times, ids = [], []
    with httpx.Client(base_url=url, timeout=60) as client:
        for q in queries:
            params = {"bbox": _bbox(q), "datetime": f"{q.start}/{q.end}", "filter": _filter(q), "limit": limit}
            t0 = time.perf_counter()
            r = client.get("search", params=params)
            doc = r.json()
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            assert not [lk for lk in doc["links"] if lk["rel"] == "next"], "a query matched more than one page"
            ids.append([f["id"] for f in doc["features"]])
    return _quantiles(times), ids


def cli_in_process(lake: Path, queries: list[BenchQuery]) -> tuple[dict[str, float], list[list[str]]]:
    from cubelake.catalog import LakeCatalog, Query

    times, ids = [], []
    with LakeCatalog(lake) as cat:
        for q in queries:
            t0 = time.perf_counter()
            hits = cat.search(Query(bbox=q.bbox, datetime=f"{q.start}/{q.end}", filters=(_filter(q),)))
            doc = cat.item_collection(hits)
            json.dumps(doc)
            times.append(time.perf_counter() - t0)
            ids.append([f["id"] for f in doc["features"]])
    return _quantiles(times), ids


def ceiling(lake: Path, ids: list[list[str]]) -> dict[str, float]:
    """The floor of answering: the matched items' files read and joined as bytes (no index, no JSON parse)."""
    times = []
    for found in ids:
        t0 = time.perf_counter()
        b"[" + b",".join((lake / "scenes" / i / "item.json").read_bytes() for i in found) + b"]"
        times.append(time.perf_counter() - t0)
    return _quantiles(times)


def cli_command(lake: Path, queries: list[BenchQuery]) -> dict[str, float]:
    times = []
    for q in queries:
        t0 = time.perf_counter()
        res = subprocess.run([CLI, "catalog", "search", "--lake", str(lake), f"--bbox={_bbox(q)}",
                              "--datetime", f"{q.start}/{q.end}", "--filter", _filter(q), "--format", "json"],
                             capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t0)
        assert res.returncode == 0, res.stderr
    return _quantiles(times)


def throughput(url: str, queries: list[BenchQuery], clients: int, seconds: float, limit: int) -> dict[str, Any]:
    import httpx

    stop = time.perf_counter() + seconds
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def client(k: int) -> None:
        mine: list[float] = []
        with httpx.Client(base_url=url, timeout=60) as c:
            n = k
            while time.perf_counter() < stop:
                q = queries[n % len(queries)]
                n += clients
                t0 = time.perf_counter()
                r = c.get("search", params={"bbox": _bbox(q), "datetime": f"{q.start}/{q.end}", "filter": _filter(q),
                                            "limit": limit})
                r.read()
                mine.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors[0] += 1
        with lock:
            lat.extend(mine)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": len(lat), "seconds": round(wall, 2),
            "requests_per_s": round(len(lat) / wall, 1), "errors": errors[0], **_quantiles(lat)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--cli-queries", type=int, default=20, help="queries timed as CLI commands (start-up included)")
    ap.add_argument("--hits", type=float, default=40.0, help="expected matches per query")
    ap.add_argument("--limit", type=int, default=200, help="page size (all matches in one page)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench/stac_api"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from cubelake.testing.lakes import api_server

    lake = args.dir / f"lake-{args.items}-{args.seed}"
    out: dict[str, Any] = {"items": args.items, "queries": args.queries, "hits": args.hits}
    if not (lake / "bench.json").is_file():
        out["build_s"] = round(build_lake(lake, args.items, args.seed), 1)
    queries = make_queries(args.queries, args.seed + 1, n_items=args.items, target_hits=args.hits)
    cli_q, cli_ids = cli_in_process(lake, queries)
    out["ceiling_read_bytes"] = ceiling(lake, cli_ids)
    with api_server(lake, timeout=300) as url:
        api_latency(url, queries[:10], args.limit)  # warm: first connections, imports, page cache
        api_q, api_ids = api_latency(url, queries, args.limit)
        out["throughput"] = throughput(url, queries, args.clients, args.seconds, args.limit)
    assert api_ids == cli_ids, "the API and the CLI found different items"
    out["matches_per_query"] = round(statistics.fmean(len(i) for i in cli_ids), 1)
    out["api"], out["cli_in_process"] = api_q, cli_q
    out["cli_command"] = cli_command(lake, queries[:args.cli_queries])
    out["api_over_cli_in_process_p50"] = round(api_q["p50_ms"] / cli_q["p50_ms"], 2)
    out["api_over_ceiling_p50"] = round(api_q["p50_ms"] / out["ceiling_read_bytes"]["p50_ms"], 1)
    out["cli_command_over_api_p50"] = round(out["cli_command"]["p50_ms"] / api_q["p50_ms"], 1)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
