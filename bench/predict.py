"""Whole-scene prediction: cubelake's tiled prediction against naive per-patch inference, and the machine's ceiling.

Scene: a synthetic HSI-like int16 cube (``bench/synth.py``: mixtures of smooth endmember spectra with
smooth abundances and sensor noise), ``--size`` x ``--size`` x ``--bands`` (512 x 512 x 200 by default,
100 MiB raw), with a nodata border of ``--border`` pixels (all bands -32768), ingested by cubelake
(``IngestOptions(chunk=128, products=("zarr", "cog"))``, all bands kept) into a lake in ``--workdir``
(kept: the scene and the lake are reused by later runs when their shape matches).

Models (CPU, fp32, torch threads = the machine's cores), saved with ``cubelake.infer.save_model`` and
``Preprocessing(normalize="scene")``, 8 classes, random weights (throughput does not depend on them):

* ``pixel3d``    a 3-D CNN on 9 x 9 patches (input ``(B, 1, bands, 9, 9)``; the seed article's kind):
                 three Conv3d layers striding along the spectrum, then a linear classifier.
* ``spectral1d`` a 1-D CNN on one pixel's spectrum (patch 1, input ``(B, 1, bands)``).
* ``seg2d``      a dense 2-D segmentation net (input ``(B, bands, H, W)``, receptive field radius 4),
                 saved as a ``torch.export`` program.

For each model, in the same run, each part in a fresh process:

(a) cubelake   ``predict_blocks(model, src, PredictSettings(batch=1024, tile_batch=4))`` over the scene's
               Zarr product: every chunk of the scene once, finished blocks consumed and dropped (no
               lake writing). Counted: wall time, scene pixels/s, chunks decoded and re-decoded
               (``PredictStats``), the model's forward time (the module wrapped with a timer), and the
               peak RSS above the RSS before the run (``/proc/self/clear_refs`` resets the high-water mark).
               Run up to ``--repeats`` times while their total stays under ``--repeat-seconds``; the median
               run is reported. With torch threads = the cores and, for ``--one-thread`` models, also 1.
(b) naive      per pixel: read its p x p x bands window (p = the patch; the dense model: 2 x its receptive
               field + 1, keeping the centre output), normalise it as cubelake does, run the model on that
               one patch (batch 1). Two readers: ``rasterio`` window reads of the lake's COG (clipped to the
               raster and padded with nodata; dataset opened once; ``GDAL_CACHEMAX`` = cubelake's
               decoded-chunk budget, ``--cache-mib``), with torch threads = the cores and with 1 thread (a
               batch-1 forward's best here), and ``zarr`` slicing of the lake's Zarr store (zarr-python keeps
               no decoded chunks; data-chunk GETs counted). Timed on a random sample of scene pixels
               (``--naive-samples``, ``--zarr-samples``) and **extrapolated** to the scene: pixels/s =
               samples / time. Pixels whose centre is nodata are read, not run, as cubelake does. Each
               sampled pixel's probabilities are compared with cubelake's (the run fails above 1e-4).
(c) ceiling    the model's forward pass alone (+ softmax) on pre-built random inputs already in memory,
               called with exactly the input shapes (a) called it with, in (a)'s order (batches of up to
               1024 patches, each tile's last one partial; dense: groups of up to 4 equal-shape windows of
               128 + 2 x halo pixels a side, clipped at the scene's edges), stopped after ``--ceiling-seconds``
               and then scaled by the inputs not run. At each thread count (a) ran with.
(d) e2e        ``cubelake.infer.predict.predict_scene`` (predict + write COG/Zarr + publish + index) into a
               copy of the lake, for the ``--e2e`` models, then once more (a no-op); the model loaded and
               first-call imports done before the clock starts (reported apart).

All rates are *scene* pixels per second (nodata pixels included, as (a) covers them); (c) is the
rate at which the forward pass alone would cover the scene's valid pixels. The machine is shared:
each part records the CPU other processes used meanwhile (``/proc/stat`` busy time minus its own, in
cores); ``--nice -10`` runs every part at that niceness in its own scheduler autogroup (as
``bench/ingest_throughput.py`` does), so other jobs take less of the cores. Every measured process
starts with the same glibc malloc settings (``--malloc tuned``, the default: see ``tune_malloc``;
``--malloc default`` leaves glibc's).

    python bench/predict.py --nice -10 --json /tmp/bench/predict.json
    python bench/predict.py --quick --json /tmp/bench/predict_quick.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules
from common import isolated  # noqa: E402
from synth import write_scene  # noqa: E402

CHUNK = 128
CLASSES = 8
PATCH = 9
BATCH = 1024
TILE_BATCH = 4
NODATA = -32768
MiB = 1024**2
MB = 1e6


# -- models ---------------------------------------------------------------------------------------


class Pixel3D(torch.nn.Module):
    """A 3-D CNN over a patch ``(1, bands, p, p)``: spectral-spatial kernels striding along the spectrum."""

    def __init__(self, width: int = 4, classes: int = CLASSES) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv3d(1, width, (7, 3, 3), stride=(4, 1, 1))
        self.c2 = torch.nn.Conv3d(width, width, (5, 3, 3), stride=(2, 1, 1))
        self.c3 = torch.nn.Conv3d(width, 2 * width, (3, 3, 3), stride=(2, 1, 1))
        self.fc = torch.nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))))
        return self.fc(x.mean(dim=(2, 3, 4)))


class Spectral1D(torch.nn.Module):
    """A 1-D CNN over one pixel's spectrum ``(1, bands)``."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv1d(1, 16, 7, stride=2)
        self.c2 = torch.nn.Conv1d(16, 32, 5, stride=2)
        self.fc = torch.nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(x.amax(dim=2))


