"""The batch-size sweep, end to end: time every batch size, find the plateau, then the OOM wall.

>>> from cubelake.infer import SweepSettings, run_sweep, write_report
>>> report = run_sweep("model.pt", SweepSettings(batches=(64, 128, 256, 512, 1024), device="cuda", find_oom=True))
>>> write_report(report, "out/")                 # out/sweep.json, out/sweep.png

The steps: one trial per batch size (:mod:`.measure`; the sweep stops at the first that runs out of
memory), the elasticity of each step and the plateau (:mod:`.sweep`), then with ``find_oom`` the
search from the largest batch size (a batch the sweep already measured is not run again), and the
memory model fitted over every trial that ran, its predicted largest batch under the cap next to the
one measured.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from .measure import SweepSettings, Trial, prime, resolve_device, run_trial
from .model import LoadedModel, load_model
from .report import SweepReport
from .spec import ModelSpec
from .sweep import OomSearch, SweepSettingsError, elasticities, find_plateau, fit_memory, oom_search

__all__ = ["environment", "run_sweep"]

log = logging.getLogger(__name__)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str) -> dict[str, Any]:
    """Where the sweep ran: device name and memory, torch/CUDA/cuDNN versions, threads, host."""
    env: dict[str, Any] = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
                           "python": platform.python_version(), "platform": platform.platform(),
                           "cpu": _cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, device_memory_bytes=int(props.total_memory),
                   cudnn=torch.backends.cudnn.version(), capability=f"{props.major}.{props.minor}")
    else:
        env.update(device_name=env["cpu"], device_memory_bytes=_host_memory())
    return env


def _host_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _model_info(m: LoadedModel, settings: SweepSettings) -> dict[str, Any]:
    shape = m.spec.input_shape(1, patch=settings.patch, bands=settings.bands, size=settings.size)
    n = 1
    for d in shape[1:]:
        n *= d
    return {"name": m.spec.name, "path": str(m.path), "sha256": m.sha256, "format": m.format,
            "spec": m.spec.to_dict(), "input_shape": list(shape[1:]),
            "input_bytes_per_sample": n * torch.empty((), dtype=settings.torch_dtype).element_size()}


def _check(settings: SweepSettings) -> str:
    device = resolve_device(settings.device)
    if settings.find_oom and device == "cpu" and settings.memory_cap is None:
        raise SweepSettingsError("--find-oom on CPU needs --memory-cap (e.g. 2GiB): without a cap the search "
                                 "would grow the batch until the machine runs out of memory")
    return device


def _timing_curve(model: LoadedModel, settings: SweepSettings, on_trial: Callable[[Trial], None]) -> list[Trial]:
    trials = []
    for b in settings.batches:
        t = run_trial(model, b, settings, phase="sweep")
        trials.append(t)
        on_trial(t)
        if t.oom:
            log.info("batch %d ran out of memory: the larger batch sizes are not timed", b)
            break
    return trials


def _search(model: LoadedModel, settings: SweepSettings, known: list[Trial],
            on_trial: Callable[[Trial], None]) -> tuple[OomSearch, list[Trial]]:
    seen = {t.batch: t for t in known}
    ran: list[Trial] = []

    def fits(b: int) -> bool:
        t = seen.get(b)
        if t is None:
            t = run_trial(model, b, settings, phase="oom")
            seen[b] = t
            ran.append(t)
            on_trial(t)
        return t.ok

    start = max(t.batch for t in known)
    return oom_search(fits, start, settings.grow, settings.tol, settings.max_trials), ran


def _cap(settings: SweepSettings, env: dict[str, Any]) -> int | None:
    if settings.memory_cap is not None:
        return settings.memory_cap
    if settings.device.startswith("cuda"):
        return env.get("device_memory_bytes")
    return None


def run_sweep(model: str | Path | LoadedModel, settings: SweepSettings, *, spec: ModelSpec | None = None,
              on_trial: Callable[[Trial], None] | None = None) -> SweepReport:
    """Sweep ``model`` (a file, or loaded: moved to the device in place) over ``settings.batches``.

    ``spec``: the model's spec when its file has none. ``on_trial`` is called after every trial (progress).
    Raises :class:`~.sweep.SweepSettingsError` for settings that cannot work here (CUDA missing,
    ``find_oom`` on CPU without a cap), :class:`~.errors.ModelError` when the model fails for another
    reason than memory.
    """
    device = _check(settings)
    started, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.perf_counter()
    m = model if isinstance(model, LoadedModel) else load_model(model, spec)
    if not settings.fresh:
        m.to(device, settings.torch_dtype)
        prime(m, settings)
    note = on_trial or (lambda t: None)
    try:
        trials = _timing_curve(m, settings, note)
        curve = [t for t in trials if t.ok]  # the timing curve: the OOM search's trials are not on it
        search = None
        if settings.find_oom:
            search, more = _search(m, settings, trials, note)
            trials += more
    finally:  # the fresh-process trial servers (torch loaded) do not outlive the sweep
        from ._fresh import _close_servers

        _close_servers()
    xs, ys = [t.batch for t in curve], [t.ms_per_batch / t.batch for t in curve if t.ms_per_batch is not None]
    es = elasticities(xs, ys)
    peaks = [(t.batch, t.peak_bytes) for t in trials if t.ok and t.peak_bytes is not None]
    memory = fit_memory([b for b, _ in peaks], [p for _, p in peaks])
    env = environment(device)
    cap = _cap(settings, env)
    return SweepReport(
        model=_model_info(m, settings), settings=settings, environment=env, trials=tuple(trials),
        elasticities=tuple((xs[i], xs[i + 1], e) for i, e in enumerate(es)),
        plateau=find_plateau(xs, ys, settings.threshold) if len(xs) >= 2 else None, oom=search, memory=memory,
        memory_cap_bytes=cap, predicted_max_batch=memory.max_batch(cap) if memory and cap else None,
        started=started, seconds=time.perf_counter() - t0)
