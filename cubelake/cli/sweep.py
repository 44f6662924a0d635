"""``cubelake sweep``: time a model over batch sizes, find the plateau and the OOM wall, fit the memory model."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from cubelake.errors import CubelakeError

from ._render import (
    QUIET,
    STATE,
    VERBOSE,
    configure_output,
    err_console,
    fail,
    out_console,
    print_json,
    show,
)
from .cube import TextOrJson

__all__ = ["sweep_cmd"]


class DType(StrEnum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, k in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= k:
            return f"{n / k:.2f} {unit}" if unit == "GiB" else f"{n / k:.1f} {unit}"
    return f"{n:.0f} B"


def _usage(exc: Exception) -> typer.Exit:
    return fail(exc, 2)


def _settings(batches: str | None, device: str, dtype: DType, warmup: int, iters: int, patch: int | None,
              bands: int | None, size: int, fresh: bool, memory_cap: str | None, find_oom: bool, threshold: float,
              max_trials: int, timeout: float) -> Any:
    from cubelake.infer import SweepSettings, parse_batches
    from cubelake.infer.sweep import DEFAULT_BATCHES

    cap = None
    if memory_cap is not None:
        from cubelake.jobs.spec import parse_size

        try:
            cap = parse_size(memory_cap)
        except ValueError as exc:
            raise _usage(ValueError(f"--memory-cap: {exc}")) from None
    try:
        return SweepSettings(batches=parse_batches(batches) if batches else DEFAULT_BATCHES, device=device,
                             dtype=dtype.value, warmup=warmup, iters=iters, patch=patch, bands=bands, size=size,
                             fresh_process=fresh, memory_cap=cap, find_oom=find_oom, threshold=threshold,
                             max_trials=max_trials, timeout_s=timeout)
    except CubelakeError as exc:
        raise _usage(exc) from None


def _model(path: Path, spec: Path | None) -> Any:
    from cubelake.infer import ModelSpec, load_model

    given = None
    try:
        if spec is not None:
            given = ModelSpec.from_json(spec.read_bytes(), str(spec))
        return load_model(path, given)
    except OSError as exc:
        raise _usage(OSError(f"--spec {spec}: {exc.strerror or exc}")) from None
    except CubelakeError as exc:
        raise _usage(exc) from None


def _table(report: Any) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("batch", "ms/batch", "ms/sample", "samples/s", "elasticity", "peak memory"):
        table.add_column(col, justify="right", no_wrap=True)
    es = {b: e for _, b, e in report.elasticities}
    for t in (t for t in report.trials if t.phase == "sweep"):
        if not t.ok:
            table.add_row(str(t.batch), "out of memory", "-", "-", "-", "-")
            continue
        e = es.get(t.batch)
        table.add_row(str(t.batch), f"{t.ms_per_batch:.3f}", f"{t.ms_per_sample:.5f}", f"{t.samples_per_s:,.0f}",
                      "-" if e is None else f"{e:+.3f}", _size(t.peak_bytes))
    return table


def _plateau_line(report: Any) -> str:
    p, thr = report.plateau, report.settings.threshold
    if p is not None:
        return (f"plateau: batch {p.start} to {p.end} (every step from {p.start} on has |elasticity| < {thr:g}; "
                f"lowest ms/sample at batch {p.best})")
    if not report.elasticities:
        return "plateau: not measured (fewer than two batch sizes ran)"
    a, b, e = report.elasticities[-1]
    return f"plateau: not reached (|elasticity| {abs(e):.3f} >= {thr:g} at the last step, {a} -> {b})"


def _oom_lines(report: Any) -> list[str]:
    o = report.oom
    if o is None:
        return ["OOM search: not run (--find-oom; on CPU with --memory-cap)"]
    steps = " ".join(f"{b}:{'ok' if ok else 'OOM'}" for b, ok in o.trials)
    if o.max_fit is not None and o.first_oom is not None:
        state = "converged" if o.converged else f"not converged within {o.max_trials} trials"
        head = (f"OOM search (x{o.grow:g} then bisection): largest batch that fits {o.max_fit}, first that fails "
                f"{o.first_oom} (gap {o.gap:.1%}, {len(o.trials)} trials, {state})")
    elif o.max_fit is None:
        head = f"OOM search: no batch fits (down to {min(b for b, _ in o.trials)}, {len(o.trials)} trials)"
    else:
        head = f"OOM search: every batch fitted up to {o.max_fit} ({len(o.trials)} trials; no wall found)"
    return [head, f"  trials: {steps}"]


def _memory_line(report: Any) -> str:
    m = report.memory
    if m is None:
        return "memory model: not fitted (peaks of fewer than two batch sizes)"
    line = (f"memory model: M = {_size(m.m0_bytes)} + B x {_size(m.per_sample_bytes)} "
            f"(r2 {m.r2:.4f}, {len(m.points)} points)")
    cap = report.memory_cap_bytes
    if cap is None:
        return line + "; give --memory-cap to predict the largest batch"
    pred, meas = report.predicted_max_batch, report.measured_max_batch
    line += f"; under {_size(cap)} it predicts a largest batch of {pred if pred is not None else '-'}"
    if meas is None:
        return line + " (--find-oom measures it)"
    err = report.prediction_error
    return line + f", measured {meas}" + (f" ({err:+.1%})" if err is not None else "")


def _on_trial() -> Any:
    console = err_console()
    if STATE.quiet or not console.is_terminal:
        return None

    def note(t: Any) -> None:
        what = "out of memory" if t.oom else f"{t.ms_per_batch:.3f} ms ({t.ms_per_sample:.5f} ms/sample)"
        console.print(f"[dim]{t.phase} batch {t.batch}: {what}[/dim]")

    return note


def sweep_cmd(
    model: Path = typer.Option(..., "--model", "-m", help="TorchScript or torch.export model (its spec inside, or --spec)."),
    spec: Path | None = typer.Option(None, "--spec", help="The model's spec as JSON (when the file has none)."),
    patch: int | None = typer.Option(None, "--patch", help="Patch side of the input (default: the model's)."),
    bands: int | None = typer.Option(None, "--bands", help="Bands of the input (default: the model's)."),
    size: int = typer.Option(64, "--size", help="Tile side of a dense model's input (pixels)."),
    batches: str | None = typer.Option(None, "--batches", "-b", help="Batch sizes: 64,128,256 or a run 64,128,...,1024 (default 64,128,256,384,512,768,1024)."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    dtype: DType = typer.Option(DType.fp32, "--dtype", help="fp32, fp16 or bf16."),
    warmup: int = typer.Option(20, "--warmup", help="Untimed passes per batch size."),
    iters: int = typer.Option(100, "--iters", help="Timed passes per batch size (the median is reported)."),
    fresh: bool = typer.Option(False, "--fresh-process", help="Each batch size in a fresh process."),
    memory_cap: str | None = typer.Option(None, "--memory-cap", help="Memory a trial may use, e.g. 2GiB (CPU: enforced with RLIMIT_DATA in a fresh process; CUDA: a fraction of the device)."),
    find_oom: bool = typer.Option(False, "--find-oom", help="Search the OOM wall from the largest batch (x1.5, then bisection to 5%)."),
    threshold: float = typer.Option(0.05, "--threshold", help="Plateau: |elasticity| below this on every later step."),
    max_trials: int = typer.Option(15, "--max-trials", help="Trials of the OOM search at most."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds a fresh-process trial may run."),
    out: Path = typer.Option(Path("sweep"), "--out", "-o", help="Folder for sweep.json and sweep.png."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Draw sweep.png (needs matplotlib)."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text (a table) or json (the report)."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Time a model over batch sizes: ms/sample, elasticity, the plateau, the OOM wall and the memory model.

    Writes OUT/sweep.json (every trial) and OUT/sweep.png. Exit 2 for a bad option or model file,
    1 when the model fails to run for another reason than memory.
    """
    configure_output(verbose, quiet)
    settings = _settings(batches, device, dtype, warmup, iters, patch, bands, size, fresh, memory_cap, find_oom,
                         threshold, max_trials, timeout)
    if not model.is_file():
        raise _usage(FileNotFoundError(f"--model {model}: no such file; give a TorchScript or torch.export model "
                                       "(saved with cubelake.infer.save_model)"))
    from cubelake.infer import SweepSettingsError, run_sweep, write_report

    loaded = _model(model, spec)
    try:
        report = run_sweep(loaded, settings, on_trial=_on_trial())
        json_path, png_path = write_report(report, out, plot=plot)
    except SweepSettingsError as exc:
        raise _usage(exc) from None
    except CubelakeError as exc:
        raise fail(exc, 1) from None
    if fmt is TextOrJson.json:
        print_json(report.to_dict())
        return
    env = report.environment
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True, width=100_000)
    console.print(f"{show(report.model['name'])} ({show(model)}): input {report.model['input_shape']} per sample, "
                  f"{settings.dtype} on {show(env.get('device_name'))}, torch {show(env.get('torch'))}; "
                  f"{settings.warmup} warm-up + {settings.iters} timed passes per batch size (median)")
    console.print(_table(report))
    o = out_console()
    for line in [_plateau_line(report), *_oom_lines(report), _memory_line(report)]:
        o.print(show(line))
    o.print(f"report: {show(json_path)}" + (f", {show(png_path)}" if png_path else ""))