class Seg2D(torch.nn.Module):
    """A dense segmentation net: a 1x1 spectral reduction, then 3x3, 3x3, 5x5 convolutions (radius 4)."""

    def __init__(self, bands: int, classes: int = CLASSES) -> None:
        super().__init__()
        self.r = torch.nn.Conv2d(bands, 32, 1)
        self.a = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.c = torch.nn.Conv2d(32, classes, 5, padding=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(torch.relu(self.r(x)))))))


SEG_RF = 4


def save_models(folder: Path, bands: int, width: int) -> dict[str, Path]:
    """The three models, saved with their spec (``normalize="scene"``)."""
    from cubelake.infer import ModelSpec, Preprocessing, save_model

    folder.mkdir(parents=True, exist_ok=True)
    pre = Preprocessing(normalize="scene")
    torch.manual_seed(0)
    return {
        "pixel3d": save_model(Pixel3D(width), folder / "pixel3d.pt", ModelSpec(
            name="pixel3d", kind="pixel", layout="B1CHW", bands=bands, classes=CLASSES, patch=PATCH, preprocessing=pre)),
        "spectral1d": save_model(Spectral1D(), folder / "spectral1d.pt", ModelSpec(
            name="spectral1d", kind="pixel", layout="B1C", bands=bands, classes=CLASSES, patch=1, preprocessing=pre)),
        "seg2d": save_model(Seg2D(bands), folder / "seg2d.pt2", ModelSpec(
            name="seg2d", kind="dense", layout="BCHW", bands=bands, classes=CLASSES, patch=0, receptive_field=SEG_RF,
            preprocessing=pre), format="export"),
    }


# -- the scene and the lake -----------------------------------------------------------------------


def ensure_scene(work: Path, side: int, bands: int, border: int) -> Path:
    """``synth_pred_SxSxB_bN.tif``: bench/synth.py's cube with a nodata border, reused when present."""
    import rasterio
    from rasterio.windows import Window

    path = work / f"synth_pred_{side}x{side}x{bands}_b{border}.tif"
    if path.exists():
        return path
    print(f"writing {path} ({side}x{side}x{bands} int16, nodata border {border} px) ...", flush=True)
    tmp = path.with_suffix(".partial.tif")
    write_scene(tmp, height=side, width=side, bands=bands, block=256, seed=7)
    with rasterio.open(tmp, "r+") as ds:
        for win in (Window(0, 0, side, border), Window(0, side - border, side, border),
                    Window(0, 0, border, side), Window(side - border, 0, border, side)):
            ds.write(np.full((bands, win.height, win.width), NODATA, np.int16), window=win)
    tmp.rename(path)
    return path


def scene_paths(lake: Path) -> dict[str, Path] | None:
    for rec in sorted((lake / "scenes").glob("*/scene.json")):
        folder, sid = rec.parent, rec.parent.name
        cog, zarr_ = folder / f"{sid}.tif", folder / f"{sid}.zarr"
        if cog.is_file() and (zarr_ / "data" / "zarr.json").is_file():
            return {"scene": folder, "cog": cog, "zarr": zarr_, "lake": lake}
    return None


def ensure_lake(work: Path, side: int, bands: int, border: int) -> dict[str, Path]:
    """The scene ingested (chunk 128, zarr + cog, every band kept) into ``work/lake_...``; reused when present."""
    lake = work / f"lake_{side}x{side}x{bands}_b{border}"
    found = scene_paths(lake)
    if found is not None:
        print(f"reusing {found['scene']}", flush=True)
        return found
    src = ensure_scene(work, side, bands, border)
    from cubelake.ingest import IngestOptions, ingest
    from cubelake.ingest.profile import SensorProfile

    shutil.rmtree(lake, ignore_errors=True)
    profile = SensorProfile.model_validate({"name": "bench", "products": {"chunk": CHUNK, "level": 3},
                                            "bad_bands": {"wavelength_windows_nm": []}})
    print(f"ingesting {src.name} into {lake} (zarr + cog, chunk {CHUNK}) ...", flush=True)
    t0 = time.perf_counter()
    res = ingest([src], lake, IngestOptions(chunk=CHUNK, products=("zarr", "cog"), profile=profile))
    if len(res) != 1 or res[0].outcome not in ("ingested", "unchanged"):
        raise RuntimeError(f"ingest of {src} failed: {[(r.outcome, r.message) for r in res]}")
    print(f"  ingested in {time.perf_counter() - t0:.1f} s", flush=True)
    found = scene_paths(lake)
    if found is None:
        raise RuntimeError(f"{lake}: no scene with a COG and a Zarr store after ingest")
    return found


# -- process helpers ------------------------------------------------------------------------------


