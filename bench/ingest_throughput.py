"""Ingest throughput: cubelake against GDAL, rio-cogeo and xarray on one synthetic HSI scene.

Every tool runs as its own subprocess under GNU time (``/usr/bin/time``) on the SAME
uncompressed, 256-tiled, pixel-interleaved int16 GeoTIFF (written by ``bench/synth.py``), and
reports wall seconds, MB/s (uncompressed scene bytes / wall seconds, MB = 10^6 bytes), peak RSS
and CPU seconds. Tools run round-robin (``--repeats`` rounds) so slow drift of the machine hits
all of them alike; as root the page cache is dropped (``sync; echo 3 > drop_caches``) before
every run, so each one reads its input cold from disk. CPU time that other processes used while a
run went on is measured from ``/proc/stat`` and a run that shared the machine is re-run.

Tools (COG: ZSTD level ``--level``, predictor 2, 256 tiles, no overviews, pixel interleave;
Zarr v3: chunks (bands, 256, 256), blosc zstd clevel 3 shuffle, cubelake's default):

  cubelake_cog       cubelake ingest --products cog
  rio_cogeo          rio cogeo create (rio-cogeo's own default pipeline, --threads 2)
  gdal36_cog         gdal_translate -of COG (Debian GDAL 3.6, NUM_THREADS=2)
  gdal310_cog        rasterio.shutil.copy(driver='COG') (rasterio's GDAL 3.10, NUM_THREADS=2)
  cubelake_zarr      cubelake ingest --products zarr
  xarray_zarr        rioxarray.open_rasterio(chunks=...) -> Dataset.to_zarr (dask threads, 2 workers)
  cubelake_cog_zarr  cubelake ingest --products cog,zarr
  cubelake_4gib      cubelake ingest --products cog,zarr on a >= 4 GiB scene (unless --skip-4gib)
  <tool>_small       the COG and Zarr tools again on a ~0.5 GiB scene (``--small-gib``; 0 skips it), where
                     fixed per-run costs (start-up, metadata, validation) weigh more

Afterwards the outputs are checked: every COG is valid (rio-cogeo), has the asked layout, and
holds the source's pixels on a few windows (edges included); both Zarr stores hold the source's
pixels with the same chunks and codec. Results print as a table; ``--json`` writes everything.

    python bench/ingest_throughput.py --json /tmp/bench/ingest_throughput.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules
from common import busy_cpu_seconds, can_drop_caches, drop_caches  # noqa: E402
from synth import ensure_scene as ensure_synth_scene  # noqa: E402

BIN = Path(sys.executable).parent
TIME = "/usr/bin/time"
GDAL_TRANSLATE = "/usr/bin/gdal_translate"
CHUNK = 256
WIDTH = 4096


# -- the scene ----------------------------------------------------------------------------------
def scene_shape(size_gib: float, bands: int) -> tuple[int, int]:
    """(height, width): width 4096, height a multiple of 256, at least ``size_gib`` of int16."""
    pixels = math.ceil(size_gib * 1024**3 / (bands * 2))
    height = math.ceil(pixels / WIDTH / CHUNK) * CHUNK
    return height, WIDTH


def ensure_scene(out: Path, height: int, width: int, bands: int) -> Path:
    """Reuse ``out/synth_HxWxB.tif`` when it has the expected layout, else write it with synth.py."""
    return ensure_synth_scene(out, height, width, bands, CHUNK)


# -- one measured run ---------------------------------------------------------------------------


def wait_quiet(max_wait_s: float) -> float:
    """Wait (up to ``max_wait_s``) until other processes use under 0.1 cores for 2 s; returns seconds waited."""
    t0 = time.monotonic()
    while True:
        b0 = busy_cpu_seconds()
        time.sleep(2.0)
        if (busy_cpu_seconds() - b0) / 2.0 < 0.1 or time.monotonic() - t0 > max_wait_s:
            return time.monotonic() - t0


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(cmd: list[str], log: Path, *, drop: bool, env: dict[str, str] | None = None, nice: int = 0) -> dict[str, Any]:
    """Run ``cmd`` under GNU time; wall s, peak RSS, CPU s, and the CPU others used meanwhile."""
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]

    def own_autogroup() -> None:
        # A new session gets its own scheduler autogroup (Linux); niceness only ranks processes within an
        # autogroup, so the tool's autogroup itself gets the niceness too (only this tool's processes).
        if nice:
            os.setsid()
            try:
                with open("/proc/self/autogroup", "w") as f:
                    f.write(f"{nice}\n")
            except OSError:
                pass

    if drop:
        drop_caches()
    else:
        os.sync()
    tfile = log.with_suffix(".time")
    busy0, load0 = busy_cpu_seconds(), os.getloadavg()[0]
    with open(log, "w") as out:
        proc = subprocess.run([TIME, "-f", "%e %M %U %S", "-o", str(tfile), *cmd], stdout=out,
                              stderr=subprocess.STDOUT, env=env, preexec_fn=own_autogroup)
    busy1 = busy_cpu_seconds()
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    wall, rss_kb, user, sys_ = tfile.read_text().split()[-4:]
    wall_s, cpu_s = float(wall), float(user) + float(sys_)
    other = max(0.0, (busy1 - busy0) - cpu_s)
    return {"wall_s": wall_s, "peak_rss_mib": int(rss_kb) / 1024, "cpu_s": round(cpu_s, 2),
            "other_cpu_s": round(other, 2), "other_cores": round(other / wall_s, 3) if wall_s else 0.0,
            "loadavg_before": round(load0, 2)}


# -- the tools ----------------------------------------------------------------------------------
def write_profile(path: Path, level: int) -> Path:
    path.write_text(f"name: bench\nproducts: {{chunk: {CHUNK}, level: {level}}}\nbad_bands: {{wavelength_windows_nm: []}}\n")
    return path


def cubelake_cmd(src: Path, work: Path, products: str, profile: Path) -> tuple[list[str], Path]:
    lake = work / "lake"
    cmd = [str(BIN / "cubelake"), "-q", "ingest", str(src), "--lake", str(lake), "--profile", str(profile),
           "--products", products, "--workers", "2"]
    return cmd, lake


def tool_commands(src: Path, work: Path, level: int, profile: Path) -> dict[str, tuple[list[str], Path]]:
    """key -> (command, output path) for one run writing under ``work/key``."""
    cogopts = {"BLOCKSIZE": CHUNK, "COMPRESS": "ZSTD", "LEVEL": level, "PREDICTOR": "YES", "NUM_THREADS": 2,
               "OVERVIEWS": "NONE", "BIGTIFF": "IF_SAFER"}
    cmds: dict[str, tuple[list[str], Path]] = {}
    d = work / "cubelake_cog"
    cmds["cubelake_cog"] = cubelake_cmd(src, d, "cog", profile)
    d = work / "rio_cogeo"
    cmds["rio_cogeo"] = ([str(BIN / "rio"), "cogeo", "create", str(src), str(d / "out.tif"), "--cog-profile", "zstd",
                          "--blocksize", str(CHUNK), "--overview-level", "0", "--threads", "2",
                          "--co", f"ZSTD_LEVEL={level}", "--co", "PREDICTOR=2", "--co", "INTERLEAVE=PIXEL",
                          "--co", "BIGTIFF=IF_SAFER", "--quiet"], d / "out.tif")
    d = work / "gdal36_cog"
    cmds["gdal36_cog"] = ([GDAL_TRANSLATE, "-q", "-of", "COG", *[x for k, v in cogopts.items() for x in ("-co", f"{k}={v}")],
                           str(src), str(d / "out.tif")], d / "out.tif")
    d = work / "gdal310_cog"
    code = ("import rasterio.shutil, sys; "
            f"rasterio.shutil.copy(sys.argv[1], sys.argv[2], driver='COG', **{cogopts!r})")
    cmds["gdal310_cog"] = ([sys.executable, "-c", code, str(src), str(d / "out.tif")], d / "out.tif")
    d = work / "cubelake_zarr"
    cmds["cubelake_zarr"] = cubelake_cmd(src, d, "zarr", profile)
    d = work / "xarray_zarr"
    cmds["xarray_zarr"] = ([sys.executable, str(Path(__file__).resolve()), "--xarray-to-zarr", str(src), str(d / "out.zarr")],
                           d / "out.zarr")
    d = work / "cubelake_cog_zarr"
    cmds["cubelake_cog_zarr"] = cubelake_cmd(src, d, "cog,zarr", profile)
    return cmds


def xarray_to_zarr(src: str, dst: str) -> None:
    """The peer baseline, run in its own process: rioxarray + dask (threads, 2 workers) + to_zarr."""
    import dask
    import rioxarray

    from cubelake.ingest.zarr_writer import ZarrCodecSpec

    spec = ZarrCodecSpec()
    dask.config.set(scheduler="threads", num_workers=2)
    da = rioxarray.open_rasterio(src, chunks={"band": -1, "y": CHUNK, "x": CHUNK}, lock=False)
    ds = da.to_dataset(name="data")
    nb = da.sizes["band"]
    ds.to_zarr(dst, zarr_format=3, mode="w", encoding={"data": {
        "chunks": (nb, CHUNK, CHUNK),
        "compressors": [spec.codec()]}})


COG_TOOLS = ("cubelake_cog", "rio_cogeo", "gdal36_cog", "gdal310_cog")
ZARR_TOOLS = ("cubelake_zarr", "xarray_zarr")
LABELS = {
    "cubelake_cog": "cubelake ingest --products cog",
    "rio_cogeo": "rio cogeo create (rio-cogeo 7, GDAL 3.10)",
    "gdal36_cog": "gdal_translate -of COG (GDAL 3.6)",
    "gdal310_cog": "rasterio.shutil.copy COG (GDAL 3.10)",
    "cubelake_zarr": "cubelake ingest --products zarr",
    "xarray_zarr": "rioxarray + xarray.to_zarr (dask, 2 threads)",
    "cubelake_cog_zarr": "cubelake ingest --products cog,zarr",
    "cubelake_4gib": "cubelake ingest --products cog,zarr (4 GiB scene)",
}


def products_of(key: str, out: Path) -> dict[str, Path]:
    """The product files a run left: {'cog': ..., 'zarr': ...}."""
    if key.startswith("cubelake"):  # out is the lake; one scene folder in it
        found: dict[str, Path] = {}
        for p in sorted((out / "scenes").glob("*/*")):
            if p.suffix == ".tif":
                found["cog"] = p
            elif p.suffix == ".zarr":
                found["zarr"] = p
        return found
    return {"zarr" if out.suffix == ".zarr" else "cog": out}


# -- checks -------------------------------------------------------------------------------------
def check_windows(height: int, width: int) -> list[tuple[int, int, int, int]]:
    """(row, col, h, w) windows: corners, the far edge, one spanning four tiles, the middle."""
    wins = [(0, 0, CHUNK, CHUNK), (height - 100, width - 300, 100, 300), (200, width - 196, 120, 150),
            (height // 2, width // 2, 2 * CHUNK, 2 * CHUNK), (CHUNK * 3 + 17, 5, 31, CHUNK * 2 + 9)]
    out = []
    for r, c, h, w in wins:
        r, c = max(0, min(r, height - 1)), max(0, min(c, width - 1))
        out.append((r, c, min(h, height - r), min(w, width - c)))
    return out


def verify(src: Path, produced: dict[str, dict[str, Path]]) -> list[str]:
    """Layout and pixel checks of every product against the source; returns failures."""
    import rasterio
    import zarr
    from rasterio.windows import Window
    from rio_cogeo.cogeo import cog_validate

    failures: list[str] = []
    with rasterio.open(src) as s:
        height, width, count = s.height, s.width, s.count
        ref = {w: s.read(window=Window(w[1], w[0], w[3], w[2])) for w in check_windows(height, width)}
    zarr_meta = {}
    for key, prods in produced.items():
        if "cog" in prods:
            path = prods["cog"]
            valid, errors, _ = cog_validate(str(path), quiet=True)
            if not valid:
                failures.append(f"{key}: {path} is not a valid COG: {errors}")
            with rasterio.open(path) as ds:
                tags = ds.tags(ns="IMAGE_STRUCTURE")
                layout = {"dtype": ds.dtypes[0], "count": ds.count, "block": ds.block_shapes[0],
                          "compress": str(ds.compression), "interleave": ds.interleaving.value if ds.interleaving else None,
                          "predictor": tags.get("PREDICTOR"), "overviews": ds.overviews(1), "nodata": ds.nodata}
                want = {"dtype": "int16", "count": count, "block": (CHUNK, CHUNK), "compress": "Compression.zstd",
                        "interleave": "PIXEL", "predictor": "2", "overviews": [], "nodata": -32768.0}
                for k, v in want.items():
                    if layout[k] != v:
                        failures.append(f"{key}: COG {k} is {layout[k]!r}, expected {v!r}")
                for w, expect in ref.items():
                    got = ds.read(window=Window(w[1], w[0], w[3], w[2]))
                    if not np.array_equal(got, expect):
                        failures.append(f"{key}: COG pixels differ from the source in window {w}")
        if "zarr" in prods:
            arr = zarr.open_group(str(prods["zarr"]), mode="r")["data"]
            zarr_meta[key] = (arr.shape, arr.chunks, str(arr.dtype),
                              [type(c).__name__ + repr(getattr(c, "to_dict", lambda: {})().get("configuration")) for c in arr.compressors])
            for w, expect in ref.items():
                got = arr[:, w[0] : w[0] + w[2], w[1] : w[1] + w[3]]
                if not np.array_equal(got, expect):
                    failures.append(f"{key}: Zarr pixels differ from the source in window {w}")
            if arr.chunks != (count, CHUNK, CHUNK):
                failures.append(f"{key}: Zarr chunks {arr.chunks}, expected {(count, CHUNK, CHUNK)}")
    metas = {repr(v) for v in zarr_meta.values()}
    if len(metas) > 1:
        failures.append(f"Zarr stores differ in shape/chunks/dtype/codec: {zarr_meta}")
    return failures


# -- summary ------------------------------------------------------------------------------------
def summarise(runs: list[dict[str, Any]], nbytes: int) -> dict[str, Any]:
    walls = [r["wall_s"] for r in runs]
    rss = [r["peak_rss_mib"] for r in runs]
    cpu = [r["cpu_s"] for r in runs]
    best, med = min(walls), statistics.median(walls)
    return {"runs": len(runs), "wall_best_s": best, "wall_median_s": med,
            "mbps_best": nbytes / 1e6 / best, "mbps_median": nbytes / 1e6 / med,
            "rss_max_mib": max(rss), "rss_median_mib": statistics.median(rss), "cpu_median_s": statistics.median(cpu)}


RATIOS = [
    ("cubelake COG vs gdal_translate 3.6", "cubelake_cog", "gdal36_cog"),
    ("cubelake COG vs GDAL 3.10 COG driver", "cubelake_cog", "gdal310_cog"),
    ("cubelake COG vs rio cogeo create", "cubelake_cog", "rio_cogeo"),
    ("cubelake Zarr vs xarray.to_zarr", "cubelake_zarr", "xarray_zarr"),
    ("small scene: cubelake COG vs gdal_translate 3.6", "cubelake_cog_small", "gdal36_cog_small"),
    ("small scene: cubelake COG vs GDAL 3.10 COG driver", "cubelake_cog_small", "gdal310_cog_small"),
    ("small scene: cubelake Zarr vs xarray.to_zarr", "cubelake_zarr_small", "xarray_zarr_small"),
]
SMALL_TOOLS = ("cubelake_cog", "gdal36_cog", "gdal310_cog", "cubelake_zarr", "xarray_zarr")


def print_table(summary: dict[str, dict[str, Any]], sizes: dict[str, dict[str, int]], nbytes: dict[str, int]) -> None:
    print(f"\n{'tool':<64} {'runs':>4} {'best s':>7} {'med s':>7} {'MB/s best':>9} {'MB/s med':>9} "
          f"{'RSS MiB':>8} {'CPU s':>6} {'out MB':>8} {'ratio':>6}")
    for key, s in summary.items():
        out = sum(sizes.get(key, {}).values())
        print(f"{LABELS[key]:<64} {s['runs']:>4} {s['wall_best_s']:>7.1f} {s['wall_median_s']:>7.1f} "
              f"{s['mbps_best']:>9.0f} {s['mbps_median']:>9.0f} {s['rss_max_mib']:>8.0f} {s['cpu_median_s']:>6.1f} "
              f"{out / 1e6:>8.0f} {nbytes[key] / out if out else float('nan'):>6.2f}")
    print("\nspeed ratios (baseline wall / cubelake wall; > 1 = cubelake faster)")
    for label, a, b in RATIOS:
        if a in summary and b in summary:
            print(f"  {label:<52} best {summary[b]['wall_best_s'] / summary[a]['wall_best_s']:.2f}x   "
                  f"median {summary[b]['wall_median_s'] / summary[a]['wall_median_s']:.2f}x")


# -- main ---------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=2.0, help="scene size (uncompressed int16), GiB")
    ap.add_argument("--bands", type=int, default=128)
    ap.add_argument("--level", type=int, default=3, help="COG ZSTD level for every COG tool")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench"), help="scenes and outputs go here")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over all tools (best and median reported)")
    ap.add_argument("--tools", default=None, help="comma-separated subset of the tool keys")
    ap.add_argument("--skip-4gib", action="store_true", help="skip the >= 4 GiB cubelake run")
    ap.add_argument("--repeats-4gib", type=int, default=1)
    ap.add_argument("--small-gib", type=float, default=0.5,
                    help="also run the COG and Zarr tools on a scene of this size, GiB (0: no small scene)")
    ap.add_argument("--no-drop-caches", action="store_true", help="keep the page cache between runs")
    ap.add_argument("--disturbed-cores", type=float, default=0.25,
                    help="re-run a run when other processes used more than this many cores on average meanwhile")
    ap.add_argument("--max-reruns", type=int, default=2, help="re-runs of a run that other processes disturbed")
    ap.add_argument("--quiet-wait", type=float, default=300.0,
                    help="before each run, wait up to this many seconds for other processes to go idle")
    ap.add_argument("--nice", type=int, default=0,
                    help="run every tool at this niceness, in its own scheduler autogroup of that niceness (e.g. -10 "
                         "as root, so that other processes' tests barely share the CPUs)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs of the last round")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--xarray-to-zarr", nargs=2, metavar=("SRC", "DST"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.xarray_to_zarr:
        xarray_to_zarr(*a.xarray_to_zarr)
        return

    import rasterio

    a.out.mkdir(parents=True, exist_ok=True)
    work = a.out / "throughput"
    drop = not a.no_drop_caches and can_drop_caches()
    if not a.no_drop_caches and not drop:
        print("note: not root, the page cache is not dropped between runs (inputs may be read warm)")
    height, width = scene_shape(a.size_gib, a.bands)
    src = ensure_scene(a.out, height, width, a.bands)
    scenes = {"main": src}
    nbytes_main = height * width * a.bands * 2
    if not a.skip_4gib:
        h4, w4 = scene_shape(max(4.0, a.size_gib * 2), a.bands)
        scenes["4gib"] = ensure_scene(a.out, h4, w4, a.bands)
    profile = write_profile(a.out / "bench_profile.yaml", a.level)

    cmds = tool_commands(src, work, a.level, profile)
    small: Path | None = None
    if a.small_gib > 0:
        hs, ws = scene_shape(a.small_gib, a.bands)
        small = ensure_scene(a.out, hs, ws, a.bands)
        small_cmds = tool_commands(small, work / "small", a.level, profile)
        for tool in SMALL_TOOLS:  # each run writes under work/<key>, which is emptied before it
            cmd, out = small_cmds[tool]
            here, there = str(work / "small" / tool), str(work / f"{tool}_small")
            cmds[f"{tool}_small"] = ([c.replace(here, there) for c in cmd], Path(str(out).replace(here, there)))
            LABELS[f"{tool}_small"] = f"{LABELS[tool]}, {hs * ws * a.bands * 2 / 1e6:.0f} MB scene"
    if a.tools:
        keep = a.tools.split(",")
        cmds = {k: v for k, v in cmds.items() if k in keep or k.removesuffix("_small") in keep}
    plan: list[tuple[str, int]] = [(k, r) for r in range(a.repeats) for k in cmds]
    if "4gib" in scenes:
        cmds["cubelake_4gib"] = cubelake_cmd(scenes["4gib"], work / "cubelake_4gib", "cog,zarr", profile)
        plan += [("cubelake_4gib", r) for r in range(a.repeats_4gib)]
    nbytes = {k: nbytes_main for k in cmds}
    if small is not None:
        with rasterio.open(small) as ds:
            nbytes.update({k: ds.height * ds.width * ds.count * 2 for k in cmds if k.endswith("_small")})
    if "4gib" in scenes:
        with rasterio.open(scenes["4gib"]) as ds:
            nbytes["cubelake_4gib"] = ds.height * ds.width * ds.count * 2

    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in cmds}
    disturbed: list[dict[str, Any]] = []
    sizes: dict[str, dict[str, int]] = {}
    print(f"scene {src} ({height}x{width}x{a.bands} int16, {nbytes_main / 2**30:.2f} GiB)"
          + (f" and {small}" if small is not None else "") + "; "
          f"page cache {'dropped' if drop else 'kept'} before each run; {len(plan)} runs", flush=True)
    for key, rnd in plan:
        cmd, out = cmds[key]
        tool_dir = work / key
        for attempt in range(a.max_reruns + 1):
            shutil.rmtree(tool_dir, ignore_errors=True)
            tool_dir.mkdir(parents=True)
            waited = wait_quiet(a.quiet_wait)
            r = measure(cmd, tool_dir.with_suffix(".log"), drop=drop, env=env, nice=a.nice)
            r.update(round=rnd, attempt=attempt, waited_for_quiet_s=round(waited, 1))
            print(f"  {key:<18} round {rnd} try {attempt}: {r['wall_s']:6.1f} s  {nbytes[key] / 1e6 / r['wall_s']:5.0f} MB/s  "
                  f"RSS {r['peak_rss_mib']:6.0f} MiB  CPU {r['cpu_s']:6.1f} s  others {r['other_cores']:.2f} cores", flush=True)
            if r["other_cores"] <= a.disturbed_cores or attempt == a.max_reruns:
                r["disturbed"] = r["other_cores"] > a.disturbed_cores
                break
            disturbed.append({"tool": key, **r})
        runs[key].append(r)
        sizes[key] = {kind: tree_size(p) for kind, p in products_of(key, out).items()}

    # outputs of the last round: check them against the source
    produced = {k: products_of(k, cmds[k][1]) for k in cmds if k != "cubelake_4gib" and not k.endswith("_small")}
    failures = verify(src, produced)
    if small is not None:
        failures += verify(small, {k: products_of(k, cmds[k][1]) for k in cmds if k.endswith("_small")})
    if "cubelake_4gib" in cmds:
        failures += verify(scenes["4gib"], {"cubelake_4gib": products_of("cubelake_4gib", cmds["cubelake_4gib"][1])})
    summary = {k: summarise(v, nbytes[k]) for k, v in runs.items() if v}
    print_table(summary, sizes, nbytes)
    print("\nverification: " + ("all products valid, same layout, pixels equal to the source on "
                                f"{len(check_windows(height, width))} windows" if not failures else "FAILED"))
    for f in failures:
        print("  " + f)
    if disturbed:
        print(f"\n{len(disturbed)} run(s) were re-run because other processes used > {a.disturbed_cores} cores meanwhile")
    if a.json:
        doc = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "gdal_cli": subprocess.run([GDAL_TRANSLATE, "--version"], capture_output=True, text=True).stdout.strip(),
                        "rasterio_gdal": rasterio.__gdal_version__},
            "args": {k: str(v) for k, v in vars(a).items() if k != "xarray_to_zarr"},
            "scene": {"path": str(src), "shape": [a.bands, height, width], "bytes": nbytes_main,
                      **({"small": str(small), "small_bytes": next(v for k, v in nbytes.items() if k.endswith("_small"))}
                         if small is not None and any(k.endswith("_small") for k in nbytes) else {}),
                      **({"4gib": str(scenes["4gib"]), "4gib_bytes": nbytes.get("cubelake_4gib")} if "4gib" in scenes else {})},
            "page_cache_dropped": drop, "nice": a.nice,
            "commands": {k: " ".join(v[0]) for k, v in cmds.items()},
            "runs": runs, "disturbed_reruns": disturbed, "summary": summary, "output_bytes": sizes,
            "ratios": {label: {"best": summary[b]["wall_best_s"] / summary[a_]["wall_best_s"],
                               "median": summary[b]["wall_median_s"] / summary[a_]["wall_median_s"]}
                       for label, a_, b in RATIOS if a_ in summary and b in summary},
            "verification_failures": failures,
        }
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {a.json}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
