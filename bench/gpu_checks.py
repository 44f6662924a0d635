"""The CUDA checks of the inference tools, as one command for a machine with an NVIDIA GPU.

1. ``pytest -m gpu tests/infer -q``: the tests marked ``gpu`` (CUDA-event timing, an OOM search under
   ``set_per_process_memory_fraction``, in this process and in fresh processes); log in ``pytest_gpu.log``.
2. The seed's sweep: a 3-D CNN over 15 x 15 x 200-band patches (three spectral-spatial convolutions,
   the kind of model in the seed article), batch 64..1024, fp32, with the OOM search under a memory cap
   (default 16 GiB of the device, so that the search's largest batches stay within ~30 s of device time;
   ``--memory-cap 0`` searches the whole device); then the same curve in bf16 (timing only). Reports in
   ``sweep_fp32/`` and ``sweep_bf16/`` (sweep.json, sweep.png).
3. :func:`scene_prediction_check`: a 512 x 512 x 200 scene predicted on CUDA (fp32, bf16, fp16) against
   the same prediction on CPU; ``scene_prediction.json``.

``summary.json`` holds each step's outcome and seconds. Exit 1 if a step failed.

    python bench/gpu_checks.py [--out DIR] [--memory-cap 16GiB] [--skip-pytest]

``--out`` defaults to ``$OUT`` when it is set (the device machine's folder that comes back), else
``bench/results/gpu``. The machine needs a CUDA build of torch and cubelake's own dependencies
(``import cubelake.infer`` needs numpy, pydantic, filelock and torch; the tests also need the test stack:
rasterio, zarr, ...); the first lines printed say what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

#: The seed's sweep: patch 15, 200 bands, 64..1024 (half steps above 256).
BATCHES = (64, 128, 256, 384, 512, 768, 1024)


def _parse_cap(text: str) -> int | None:
    units = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in units else ""
    value = float(t[: len(t) - len(unit)] or "0")
    return int(value * units[unit]) or None


def environment() -> dict[str, Any]:
    """What this machine has: Python, torch and its CUDA, the device, and which of cubelake's imports fail."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    try:
        import torch

        env.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env.update(device=p.name, device_memory_gib=round(p.total_memory / 2**30, 1))
    except ImportError as exc:
        env["torch"] = f"missing ({exc})"
    missing = []
    for mod in ("numpy", "pydantic", "filelock", "matplotlib", "cubelake.infer", "rasterio", "zarr", "pytest"):
        try:
            __import__(mod)
        except ImportError as exc:
            missing.append(f"{mod}: {exc}")
    env["missing"] = missing
    return env


def seed_cnn(classes: int = 16) -> Any:
    """The seed-like 3-D CNN: three spectral-spatial convolutions (8, 16, 32 channels), a mean, a classifier."""
    import torch

    class Net3D(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = torch.nn.Conv3d(1, 8, (7, 3, 3))
            self.c2 = torch.nn.Conv3d(8, 16, (5, 3, 3))
            self.c3 = torch.nn.Conv3d(16, 32, (3, 3, 3))
            self.fc = torch.nn.Linear(32, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))))
            return self.fc(x.mean(dim=(2, 3, 4)))

    return Net3D()


def run_pytest(out_dir: Path) -> dict[str, Any]:
    log = out_dir / "pytest_gpu.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/infer", "-q", "-p", "no:cacheprovider", "-rs"]
    with open(log, "w") as f:
        res = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False, timeout=480)
    tail = log.read_text(errors="replace").strip().splitlines()[-1:]
    return {"ok": res.returncode == 0, "returncode": res.returncode, "last_line": tail[0] if tail else "",
            "log": log.name}


def cuda_sweep(out_dir: Path, dtype: str, cap: int | None, find_oom: bool) -> dict[str, Any]:
    """The seed's sweep on CUDA; its report in ``out_dir/sweep_<dtype>/``."""
    from cubelake.infer import ModelSpec, SweepSettings, run_sweep, save_model, write_report

    spec = ModelSpec(name="seed3d", kind="pixel", layout="B1CHW", bands=200, classes=16, patch=15)
    folder = out_dir / f"sweep_{dtype}"
    folder.mkdir(parents=True, exist_ok=True)
    path = save_model(seed_cnn(), folder / "seed3d.pt", spec)
    settings = SweepSettings(batches=BATCHES, device="cuda", dtype=dtype, warmup=20, iters=100,  # type: ignore[arg-type]
                             memory_cap=cap, find_oom=find_oom)
    report = run_sweep(path, settings)
    write_report(report, folder)
    path.unlink()  # the model is rebuilt by this script; only the reports come back
    o, p, m = report.oom, report.plateau, report.memory
    return {
        "ok": True, "dtype": dtype, "device": report.environment.get("device_name"),
        "ms_per_sample": {t.batch: t.ms_per_sample for t in report.sweep},
        "elasticities": [[a, b, round(e, 4)] for a, b, e in report.elasticities],
        "plateau": [p.start, p.end] if p else None,
        "oom": {"max_fit": o.max_fit, "first_oom": o.first_oom, "trials": len(o.trials), "converged": o.converged}
        if o else None,
        "memory_model": {"m0_mib": m.m0_bytes / 2**20, "per_sample_mib": m.per_sample_bytes / 2**20, "r2": m.r2}
        if m else None,
        "cap_gib": None if report.memory_cap_bytes is None else report.memory_cap_bytes / 2**30,
        "predicted_max_batch": report.predicted_max_batch, "measured_max_batch": report.measured_max_batch,
        "seconds": round(report.seconds, 1),
    }


