"""The sweep's report: every trial and what was derived from them, as JSON and as a PNG plot.

The JSON (``sweep.json``, format ``cubelake.sweep/1``) holds the settings, the model (file, hash,
spec, input shape), the environment (device name, torch/CUDA versions, threads), every trial in the
order run, the elasticity of each step, the plateau, the OOM search and the memory model with its
predicted largest batch next to the measured one. The PNG (``sweep.png``, matplotlib's Agg canvas,
no pyplot state touched) draws ms/sample (top) and peak memory (bottom) against the batch on a log2
axis, the plateau shaded, the OOM wall marked.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InferError
from .measure import SweepSettings, Trial
from .sweep import MemoryModel, OomSearch, Plateau

__all__ = ["REPORT_FORMAT", "SweepReport", "plot_sweep", "write_report"]

REPORT_FORMAT = "cubelake.sweep/1"
_MIB = 1024 * 1024


@dataclass(frozen=True)
class SweepReport:
    """A finished sweep (see the module docstring). ``elasticities``: ``(from batch, to batch, e)``.

    ``memory_cap_bytes``: what the memory model's ``predicted_max_batch`` is computed against (the CPU
    cap, or on CUDA the cap or else the device's memory); ``measured_max_batch``: the OOM search's.
    """

    model: dict[str, Any]
    settings: SweepSettings
    environment: dict[str, Any]
    trials: tuple[Trial, ...]
    elasticities: tuple[tuple[int, int, float], ...]
    plateau: Plateau | None
    oom: OomSearch | None
    memory: MemoryModel | None
    memory_cap_bytes: int | None
    predicted_max_batch: int | None
    started: str
    seconds: float

    @property
    def sweep(self) -> tuple[Trial, ...]:
        """The timing curve: the sweep's trials that ran, by batch."""
        return tuple(t for t in self.trials if t.phase == "sweep" and t.ok)

    @property
    def measured_max_batch(self) -> int | None:
        return self.oom.max_fit if self.oom is not None else None

    @property
    def prediction_error(self) -> float | None:
        """``predicted / measured - 1`` of the largest batch under the cap."""
        p, m = self.predicted_max_batch, self.measured_max_batch
        return None if p is None or not m else p / m - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT, "started": self.started, "seconds": self.seconds, "model": self.model,
            "settings": self.settings.to_dict(), "environment": self.environment,
            "trials": [t.to_dict() for t in self.trials],
            "elasticities": [{"from": a, "to": b, "elasticity": e} for a, b, e in self.elasticities],
            "plateau": self.plateau.to_dict() if self.plateau else None,
            "oom_search": self.oom.to_dict() if self.oom else None,
            "memory_model": {
                **(self.memory.to_dict() if self.memory else {}), "fitted": self.memory is not None,
                "cap_bytes": self.memory_cap_bytes, "predicted_max_batch": self.predicted_max_batch,
                "measured_max_batch": self.measured_max_batch, "prediction_error": self.prediction_error},
        }


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_report(report: SweepReport, out_dir: str | Path, *, plot: bool = True) -> tuple[Path, Path | None]:
    """Write ``sweep.json`` (and ``sweep.png`` unless ``plot=False``) into ``out_dir`` (created); their paths."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InferError(f"{out}: cannot create the report folder ({exc.strerror}); give another --out") from None
    json_path = out / "sweep.json"
    text = json.dumps(report.to_dict(), indent=2, allow_nan=False)
    _write_atomic(json_path, text.encode())
    png = plot_sweep(report, out / "sweep.png") if plot else None
    return json_path, png


def _new_figure() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise InferError("the sweep plot needs matplotlib (pip install matplotlib); or write the JSON only "
                         "(--no-plot)") from None
    fig = Figure(figsize=(8.5, 7.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_sweep(report: SweepReport, path: str | Path) -> Path:
    """Draw the sweep as a PNG at ``path`` (see the module docstring)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig = _new_figure()
    top, bottom = fig.subplots(2, 1, sharex=True)
    _plot_timing(top, report)
    _plot_memory(bottom, report)
    ticks = sorted({t.batch for t in report.trials if t.phase == "sweep"} or set(report.settings.batches))
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="major", alpha=0.3)
        _mark(ax, report)
    bottom.set_xlabel("batch size (log2)")
    for ax, where in ((top, "upper right"), (bottom, "upper left")):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc=where, fontsize=8)
    env, s = report.environment, report.settings
    fig.suptitle(f"{report.model.get('name')}: input {report.model.get('input_shape')} x B, {s.dtype} on "
                 f"{env.get('device_name')} (torch {env.get('torch')})", fontsize=10)
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, format="png")
    os.replace(tmp, p)
    return p


