"""``cubelake jobs``: run manifests on Dask distributed, see what runs did.

Exit codes of ``jobs run``: 0 every input done, 1 some inputs rejected or failed, 2 a bad
manifest or an unreachable scheduler (nothing ran), 3 another run holds the job's lease.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from cubelake.errors import ConfigError, CubelakeError

from ._render import (
    QUIET,
    STATE,
    VERBOSE,
    configure_output,
    err_console,
    fail,
    out_console,
    print_json,
    quiet_dask,
    show,
)
from .ingest import OutputFormat

__all__ = ["jobs_app"]

jobs_app = typer.Typer(help="Scheduled preprocessing jobs: run manifests on Dask distributed, idempotently.",
                       no_args_is_help=True)

BUSY = 3


SCHEDULER = typer.Option(None, "--scheduler", envvar="DASK_SCHEDULER_ADDRESS",
                         help="An existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: a LocalCluster with "
                              "the manifest's resources.workers).")
FORMAT = typer.Option(OutputFormat.text, "--format", help="text or json.")

_MARK = {"ingested": "[green]ingested [/green]", "unchanged": "[cyan]unchanged[/cyan]",
         "rejected": "[red]rejected [/red]", "failed": "[red]failed   [/red]"}


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """The run's event callback: a progress bar on a terminal, one line per finished input always (text)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cubelake.jobs import JobEvent

    out = out_console()
    console = err_console()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True) if enabled and console.is_terminal and not STATE.quiet else None
    task = None

    def on_event(ev: JobEvent) -> None:
        nonlocal task
        d = ev.data
        if not enabled:
            return
        if ev.kind == "planned":
            out.print(f"{d['todo']} scene(s) to ingest, {d['skipped']} done before (skipped), {d['filtered']} "
                      "filtered out")
            for note in d["notes"]:
                out.print(f"  note: {show(note)}")
            if bar is not None:
                task = bar.add_task("scenes", total=d["todo"])
        elif ev.kind == "cluster":
            out.print(f"cluster: scheduler {d['scheduler']}, {d['workers']} worker(s); dashboard {d['dashboard']}")
        elif ev.kind == "input":
            where = f" on {d['worker']}" if d.get("worker") else ""
            secs = f" ({d['seconds']:.1f} s{where})" if d.get("seconds") is not None else ""
            out.print(f"{_MARK.get(d.get('outcome', ''), d.get('outcome'))} {show(d['input'])}[dim]{secs}[/dim]")
            out.print(f"    {show(d.get('message', ''))}")
            if bar is not None and task is not None:
                bar.advance(task)
        elif ev.kind == "step":
            out.print(f"step {d['step']}: {d['state']} ({d['seconds']:.1f} s) {show(_step_summary(d))}")
        out.file.flush()

    if bar is None:
        yield on_event
    else:
        with bar:
            yield on_event


def _step_summary(d: dict[str, Any]) -> str:
    r = d.get("result") or {}
    if "cubes" in r:
        text = f"{len(r['cubes'])} cube(s): " + ", ".join(f"{c['cube']} ({len(c['scenes'])} scenes)" for c in r["cubes"])
        return text + ("; problems: " + " | ".join(r["problems"]) if r.get("problems") else "")
    if "items" in r:
        return f"{r['items']} item(s) -> {r['path']}"
    if "removed" in r:
        return f"{len(r['removed'])} item(s) cleaned"
    return str(r.get("message", ""))


def _run_one(path: Path, scheduler: str | None, force: bool, fmt: OutputFormat) -> tuple[int, dict[str, Any]]:
    """Run one manifest; (exit code, what to report)."""
    from cubelake.jobs import JobBusyError, load_manifest, run_job

    try:
        manifest = load_manifest(path)
    except ConfigError as exc:
        return 2, {"manifest": str(path), "error": str(exc)}
    if fmt is OutputFormat.text:
        out_console().print(f"== job {manifest.name} ({show(path)}) into {show(manifest.lake)}")
    try:
        with _progress(fmt is OutputFormat.text) as on_event:
            record = run_job(manifest, scheduler=scheduler, force=force, emit=on_event)
    except JobBusyError as exc:
        return BUSY, {"manifest": str(path), "job": manifest.name, "error": str(exc)}
    except (CubelakeError, OSError, TimeoutError) as exc:  # the lake, the scheduler, the manifest: nothing ran
        return 2, {"manifest": str(path), "job": manifest.name, "error": str(exc) or type(exc).__name__}
    c = record["counts"]
    if fmt is OutputFormat.text:
        out_console().print(
            f"job {manifest.name} run {record['run_id']}: {record['state']} in {record['seconds']:.1f} s: "
            f"{c['ingested']} ingested, {c['unchanged']} unchanged, {c['rejected']} rejected, {c['failed']} failed, "
            f"{c['skipped']} skipped (done before), {c['filtered']} filtered out")
    return (1 if c["rejected"] or c["failed"] or record["state"] != "succeeded" else 0), record