def _scene_lake(folder: Path, size: int = 512, bands: int = 200) -> Path:
    """A synthetic int16 scene (``size``² x ``bands``, smooth spectra, a nodata corner) ingested with 128-px chunks."""
    import numpy as np
    import rasterio
    from rasterio.transform import from_origin

    from cubelake.ingest import IngestOptions, ingest

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size] / size
    base = np.sin(np.linspace(0, 3, bands))[:, None, None]
    cube = (1000 + 800 * base * (1 + yy + xx) + rng.normal(0, 20, (bands, size, size))).astype("int16")
    cube[:, :40, :40] = -9999
    tif = folder / "gpu_scene.tif"
    with rasterio.open(tif, "w", driver="GTiff", count=bands, height=size, width=size, dtype="int16", nodata=-9999,
                       crs="EPSG:32633", transform=from_origin(360000, 5810000, 30, 30), tiled=True,
                       blockxsize=128, blockysize=128) as dst:
        dst.write(cube)
    lake = folder / "lake"
    res = ingest([tif], lake, IngestOptions(chunk=128, products=("zarr", "cog")))
    if res[0].outcome.value != "ingested":
        raise RuntimeError(f"ingest failed: {res[0].message}")
    return lake


def _seg_model(path: Path, bands: int) -> Path:
    import torch

    from cubelake.infer import ModelSpec, Preprocessing, save_model

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(bands, 32, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 6, 1))
    spec = ModelSpec(name="gpuseg", kind="dense", layout="BCHW", bands=bands, classes=6, patch=0,
                     receptive_field=2, preprocessing=Preprocessing(normalize="scene"))
    return save_model(net, path, spec, format="export")


def scene_prediction_check(out_dir: Path) -> dict[str, Any]:
    """A scene predicted on CUDA (fp32, bf16, fp16), compared with the same prediction on CPU (fp32).

    The class maps must agree on every pixel in fp32 (probabilities within 1e-4) and on >= 99 % of the
    pixels in half precision; pixels/s of each run is reported. Writes ``scene_prediction.json``.
    """
    import tempfile

    import numpy as np

    from cubelake.infer import load_model
    from cubelake.infer.blocks import PredictSettings, PredictStats, predict_blocks
    from cubelake.loaders.sources import open_source

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lake = _scene_lake(folder)
        model_path = _seg_model(folder / "seg.pt2", 200)
        src = open_source(lake / "scenes" / "gpu_scene")

        def run(device: str, dtype: str) -> tuple[np.ndarray, np.ndarray, PredictStats]:
            stats = PredictStats()
            g = src.grid
            probs = np.zeros((6, g.height, g.width), np.float32)
            settings = PredictSettings(device=device, dtype=dtype, tile_batch=4)  # type: ignore[arg-type]
            for b in predict_blocks(load_model(model_path), src, settings, stats=stats):
                y, x = b.cy * g.chunk_y, b.cx * g.chunk_x
                probs[:, y:y + b.probs.shape[1], x:x + b.probs.shape[2]] = b.probs
            return probs, np.nan_to_num(probs, nan=-1).argmax(0), stats

        ref, ref_cls, cpu = run("cpu", "fp32")
        out: dict[str, Any] = {"cpu_fp32_pixels_per_s": round(cpu.pixels / cpu.wall_s)}
        ok = True
        for dtype in ("fp32", "bf16", "fp16"):
            probs, cls, st = run("cuda", dtype)
            agree = float((cls == ref_cls).mean())
            diff = float(np.nanmax(np.abs(probs - ref)))
            good = (agree == 1.0 and diff < 1e-4) if dtype == "fp32" else agree >= 0.99
            ok &= good
            out[f"cuda_{dtype}"] = {"pixels_per_s": round(st.pixels / st.wall_s), "class_agreement": agree,
                                    "max_prob_diff": diff, "ok": good, "chunks_decoded": st.chunks_decoded}
    out["ok"] = ok
    (out_dir / "scene_prediction.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def _step(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    print(f"== {name}", flush=True)
    try:
        res = fn()
    except Exception as exc:  # a failed step is reported and the next one runs
        res = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps({k: v for k, v in res.items() if k != "traceback"}, default=str), flush=True)
    if "traceback" in res:
        print(res["traceback"], flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "results" / "gpu"
    ap.add_argument("--out", type=Path, default=default_out)
    ap.add_argument("--memory-cap", default="16GiB", help="cap of the fp32 OOM search (0: the whole device)")
    ap.add_argument("--skip-pytest", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env, indent=2), flush=True)
    summary: dict[str, Any] = {"environment": env}
    if not env.get("cuda_available"):
        summary["error"] = "no CUDA device visible to torch: nothing to check"
        (a.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        print(summary["error"])
        return 1
    cap = _parse_cap(a.memory_cap)
    if not a.skip_pytest:
        summary["pytest_gpu"] = _step("pytest -m gpu tests/infer", lambda: run_pytest(a.out))
    summary["sweep_fp32"] = _step("CUDA sweep fp32 + OOM search", lambda: cuda_sweep(a.out, "fp32", cap, True))
    summary["sweep_bf16"] = _step("CUDA sweep bf16", lambda: cuda_sweep(a.out, "bf16", None, False))
    summary["scene_prediction"] = _step("scene prediction on CUDA", lambda: scene_prediction_check(a.out))
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    failed = [k for k, v in summary.items() if isinstance(v, dict) and v.get("ok") is False]
    print("failed: " + ", ".join(failed) if failed else "all checks passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