def _plot_timing(ax: Any, report: SweepReport) -> None:
    pts = report.sweep
    xs = [t.batch for t in pts]
    ys = [t.ms_per_sample for t in pts]
    ax.plot(xs, ys, "o-", color="tab:blue", label="ms / sample (median)")
    for a, b, e in report.elasticities:
        ya = next(t.ms_per_sample for t in pts if t.batch == a)
        yb = next(t.ms_per_sample for t in pts if t.batch == b)
        if ya is not None and yb is not None:
            ax.annotate(f"e={e:+.2f}", ((a * b) ** 0.5, (ya * yb) ** 0.5), fontsize=7, ha="center",
                        textcoords="offset points", xytext=(0, 6), color="0.3")
    if report.plateau is None:
        ax.text(0.02, 0.04, f"no plateau: |e| >= {report.settings.threshold:g} at the last step", fontsize=8,
                transform=ax.transAxes, color="0.3")
    ax.set_ylabel("ms / sample")


def _plot_memory(ax: Any, report: SweepReport) -> None:
    done = [t for t in report.trials if t.ok and t.peak_bytes is not None]
    for phase, marker, label in (("sweep", "o", "peak (sweep)"), ("oom", "s", "peak (OOM search)")):
        pts = [t for t in done if t.phase == phase]
        if pts:
            ax.plot([t.batch for t in pts], [(t.peak_bytes or 0) / _MIB for t in pts],
                    marker, linestyle="none", color="tab:purple", label=label)
    m = report.memory
    if m is not None and done:
        hi = max([t.batch for t in report.trials] + [report.predicted_max_batch or 0])
        lo = min(t.batch for t in report.trials)
        xs = [lo * (hi / lo) ** (i / 64) for i in range(65)]  # a line, drawn on a log axis
        ax.plot(xs, [m.predict(x) / _MIB for x in xs], "--", color="tab:purple", alpha=0.7,
                label=f"fit: {m.m0_bytes / _MIB:.1f} MiB + B x {m.per_sample_bytes / 1024:.1f} KiB (r2 {m.r2:.3f})")
    if report.memory_cap_bytes is not None:
        ax.axhline(report.memory_cap_bytes / _MIB, color="tab:red", alpha=0.6,
                   label=f"memory cap {report.memory_cap_bytes / _MIB:.0f} MiB")
    failed = [t.batch for t in report.trials if t.oom]
    if failed:
        ax.plot(failed, [0.95] * len(failed), "x", color="tab:red", transform=ax.get_xaxis_transform(),
                label="out of memory")
    ax.set_ylabel("peak memory (MiB)")


def _mark(ax: Any, report: SweepReport) -> None:
    p = report.plateau
    if p is not None:
        ax.axvspan(p.start, p.end, color="tab:green", alpha=0.12,
                   label=f"plateau |e| < {p.threshold:g}: {p.start}..{p.end}")
    o = report.oom
    if o is not None and o.first_oom is not None:
        ax.axvline(o.first_oom, color="tab:red", linestyle=":", label=f"first OOM {o.first_oom}")
    if o is not None and o.max_fit is not None:
        ax.axvline(o.max_fit, color="tab:green", linestyle=":", label=f"largest fit {o.max_fit}")