@jobs_app.command("run")
def run_cmd(
    manifests: list[Path] = typer.Argument(None, help="Manifest files (YAML) to run, in order."),
    due: Path | None = typer.Option(None, "--due", help="Run every manifest in this folder whose cron schedule "
                                                         "fired since its last successful run (for one cron line)."),
    scheduler: str | None = SCHEDULER,
    force: bool = typer.Option(False, "--force", help="Rebuild every input, even those the ledger and the lake say are done."),
    fmt: OutputFormat = FORMAT,
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Run job manifests on Dask (a LocalCluster, or --scheduler); a rerun does only what is not done yet."""
    import distributed  # noqa: F401  (it sets its loggers' levels on import; quiet_dask then overrides them)

    configure_output(verbose, quiet)
    quiet_dask(verbose)
    if due is None and not manifests:
        raise typer.BadParameter("give manifest files, or --due FOLDER", param_hint="MANIFESTS")
    if due is not None and manifests:
        raise typer.BadParameter("give manifest files or --due FOLDER, not both", param_hint="--due")
    todo: list[Path] = list(manifests or [])
    reports: list[dict[str, Any]] = []
    codes: list[int] = []
    if due is not None:
        todo, reports, codes = _due_manifests(due, fmt)
    for path in todo:
        try:
            code, report = _run_one(path, scheduler, force, fmt)
        except KeyboardInterrupt:
            err_console().print(f"interrupted: job {show(path)} stopped; finished scenes are published and recorded, "
                                "nothing partial was published; run it again to finish")
            raise typer.Exit(130) from None
        codes.append(code)
        reports.append(report)
        if "error" in report and fmt is OutputFormat.text:
            err_console().print(f"[red]error[/red]: {show(report['error'])}")
    if fmt is OutputFormat.json:
        print_json({"runs": reports})
    raise typer.Exit(max(codes, default=0))


def _due_manifests(folder: Path, fmt: OutputFormat) -> tuple[list[Path], list[dict[str, Any]], list[int]]:
    """The due manifests of ``folder``; reports and exit codes of those that cannot be read."""
    from cubelake.jobs import Ledger, is_due, load_manifest, manifest_files
    from cubelake.lake import open_lake

    if not folder.is_dir():
        raise typer.BadParameter(f"{folder}: not a folder of manifests", param_hint="--due")
    due: list[Path] = []
    reports: list[dict[str, Any]] = []
    codes: list[int] = []
    for path in manifest_files(folder):
        try:
            manifest = load_manifest(path)
            ready, why = is_due(manifest, Ledger(open_lake(manifest.lake), manifest.name))
        except CubelakeError as exc:
            reports.append({"manifest": str(path), "error": str(exc)})
            codes.append(2)
            if fmt is OutputFormat.text:
                err_console().print(f"[red]error[/red]: {show(exc)}")
            continue
        if fmt is OutputFormat.text:
            out_console().print(f"{'due    ' if ready else 'not due'} {show(path)}: {show(why)}")
        if ready:
            due.append(path)
        else:
            reports.append({"manifest": str(path), "job": manifest.name, "due": False, "why": why})
    return due, reports, codes


def _job_and_lake(target: str | None, lake: str | None, job: str | None) -> tuple[Any, str]:
    from cubelake.jobs import load_manifest
    from cubelake.lake import open_lake

    if target is not None:
        try:
            manifest = load_manifest(target, check_inputs=False)
        except ConfigError as exc:
            raise fail(exc, 2) from None
        lake, job = manifest.lake, manifest.name
    if lake is None or job is None:
        raise typer.BadParameter("give a MANIFEST, or --lake and --job", param_hint="MANIFEST")
    try:
        return open_lake(lake, create=False), job
    except CubelakeError as exc:
        raise fail(exc, 2) from None


@jobs_app.command("status")
def status_cmd(
    target: str | None = typer.Argument(None, help="A manifest file (its lake and job name)."),
    lake: str | None = typer.Option(None, "--lake", "-l", envvar="CUBELAKE_LAKE", help="The lake (with --job)."),
    job: str | None = typer.Option(None, "--job", help="The job's name (with --lake)."),
    run: str | None = typer.Option(None, "--run", help="A run id (default: the latest run)."),
    fmt: OutputFormat = FORMAT,
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """A job's latest run (or --run): state, timings, per-input outcomes, steps, and who holds its lease."""
    from cubelake.jobs import Ledger

    configure_output(verbose, quiet)
    lk, name = _job_and_lake(target, lake, job)
    ledger = Ledger(lk, name)
    runs = ledger.runs()
    chosen = [r for r in runs if r.get("run_id") == run] if run else runs[-1:]
    if not chosen:
        raise fail(CubelakeError(f"job {name} has no run {run} in {lk.url}" if run else
                                 f"job {name} has not run in {lk.url} yet; start it with 'cubelake jobs run'"), 1)
    record, lease = chosen[0], ledger.lease_info()
    if fmt is OutputFormat.json:
        print_json({"job": name, "lake": lk.url, "lease": lease, "run": record,
                    "ledger": sorted(ledger.entries().values(), key=lambda e: str(e.get("input")))})
        return
    _render_status(name, record, lease, len(runs))


def _render_status(name: str, record: dict[str, Any], lease: dict[str, Any] | None, n_runs: int) -> None:
    out = out_console()
    c = record.get("counts", {})
    out.print(f"job {name}: run {record['run_id']} ({n_runs} run(s) recorded) {record['state']}, started "
              f"{record.get('started')}, {record.get('seconds', '?')} s, scheduler {record.get('scheduler', '-')}")
    if c:
        out.print("  " + ", ".join(f"{v} {k}" for k, v in c.items()))
    if lease and not lease.get("released"):
        out.print(f"  lease: run {lease.get('run_id')} on {lease.get('host')} pid {lease.get('pid')} until "
                  f"{lease.get('until')}")
    for e in record.get("inputs", []):
        secs = f"{e['seconds']:.1f} s" if e.get("seconds") is not None else "-"
        out.print(f"  {e.get('outcome', '?'):9} {show(e.get('scene_id') or '-')}  [dim]{secs} {show(e.get('worker') or '')}"
                  f"[/dim]  {show(e.get('input'))}\n      {show(e.get('message', ''))}")
    for s in record.get("skipped", []):
        out.print(f"  skipped   {show(s.get('scene_id') or '-')}  {show(s['input'])}: {show(s['why'])}")
    for s in record.get("filtered", []):
        out.print(f"  filtered  {show(s['input'])}: {show(s['why'])}")
    for step, d in (record.get("steps") or {}).items():
        out.print(f"  step {step}: {d.get('state')} {show(_step_summary(d) or d.get('message', ''))}")


@jobs_app.command("list")
def list_cmd(
    lake: str = typer.Option("lake", "--lake", "-l", envvar="CUBELAKE_LAKE", help="Lake folder or s3:// URL."),
    fmt: OutputFormat = FORMAT,
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Every job of the lake with its latest run: state, when, how long, counts."""
    from cubelake.jobs import Ledger
    from cubelake.lake import open_lake

    configure_output(verbose, quiet)
    try:
        lk = open_lake(lake, create=False)
        names, _ = lk.store.list_dirs("jobs")
        rows = []
        for name in names:
            runs = Ledger(lk, name).runs()
            last = runs[-1] if runs else {}
            rows.append({"job": name, "runs": len(runs), "last_run": last.get("run_id"), "state": last.get("state"),
                         "started": last.get("started"), "seconds": last.get("seconds"),
                         "counts": last.get("counts", {})})
    except CubelakeError as exc:
        raise fail(exc, 2) from None
    if fmt is OutputFormat.json:
        print_json({"lake": lk.url, "jobs": rows})
        return
    out = out_console()
    if not rows:
        out.print(f"no jobs have run in {show(lk.url)}")
    for r in rows:
        c = r["counts"]
        out.print(f"{show(r['job'])}: {r['runs']} run(s); last {r['last_run']} {r['state']}, started {r['started']}, "
                  f"{r['seconds']} s: " + ", ".join(f"{v} {k}" for k, v in c.items()))