def rss_bytes(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def busy_cpu_seconds() -> float:
    """Non-idle CPU seconds of the whole machine since boot (all cores; iowait counts as idle)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class OtherCpu:
    """CPU the rest of the machine used while a part ran (machine busy time minus this process's), in cores:
    the machine is shared, and with 2 cores one busy core elsewhere slows a 2-thread torch forward severalfold."""

    def __init__(self) -> None:
        self.b0, self.o0 = busy_cpu_seconds(), self._own()

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system

    def cores(self, wall: float) -> float:
        return max(0.0, (busy_cpu_seconds() - self.b0) - (self._own() - self.o0)) / wall


def reset_peak_rss() -> None:
    """Reset the process's RSS high-water mark (VmHWM) to its current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5\n")


def rchar() -> int:
    with open("/proc/self/io", "rb") as f:
        data = f.read()
    return int(data.split(b"rchar:", 1)[1].split(b"\n", 1)[0])


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def tune_malloc() -> None:
    """Serve allocations up to 64 MiB from the heap and keep up to 256 MiB of freed heap (glibc ``mallopt``).

    By default glibc gives every allocation above its mmap threshold (128 KiB, raised at run time only as
    large blocks are freed, at most 32 MiB) fresh pages from the kernel, so each forward pass page-faults
    its intermediate tensors in again: here that made the same forward up to 2.5x slower in a fresh process
    than in one whose earlier frees had raised the threshold. Tuned, every process starts equal."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 64 * MiB)
    libc.mallopt(M_TRIM_THRESHOLD, 256 * MiB)


def _measured(part: str, nice: int, malloc: str, kwargs: dict[str, Any]) -> Any:
    """In the fresh process: malloc and niceness set before any thread starts (torch's and the reader's threads
    inherit the niceness), then the part."""
    if malloc == "tuned":
        tune_malloc()
    if nice:  # niceness ranks processes within a scheduler autogroup only: a new session gets its own
        os.setsid()
        with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
            f.write(f"{nice}\n")
        os.nice(nice)
    return globals()[part](**kwargs)


RUN = {"nice": 0, "malloc": "tuned"}  # every measured process: --nice, --malloc


def measured(part: Callable[..., Any], env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """``part(**kwargs)`` in a fresh process (``bench/common.isolated``) with this run's niceness and malloc."""
    return isolated(_measured, env=env, part=part.__name__, nice=RUN["nice"], malloc=str(RUN["malloc"]), kwargs=kwargs)


class TimedModule:
    """Wraps a model's module: counts forward calls and the time spent in them."""

    def __init__(self, module: Any) -> None:
        self.module, self.calls, self.seconds = module, 0, 0.0
        self.times: list[float] = []
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, x: torch.Tensor) -> Any:
        t0 = time.perf_counter()
        out = self.module(x)
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.times.append(dt)
        self.shapes.append(tuple(x.shape))
        self.calls += 1
        return out


def setup_torch(threads: int) -> None:
    torch.set_num_threads(threads)


# -- (a) cubelake -----------------------------------------------------------------------------------


def run_cubelake(model_path: str, scene: str, pixels: list[tuple[int, int]], threads: int,
                 cache_bytes: int) -> dict[str, Any]:
    """``predict_blocks`` over the whole scene; blocks consumed and dropped; probabilities kept at ``pixels``."""
    from cubelake.infer.blocks import PredictSettings, PredictStats, predict_blocks
    from cubelake.infer.model import load_model
    from cubelake.loaders.reader import ReaderConfig
    from cubelake.loaders.sources import open_source

    setup_torch(threads)
    model = load_model(model_path)
    timed = TimedModule(model.module)
    model.module = timed
    src = open_source(scene, prefer=("zarr",))
    settings = PredictSettings(batch=BATCH, tile_batch=TILE_BATCH, outputs=("classes", "probabilities"))
    want: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    g = src.grid
    for i, (y, x) in enumerate(pixels):
        want.setdefault((y // g.chunk_y, x // g.chunk_x), []).append((i, y % g.chunk_y, x % g.chunk_x))
    got = np.full((len(pixels), model.spec.classes), np.nan, np.float32)
    counts = np.zeros(model.spec.classes + 1, np.int64)
    stats = PredictStats()
    rss0 = rss_bytes()
    reset_peak_rss()
    oc = OtherCpu()
    t0 = time.perf_counter()
    blocks = 0
    for b in predict_blocks(model, src, settings, stats=stats, reader=ReaderConfig(cache_bytes=cache_bytes)):
        blocks += 1
        assert b.probs is not None
        assert b.classes is not None
        for i, yy, xx in want.get((b.cy, b.cx), []):
            got[i] = b.probs[:, yy, xx]
        counts += np.bincount(np.minimum(b.classes.ravel(), model.spec.classes), minlength=model.spec.classes + 1)
    wall = time.perf_counter() - t0
    other = oc.cores(wall)
    return {"wall_s": wall, "other_cores": other, "blocks": blocks, "pixels": stats.pixels, "nodata_pixels": stats.nodata_pixels,
            "tiles": stats.tiles, "chunks_decoded": stats.chunks_decoded, "redecodes": stats.redecodes,
            "halo": stats.halo, "forward_s": timed.seconds, "forward_calls": timed.calls, "first_forward_s": timed.times[0],
            "forward_median_s": float(np.median(timed.times[1:] or timed.times)), "shapes": timed.shapes,
            "threads": threads,
            "peak_rss_delta": rss_bytes("VmHWM") - rss0, "rss_before": rss0, "class_counts": counts.tolist(),
            "probs": got, "warnings": stats.warnings, "grid_chunks": g.n_chunks, "chunk_nbytes": src.chunk_nbytes}


# -- (b) naive --------------------------------------------------------------------------------------


def scene_affine(scene: str) -> tuple[np.ndarray, np.ndarray, float]:
    """Per band ``gain``, ``offset`` (stored value -> model input) as cubelake derives them, and the fill value."""
    from cubelake.loaders.normalise import normalisation
    from cubelake.loaders.reader import ReaderConfig
    from cubelake.loaders.sources import open_source

    src = open_source(scene, prefer=("zarr",))
    stats = normalisation([src], [None], "scene", ReaderConfig(), 4)[0]
    assert stats is not None
    mean, std = (np.asarray(v, np.float64) for v in stats)
    gain = (src.scale / std).astype(np.float32)
    offset = ((src.add_offset - mean) / std).astype(np.float32)
    return gain, offset, float(src.fill_value if src.fill_value is not None else NODATA)


class NaiveReader:
    """One ``p`` x ``p`` x bands window of stored values around a pixel, read on its own (nodata beyond the edges)."""

    def __init__(self, kind: str, path: str, side: int, p: int) -> None:
        self.kind, self.side, self.p, self.r = kind, side, p, p // 2
        self.gets = 0
        if kind == "rasterio":
            import rasterio

            self.h = rasterio.open(path)
        else:
            import zarr
            import zarr.storage

            outer = self

            class Counting(zarr.storage.WrapperStore):  # counts data-chunk GETs (each one a decode)
                async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
                    buf = await self._store.get(key, prototype, byte_range)
                    if buf is not None and "/c/" in f"/{key}":
                        outer.gets += 1
                    return buf

            store = Counting(zarr.storage.LocalStore(path, read_only=True))
            self.h = zarr.open_group(store, mode="r")["data"]

    def read(self, y: int, x: int) -> np.ndarray:
        """The window, clipped to the raster and padded with nodata (rasterio's ``boundless=True`` goes
        through a VRT that re-reads whole tiles on every call: 48 MB per 9 x 9 window here)."""
        r, p = self.r, self.p
        y0, y1, x0, x1 = max(y - r, 0), min(y + r + 1, self.side), max(x - r, 0), min(x + r + 1, self.side)
        if self.kind == "rasterio":
            from rasterio.windows import Window

            part = self.h.read(window=Window(x0, y0, x1 - x0, y1 - y0))
        else:
            part = self.h[:, y0:y1, x0:x1]
        if part.shape[1:] == (p, p):
            return part
        out = np.full((part.shape[0], p, p), NODATA, part.dtype)
        out[:, y0 - (y - r):y1 - (y - r), x0 - (x - r):x1 - (x - r)] = part
        return out


def naive_input(raw: np.ndarray, gain: np.ndarray, offset: np.ndarray, fill: float, layout: str) -> torch.Tensor:
    """One window of stored values -> the model's batch-1 input, normalised as cubelake does (nodata -> 0)."""
    bad = raw == np.asarray(fill).astype(raw.dtype)
    x = raw.astype(np.float32) * gain[:, None, None] + offset[:, None, None]
    x[bad] = 0.0
    if layout == "B1C":
        return torch.from_numpy(np.ascontiguousarray(x[None, None, :, 0, 0]))
    if layout == "BC":
        return torch.from_numpy(np.ascontiguousarray(x[None, :, 0, 0]))
    return torch.from_numpy(x[None, None] if layout == "B1CHW" else x[None])


def run_naive(model_path: str, scene: str, path: str, kind: str, side: int, pixels: list[tuple[int, int]],
              threads: int) -> dict[str, Any]:
    """Per pixel: read its window, normalise, run the model on it alone; times split into read / prep / forward."""
    from cubelake.infer.model import load_model

    setup_torch(threads)
    model = load_model(model_path)
    spec = model.spec
    p = spec.patch if spec.kind == "pixel" else 2 * (spec.receptive_field or SEG_RF) + 1
    gain, offset, fill = scene_affine(scene)
    rd = NaiveReader(kind, path, side, p)
    c = p // 2
    probs = np.full((len(pixels), spec.classes), np.nan, np.float32)
    t_read = t_prep = t_fwd = 0.0
    run = 0
    rss0 = rss_bytes()
    reset_peak_rss()
    io0 = rchar()
    oc = OtherCpu()
    t0 = time.perf_counter()
    for i, (y, x) in enumerate(pixels):
        ta = time.perf_counter()
        raw = rd.read(y, x)
        tb = time.perf_counter()
        t_read += tb - ta
        if (raw[:, c, c] == np.asarray(fill).astype(raw.dtype)).all():  # a nodata pixel: nothing to run
            continue
        inp = naive_input(raw, gain, offset, fill, spec.layout)
        tc = time.perf_counter()
        t_prep += tc - tb
        out = model(inp).float()
        if spec.output == "logits":
            out = torch.softmax(out, dim=1)
        probs[i] = out[0, :, c, c].numpy() if spec.kind == "dense" else out[0].numpy()
        t_fwd += time.perf_counter() - tc
        run += 1
    wall = time.perf_counter() - t0
    other = oc.cores(wall)
    return {"wall_s": wall, "other_cores": other, "samples": len(pixels), "run": run, "read_s": t_read, "prep_s": t_prep,
            "forward_s": t_fwd, "read_bytes": rchar() - io0, "chunk_gets": rd.gets, "window": p, "threads": threads,
            "peak_rss_delta": rss_bytes("VmHWM") - rss0, "probs": probs}


# -- (c) ceiling ------------------------------------------------------------------------------------


def run_ceiling(model_path: str, shapes: list[list[int]], threads: int, seconds: float) -> dict[str, Any]:
    """The forward pass (+ softmax) alone on pre-built random inputs in memory, called with the input shapes
    (a) called it with, in its order; stopped after ``seconds`` (then scaled by the samples run)."""
    from cubelake.infer.model import load_model

    setup_torch(threads)
    model = load_model(model_path)
    dense = model.spec.kind == "dense"
    if dense:  # a few window shapes: one tensor each
        pool = {tuple(sh): torch.randn(*sh, generator=torch.Generator().manual_seed(i)) for i, sh in enumerate(shapes)}
        inputs = [pool[tuple(sh)] for sh in shapes]
    else:  # batches of one layout: slices of one full batch (contiguous along the batch axis)
        full = torch.randn(max(sh[0] for sh in shapes), *shapes[0][1:], generator=torch.Generator().manual_seed(0))
        inputs = [full[:sh[0]] for sh in shapes]
    for _ in range(2):  # warm-up with (a)'s first shape (TorchScript's profiling executor specialises on the
        model(inputs[0])  # shapes of its first calls)
    total = sum(sh[0] for sh in shapes)
    done = calls = 0
    oc = OtherCpu()
    t0 = time.perf_counter()
    for x in inputs:
        out = model(x).float()
        if model.spec.output == "logits":
            torch.softmax(out, dim=1)
        done += x.shape[0]
        calls += 1
        if time.perf_counter() - t0 >= seconds:
            break
    wall = time.perf_counter() - t0
    other = oc.cores(wall)
    return {"inputs_run": done, "inputs_target": total, "calls": calls, "calls_target": len(shapes), "wall_s": wall,
            "other_cores": other, "scene_s_scaled": wall * total / done}


# -- (d) end to end -----------------------------------------------------------------------------------


def run_e2e(model_path: str, lake: str, scene_id: str, threads: int) -> dict[str, Any]:
    """``predict_scene`` into a copy of the lake: predict, write COG + Zarr, publish, index; then again (a no-op).

    The model is loaded and the modules a first call imports (torch.export's deserialiser, dask.array and
    xarray for the Zarr store) are imported before the clock starts; that one-off cost is ``cold_s``."""
    tc = time.perf_counter()
    import dask.array  # noqa: F401  (imported by cubelake.infer.product on its first Zarr store)
    import xarray  # noqa: F401

    from cubelake.infer.blocks import PredictSettings
    from cubelake.infer.model import load_model
    from cubelake.infer.predict import predict_scene

    setup_torch(threads)
    model = load_model(model_path)
    cold = time.perf_counter() - tc
    settings = PredictSettings(batch=BATCH, tile_batch=TILE_BATCH)
    rss0 = rss_bytes()
    reset_peak_rss()
    oc = OtherCpu()
    t0 = time.perf_counter()
    res = predict_scene(lake, scene_id, model, settings)
    wall = time.perf_counter() - t0
    other = oc.cores(wall)
    peak = rss_bytes("VmHWM") - rss0
    t1 = time.perf_counter()
    again = predict_scene(lake, scene_id, model, settings)
    return {"wall_s": wall, "other_cores": other, "cold_s": cold, "status": res.status, "message": res.message,
            "item_url": res.item_url, "predict_wall_s": res.stats.wall_s, "peak_rss_delta": peak,
            "rerun_status": again.status, "rerun_s": time.perf_counter() - t1}


# -- the run ----------------------------------------------------------------------------------------


def bench_model(name: str, path: Path, paths: dict[str, Path], a: argparse.Namespace, side: int,
                pixels: list[tuple[int, int]], cache: int) -> dict[str, Any]:
    """(a), (b) and (c) for one model, each in a fresh process."""
    scene_px = side * side
    print(f"\n{name}", flush=True)
    out: dict[str, Any] = {}
    for key, threads in (("cubelake", a.threads), ("cubelake_1t", 1)):
        if key == "cubelake_1t" and (name not in a.one_thread or a.threads == 1):
            continue
        runs: list[dict[str, Any]] = []
        while not runs or (len(runs) < a.repeats and sum(r["wall_s"] for r in runs) < a.repeat_seconds):
            print(f"  (a) cubelake predict_blocks, {threads} torch thread(s), run {len(runs) + 1} ...", flush=True)
            runs.append(measured(run_cubelake, model_path=str(path), scene=str(paths["scene"]), pixels=pixels,
                                 threads=threads, cache_bytes=cache))
            print(f"      {runs[-1]['wall_s']:.1f} s, forward {runs[-1]['forward_s']:.1f} s", flush=True)
        cl = sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2]  # the median run (lower median)
        cl["walls_s"] = [r["wall_s"] for r in runs]
        cl["scene_px_s"] = scene_px / cl["wall_s"]
        out[key] = cl
    cl = out["cubelake"]
    gdal_env = {"GDAL_CACHEMAX": str(cache // MiB)}
    naive = [("naive_rasterio", "rasterio", a.threads, a.naive_samples), ("naive_rasterio_1t", "rasterio", 1, a.naive_samples),
             ("naive_zarr", "zarr", a.threads, a.zarr_samples)]
    for key, kind, threads, n in naive:
        if n <= 0 or (key == "naive_rasterio_1t" and a.threads == 1):
            continue
        where = paths["cog"] if kind == "rasterio" else paths["zarr"]
        print(f"  (b) naive per-patch, {kind} reads, {threads} torch thread(s), {n} sampled pixels ...", flush=True)
        nv = measured(run_naive, env=gdal_env if kind == "rasterio" else None, model_path=str(path),
                      scene=str(paths["scene"]), path=str(where), kind=kind, side=side, pixels=pixels[:n], threads=threads)
        nv["scene_px_s"] = nv["samples"] / nv["wall_s"]
        nv["scene_s_extrapolated"] = scene_px / nv["scene_px_s"]
        nv_probs = nv.pop("probs")
        nv["max_abs_diff_vs_cubelake"] = float(np.nanmax(np.abs(nv_probs - cl["probs"][:n]), initial=0.0))
        nv["checked"] = int((~np.isnan(cl["probs"][:n, 0])).sum())
        nv["nodata_mismatch"] = int((np.isnan(nv_probs[:, 0]) != np.isnan(cl["probs"][:n, 0])).sum())
        print(f"      {nv['scene_px_s']:,.1f} px/s (extrapolated), max |diff| vs cubelake {nv['max_abs_diff_vs_cubelake']:.2e}",
              flush=True)
        out[key] = nv
    for key, ck, threads in (("ceiling", "cubelake", a.threads), ("ceiling_1t", "cubelake_1t", 1)):
        if ck not in out:
            continue
        shapes = out[ck]["shapes"]
        print(f"  (c) ceiling: forward alone on pre-built inputs, (a)'s {len(shapes)} calls, {threads} torch thread(s) ...",
              flush=True)
        ce = measured(run_ceiling, model_path=str(path), shapes=shapes, threads=threads, seconds=a.ceiling_seconds)
        ce["scene_px_s"] = scene_px / ce["scene_s_scaled"]
        ce["threads"] = threads
        print(f"      {ce['scene_px_s']:,.0f} px/s ({ce['calls']} of {len(shapes)} calls run)", flush=True)
        out[key] = ce
    for k in ("cubelake", "cubelake_1t"):
        out.get(k, {}).pop("probs", None)
        if k in out:
            sh = out[k].pop("shapes")
            out[k]["batch_sizes"] = sorted({x[0] for x in sh})
            out[k]["input_shapes"] = sorted({tuple(x[1:]) for x in sh})
    return out


def bound_of(r: dict[str, Any]) -> str:
    """What bounds (a): the share of its wall time spent in the model's forward pass."""
    cl = r["cubelake"]
    share = cl["forward_s"] / cl["wall_s"]
    if share >= 0.7:
        return f"compute: forward {share:.0%} of wall"
    return f"data path: forward {share:.0%} of wall"


NAIVE = (("naive_rasterio", "rasterio COG windows"), ("naive_rasterio_1t", "rasterio COG windows"),
         ("naive_zarr", "zarr slicing"))


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, r in results.items():
        c = r["cubelake"]["scene_px_s"]
        d = {"cubelake/ceiling": c / r["ceiling"]["scene_px_s"]}
        for k, _ in NAIVE:
            if k in r:
                d[f"cubelake/{k}"] = c / r[k]["scene_px_s"]
        if "cubelake_1t" in r:
            d["cubelake_1t/ceiling_1t"] = r["cubelake_1t"]["scene_px_s"] / r["ceiling_1t"]["scene_px_s"]
        out[name] = d
    return out


def _cubelake_row(label: str, cl: dict[str, Any]) -> list[str]:
    w = cl["walls_s"]
    runs = f"median of {len(w)} runs ({min(w):.1f}–{max(w):.1f} s)" if len(w) > 1 else "1 run"
    return [label, f"{cl['scene_px_s']:,.0f}", f"{cl['wall_s']:.1f}",
            f"whole scene, {runs}; {cl['forward_calls']} forwards, median {cl['forward_median_s'] * 1e3:.0f} ms, "
            f"1st {cl['first_forward_s'] * 1e3:.0f} ms", f"{cl['forward_s']:.1f}",
            f"{cl['chunks_decoded']} ({cl['grid_chunks']})", str(cl["redecodes"]), f"{cl['peak_rss_delta'] / MiB:.0f}", "", "",
            f"{cl['other_cores']:.2f}"]


def _naive_row(label: str, nv: dict[str, Any]) -> list[str]:
    f = nv["scene_s_extrapolated"] / nv["wall_s"]
    return [label, f"{nv['scene_px_s']:,.1f}", f"{nv['scene_s_extrapolated']:,.0f}",
            f"extrapolated from {nv['samples']} px; read {nv['read_s'] / nv['samples'] * 1e3:.1f} ms/px",
            f"{nv['forward_s'] * f:,.0f}", f"{nv['chunk_gets'] * f:,.0f}" if nv["chunk_gets"] else "(GDAL cache)", "",
            f"{nv['peak_rss_delta'] / MiB:.0f}", f"{nv['read_bytes'] / MB:.1f}", f"{nv['max_abs_diff_vs_cubelake']:.1e}",
            f"{nv['other_cores']:.2f}"]


def _ceiling_row(ce: dict[str, Any]) -> list[str]:
    return [f"(c) ceiling: forward alone, {ce['threads']} thread(s)", f"{ce['scene_px_s']:,.0f}", f"{ce['scene_s_scaled']:.1f}",
            f"(a)'s input shapes: {ce['calls']} of its {ce['calls_target']} calls ({ce['inputs_run']:,} of "
            f"{ce['inputs_target']:,} inputs){', scaled' if ce['calls'] < ce['calls_target'] else ''}",
            f"{ce['wall_s']:.1f}", "", "", "", "", "", f"{ce['other_cores']:.2f}"]


def _e2e_row(e: dict[str, Any], scene_px: int) -> list[str]:
    if "error" in e:
        return ["(d) predict_scene end to end", "failed", "", e["error"][:80], "", "", "", "", "", "", ""]
    return ["(d) predict_scene end to end", f"{scene_px / e['wall_s']:,.0f}", f"{e['wall_s']:.1f}",
            f"{e['status']}: predict pass {e['predict_wall_s']:.1f} s, the rest writing/publishing; rerun "
            f"{e['rerun_status']} in {e['rerun_s']:.2f} s; + {e['cold_s']:.1f} s imports & model load once",
            "", "", "", f"{e['peak_rss_delta'] / MiB:.0f}", "", "", f"{e['other_cores']:.2f}"]


def print_tables(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=240)
    sc, th = doc["scene"], doc["args"]["threads"]
    t = Table(title=f"whole-scene prediction: {sc['bands']} x {sc['side']} x {sc['side']} int16 ({sc['valid_fraction']:.1%} "
                    f"valid), chunk {CHUNK}, CPU fp32, malloc {doc['args']['malloc']}, nice {doc['args']['nice']}; px/s = scene "
                    "pixels per second", title_justify="left")
    for i, c in enumerate(["model", "method", "scene px/s", "scene s", "how", "forward s", "chunk decodes (grid)",
                           "redecodes", "peak RSS Δ MiB", "read MB", "max|Δp| vs (a)", "other cores"]):
        t.add_column(c, justify="left" if i in (0, 1, 4) else "right")
    for name, r in doc["results"].items():
        rows = [_cubelake_row(f"(a) cubelake predict_blocks, {th} threads", r["cubelake"])]
        if "cubelake_1t" in r:
            rows.append(_cubelake_row("(a) cubelake predict_blocks, 1 thread", r["cubelake_1t"]))
        rows += [_naive_row(f"(b) naive, {label}, {r[k]['threads']} thread(s)", r[k]) for k, label in NAIVE if k in r]
        for k in ("ceiling", "ceiling_1t"):
            if k in r:
                rows.append(_ceiling_row(r[k]))
        if "e2e" in r:
            rows.append(_e2e_row(r["e2e"], sc["pixels"]))
        for i, row in enumerate(rows):
            t.add_row(name if i == 0 else "", *row)
        t.add_section()
    con.print(t)
    t = Table(title="ratios of scene px/s, and what bounds (a) (its forward time / its wall time)", title_justify="left")
    cols = ["model", f"cubelake / naive rasterio ({th} thr)", "cubelake / naive rasterio (1 thr)", "cubelake / naive zarr",
            "cubelake / ceiling", "cubelake / ceiling (1 thr)", "bound"]
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i in (0, len(cols) - 1) else "right")
    for name, d in doc["ratios"].items():
        def f(k: str, fmt: str = "{:,.0f}x", d: dict[str, float] = d) -> str:
            return fmt.format(d[k]) if k in d else "-"
        t.add_row(name, f("cubelake/naive_rasterio"), f("cubelake/naive_rasterio_1t"), f("cubelake/naive_zarr"),
                  f("cubelake/ceiling", "{:.2f}"), f("cubelake_1t/ceiling_1t", "{:.2f}"), doc["results"][name]["bound"])
    con.print(t)


def sample_pixels(side: int, n: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    flat = rng.choice(side * side, size=min(n, side * side), replace=False)
    return [(int(i // side), int(i % side)) for i in flat]


def run_e2e_all(names: list[str], models: dict[str, Path], paths: dict[str, Path], work: Path,
                results: dict[str, Any], threads: int) -> None:
    lake = work / "e2e_lake"
    shutil.rmtree(lake, ignore_errors=True)
    shutil.copytree(paths["lake"], lake)
    for name in names:
        print(f"\n(d) {name}: predict_scene end to end (predict + COG/Zarr + publish + index) ...", flush=True)
        try:
            e = measured(run_e2e, model_path=str(models[name]), lake=str(lake), scene_id=paths["scene"].name,
                         threads=threads)
            print(f"      {e['wall_s']:.1f} s ({e['status']}); rerun: {e['rerun_status']} in {e['rerun_s']:.2f} s", flush=True)
        except RuntimeError as exc:
            msg = str(exc).strip().splitlines()[-1]
            print(f"      failed: {msg}", flush=True)
            e = {"error": msg}
        results[name]["e2e"] = e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench/predict"), help="scene, lake and models (kept)")
    ap.add_argument("--quick", action="store_true", help="a smoke test: 256 x 256 x 200, fewer naive samples")
    ap.add_argument("--size", type=int, default=None, help="scene side in pixels (default 512; --quick 256)")
    ap.add_argument("--bands", type=int, default=200)
    ap.add_argument("--border", type=int, default=12, help="nodata border width in pixels")
    ap.add_argument("--width", type=int, default=6, help="the 3-D CNN's first-layer channels")
    ap.add_argument("--naive-samples", type=int, default=None, help="pixels timed, rasterio (default 2000; --quick 100)")
    ap.add_argument("--zarr-samples", type=int, default=None, help="pixels timed, zarr (default 500; --quick 50)")
    ap.add_argument("--ceiling-seconds", type=float, default=None, help="time cap of (c) (default 20; --quick 5)")
    ap.add_argument("--cache-mib", type=int, default=256, help="decoded-data budget: cubelake cache_bytes and GDAL_CACHEMAX")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of (a), (b), (c) (default: cores)")
    ap.add_argument("--one-thread", default="spectral1d,seg2d",
                    help="models whose (a) also runs with 1 torch thread (its decode threads and torch share the cores)")
    ap.add_argument("--repeats", type=int, default=None, help="runs of (a) per model (default 3, --quick 1; the median is "
                    "reported) ...")
    ap.add_argument("--repeat-seconds", type=float, default=20.0, help="... while their total stays below this")
    ap.add_argument("--models", default="pixel3d,spectral1d,seg2d")
    ap.add_argument("--e2e", default="spectral1d,seg2d", help="models timed with predict_scene end to end ('' for none)")
    ap.add_argument("--nice", type=int, default=0, help="niceness of every measured process, in its own autogroup "
                    "(negative needs root; the recorded run used -10)")
    ap.add_argument("--malloc", choices=("tuned", "default"), default="tuned",
                    help="glibc malloc in every measured process: tuned (mallopt: allocations up to 64 MiB from the "
                    "heap; see tune_malloc) or glibc's default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    side = a.size or (256 if a.quick else 512)
    a.naive_samples = a.naive_samples if a.naive_samples is not None else (100 if a.quick else 2000)
    a.zarr_samples = a.zarr_samples if a.zarr_samples is not None else (50 if a.quick else 500)
    a.ceiling_seconds = a.ceiling_seconds if a.ceiling_seconds is not None else (5.0 if a.quick else 20.0)
    a.repeats = a.repeats if a.repeats is not None else (1 if a.quick else 3)
    names = [m for m in a.models.split(",") if m]
    RUN.update(nice=a.nice, malloc=a.malloc)
    a.one_thread = [m for m in a.one_thread.split(",") if m]
    t_start = time.perf_counter()
    a.workdir.mkdir(parents=True, exist_ok=True)
    paths = ensure_lake(a.workdir, side, a.bands, a.border)
    models = save_models(a.workdir / "models", a.bands, a.width)
    valid = (side - 2 * a.border) ** 2
    doc: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "loadavg_start": os.getloadavg(),
        "args": {k: str(v) for k, v in vars(a).items()},
        "scene": {"side": side, "bands": a.bands, "border": a.border, "pixels": side * side, "valid_pixels": valid,
                  "valid_fraction": valid / (side * side), "raw_bytes": side * side * a.bands * 2,
                  "id": paths["scene"].name, "chunk": CHUNK,
                  "cog_bytes": paths["cog"].stat().st_size,
                  "zarr_bytes": sum(f.stat().st_size for f in paths["zarr"].rglob("*") if f.is_file())},
        "settings": {"batch": BATCH, "tile_batch": TILE_BATCH, "cache_bytes": a.cache_mib * MiB},
    }
    pixels = sample_pixels(side, max(a.naive_samples, a.zarr_samples), a.seed)
    results: dict[str, Any] = {}
    for name in names:
        results[name] = bench_model(name, models[name], paths, a, side, pixels, a.cache_mib * MiB)
        results[name]["bound"] = bound_of(results[name])
    e2e = [m for m in a.e2e.split(",") if m in names]
    if e2e:
        run_e2e_all(e2e, models, paths, a.workdir, results, a.threads)
    doc["results"] = results
    doc["ratios"] = ratios(results)
    import rasterio
    import zarr

    doc["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                      "python": platform.python_version(), "loadavg_end": os.getloadavg(),
                      "versions": {"torch": torch.__version__, "zarr": zarr.__version__, "rasterio": rasterio.__version__,
                                   "gdal": rasterio.__gdal_version__}}
    doc["total_s"] = time.perf_counter() - t_start
    print()
    print_tables(doc)
    print(f"\ntotal {doc['total_s']:.0f} s; load average at start {doc['loadavg_start'][0]:.2f}, "
          f"at end {doc['machine']['loadavg_end'][0]:.2f}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)) + "\n")
        print(f"wrote {a.json}")
    bad = [n for n, r in results.items() for k, _ in NAIVE
           if k in r and (not r[k]["max_abs_diff_vs_cubelake"] <= 1e-4 or r[k]["nodata_mismatch"])]
    if bad:
        print(f"CHECK FAILED: naive and cubelake probabilities differ for {sorted(set(bad))}")
        sys.exit(1)


if __name__ == "__main__":
    main()
