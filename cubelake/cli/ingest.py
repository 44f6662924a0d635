"""``cubelake ingest`` and ``cubelake validate``."""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

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
    progress_bars,
    show,
)

if TYPE_CHECKING:  # the library is imported by the command bodies: ``--help`` stays quick
    from cubelake.ingest import (
        AuxSpec,
        IngestOptions,
        IngestResult,
        Limits,
        Outcome,
        ValidationReport,
    )

__all__ = ["INTERRUPTED", "STATE", "err_console", "ingest_cmd", "validate_cmd"]

INTERRUPTED = "interrupted: nothing partial was published (unfinished builds are removed on the next run)"


VARIABLE = typer.Option(None, "--variable", help="MATLAB/NetCDF/HDF5: the cube variable (group/name inside a group).")
AXES = typer.Option(None, "--axes", help="MATLAB/NetCDF/HDF5: axis order of the cube (yxb, byx, ybx, ..., bp, pb).")
WAVELENGTH_VARIABLE = typer.Option(None, "--wavelength-variable",
                                   help="NetCDF/HDF5: the variable holding the band centres.")


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


def _parse_size(text: str) -> int:
    from cubelake.jobs.spec import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _limits(max_bytes: str | None, max_dimension: int | None, max_bands: int | None) -> Limits:
    from cubelake.ingest import Limits

    base = Limits()
    for value, name in ((max_dimension, "--max-dimension"), (max_bands, "--max-bands")):
        if value is not None and value < 1:
            raise typer.BadParameter(f"must be a positive number, got {value}", param_hint=name)
    return Limits(max_bytes=_parse_size(max_bytes) if max_bytes else base.max_bytes,
                  max_dimension=max_dimension or base.max_dimension, max_bands=max_bands or base.max_bands)


def _options(profile: str, products: str, chunk: int | None, shard: int | None, workers: int | None,
             limits: Limits, variable: str | None, axes: str | None, force: bool,
             refs_format: str = "auto", wavelength_variable: str | None = None) -> IngestOptions:
    from cubelake.ingest import PRODUCTS, IngestOptions, SourceOptions, load_profile

    try:
        prof = None if profile == "auto" else load_profile(profile)
    except CubelakeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from exc
    prods = tuple(p.strip() for p in products.split(",") if p.strip())
    bad = [p for p in prods if p not in PRODUCTS]
    if bad or not prods:
        raise typer.BadParameter(f"unknown product(s) {bad or [products]}; choose from {','.join(PRODUCTS)}",
                                 param_hint="--products")
    if chunk is not None and (chunk <= 0 or chunk % 16):
        raise typer.BadParameter(f"chunk must be a positive multiple of 16 pixels (TIFF tile rule), got {chunk}",
                                 param_hint="--chunk")
    if axes is not None and axes not in ("yxb", "xyb", "byx", "bxy", "ybx", "bp", "pb"):
        raise typer.BadParameter(f"axes {axes!r}: use yxb, xyb, byx, bxy, ybx (3-D) or bp, pb (2-D bands x pixels)",
                                 param_hint="--axes")
    source = SourceOptions(variable=variable, axes=axes, max_bytes=limits.max_bytes,
                           wavelength_variable=wavelength_variable)
    if refs_format not in ("auto", "json", "parquet"):
        raise typer.BadParameter(f"{refs_format!r}: use auto, json or parquet", param_hint="--refs-format")
    opts = IngestOptions(products=prods, profile=prof, chunk=chunk, shard=shard, limits=limits, force=force,
                         source=source, refs_format=refs_format)
    return dataclasses.replace(opts, workers=workers) if workers else opts


def _aux_specs(values: list[str], max_time_delta: str | None) -> tuple[AuxSpec, ...]:
    """The ``--aux NAME=PATH[:RESAMPLING][:KIND]`` options as specs: syntax, names and paths checked."""
    from cubelake.ingest.align import AuxError, aux_candidates, parse_aux_arg, parse_time_delta

    try:
        delta = parse_time_delta(max_time_delta) if max_time_delta is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--aux-max-time-delta") from None
    if delta is not None and not values:
        raise typer.BadParameter("given without any --aux layer", param_hint="--aux-max-time-delta")
    specs: list[AuxSpec] = []
    for text in values:
        try:
            spec = parse_aux_arg(text, delta)
            aux_candidates(spec.path)  # a missing path or an empty folder/pattern is a usage error
        except (ValueError, AuxError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--aux") from None
        if not spec.several and not Path(spec.path).exists():
            raise typer.BadParameter(f"{text!r}: {spec.path} does not exist", param_hint="--aux")
        if spec.name in {s.name for s in specs}:
            raise typer.BadParameter(f"{text!r}: the name {spec.name!r} is given twice; names must be unique",
                                     param_hint="--aux")
        specs.append(spec)
    return tuple(specs)


def _print_issues(console: Console, report: ValidationReport) -> None:
    for i in report.errors:
        console.print(f"    [red]error[/red]: {i.code.value}: {show(i.message)}")
    for i in report.warnings:
        console.print(f"    [yellow]warning[/yellow]: {i.code.value}: {show(i.message)}")


def _mark(outcome: Outcome) -> str:
    from cubelake.ingest import Outcome

    return {Outcome.INGESTED: "[green]ingested [/green]", Outcome.UNCHANGED: "[cyan]unchanged[/cyan]",
            Outcome.REJECTED: "[red]rejected [/red]", Outcome.FAILED: "[red]failed   [/red]"}[outcome]


def _render_result(out: Console, r: IngestResult) -> None:
    """One scene's outcome, printed as soon as it is known (also in CI logs, without a terminal)."""
    from cubelake.ingest import Outcome

    out.print(f"{_mark(r.outcome)} {show(r.path)}  [dim]({r.seconds:.1f} s)[/dim]")
    out.print(f"    {show(r.message)}")
    if r.outcome is not Outcome.UNCHANGED:
        _print_issues(out, r.report)
    for a in r.aux:  # those not aligned are among the warnings above
        if a.aligned:
            out.print(f"    [green]aux[/green]: {show(a.message)}")
            for c in a.rejected[:10]:
                out.print(f"      [dim]passed over {show(c.path)}: {show(c.reason)}[/dim]")
            if len(a.rejected) > 10:
                out.print(f"      [dim]and {len(a.rejected) - 10} more candidate(s) (all in scene.json)[/dim]")
    out.file.flush()


def _render_report(out: Console, r: ValidationReport) -> None:
    head = "[green]ok      [/green]" if r.ok else "[red]rejected[/red]"
    shape = "x".join(map(str, r.shape)) if r.shape else "?"
    out.print(f"{head} {show(r.path)}  [dim]{r.format or '?'} (band,y,x)={shape} {r.dtype or ''}[/dim]")
    _print_issues(out, r)
    out.file.flush()


def _render_summary(out: Console, results: list[IngestResult]) -> None:
    from cubelake.ingest import Outcome

    counts = {o: sum(r.outcome is o for r in results) for o in Outcome}
    out.print(
        f"\n{len(results)} scene(s): {counts[Outcome.INGESTED]} ingested, {counts[Outcome.UNCHANGED]} unchanged, "
        f"{counts[Outcome.REJECTED]} rejected" + (f", {counts[Outcome.FAILED]} failed" if counts[Outcome.FAILED] else "")
    )
    layers = [a for r in results for a in r.aux]
    if layers:
        done = sum(a.aligned for a in layers)
        out.print(f"aux layers: {done} aligned, {len(layers) - done} not aligned (the scenes were published without "
                  "those; see the warnings)" if done < len(layers) else f"aux layers: {done} aligned")


def ingest_cmd(
    paths: list[str] = typer.Argument(..., help="Scene files or folders (walked recursively), or s3:// objects and prefixes (GeoTIFF, ENVI, Landsat MTL, MATLAB, EMIT/PRISMA/NetCDF/HDF5, EnMAP/DESIS)."),
    lake: str = typer.Option("lake", "--lake", "-l", envvar="CUBELAKE_LAKE",
                             help="Lake folder or object-store URL, e.g. s3://bucket/prefix (created if new)."),
    profile: str = typer.Option("auto", "--profile", "-p", help="Bundled profile name, YAML/CSV file, or 'auto'."),
    products: str = typer.Option("cog,zarr", "--products",
                                 help="Comma-separated: cog, zarr, refs (kerchunk references to the source's tiles "
                                      "in place, or to a COG written for them when the source cannot be referenced)."),
    refs_format: str = typer.Option("auto", "--refs-format",
                                    help="refs storage: json, parquet, or auto (parquet from 100,000 chunks)."),
    chunk: int | None = typer.Option(None, "--chunk", help="Spatial chunk = COG tile size, pixels (multiple of 16)."),
    shard: int | None = typer.Option(None, "--shard", help="Zarr shard side in chunks (sharding codec); default none."),
    labels: Path | None = typer.Option(None, "--labels", help="Label raster/MAT file for the scene (on its grid)."),
    aux: list[str] = typer.Option([], "--aux", show_default=False,
                                  help="NAME=PATH[:RESAMPLING][:KIND], repeatable: a raster on another grid (DSM, "
                                       "other sensor, class map) warped onto each scene's grid, stored as aux_NAME. "
                                       "PATH: a file, or a folder/glob of dated rasters (the nearest in time is "
                                       "taken). RESAMPLING: bilinear (default), cubic, nearest; KIND: continuous "
                                       "(default) or categorical (nearest)."),
    aux_max_time_delta: str | None = typer.Option(
        None, "--aux-max-time-delta",
        help="Largest time between a scene and its aux raster, e.g. 3d, 12h (default: no limit)."),
    variable: str | None = VARIABLE,
    axes: str | None = AXES,
    wavelength_variable: str | None = WAVELENGTH_VARIABLE,
    workers: int | None = typer.Option(None, "--workers", help="Threads for reading/compressing (default: CPUs)."),
    max_bytes: str | None = typer.Option(None, "--max-bytes", help="Largest decoded scene accepted (default 64GiB)."),
    max_dimension: int | None = typer.Option(None, "--max-dimension", help="Most rows or columns accepted (default 1,000,000)."),
    max_bands: int | None = typer.Option(None, "--max-bands", help="Most bands accepted (default 10,000)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when the scene and config are unchanged."),
    fmt: OutputFormat = typer.Option(OutputFormat.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Validate, calibrate and convert scenes into the lake (COG, Zarr v3 and/or kerchunk references)."""
    from cubelake.ingest import Outcome, iter_ingest
    from cubelake.lake import open_lake

    configure_output(verbose, quiet)
    opts = _options(profile, products, chunk, shard, workers, _limits(max_bytes, max_dimension, max_bands), variable,
                    axes, force, refs_format, wavelength_variable)
    opts = dataclasses.replace(opts, aux=_aux_specs(aux, aux_max_time_delta))
    try:
        lk = open_lake(lake)
        lk.check_writable()
    except CubelakeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lake") from exc
    results: list[IngestResult] = []
    out = out_console()
    try:
        with progress_bars(fmt is OutputFormat.text) as on_event:
            for r in iter_ingest(paths, lk, opts, progress=on_event, labels=labels):
                results.append(r)
                if fmt is OutputFormat.text:
                    _render_result(out, r)
    except KeyboardInterrupt:
        err_console().print(INTERRUPTED)
        raise typer.Exit(130) from None
    except CubelakeError as exc:  # the lake itself failed (its catalog, its disk): no scene can be ingested
        raise fail(exc, 2) from None
    if fmt is OutputFormat.json:
        print_json({"lake": str(lk.root), "results": [r.to_dict() for r in results]})
    else:
        _render_summary(out, results)
    raise typer.Exit(1 if any(r.outcome in (Outcome.REJECTED, Outcome.FAILED) for r in results) else 0)


def validate_cmd(
    paths: list[str] = typer.Argument(..., help="Scene files or folders (walked recursively), or s3:// objects and prefixes (GeoTIFF, ENVI, Landsat MTL, MATLAB, EMIT/PRISMA/NetCDF/HDF5, EnMAP/DESIS)."),
    profile: str = typer.Option("auto", "--profile", "-p", help="Bundled profile name, YAML/CSV file, or 'auto'."),
    chunk: int | None = typer.Option(None, "--chunk", help="Read window size, pixels."),
    variable: str | None = VARIABLE,
    axes: str | None = AXES,
    wavelength_variable: str | None = WAVELENGTH_VARIABLE,
    max_bytes: str | None = typer.Option(None, "--max-bytes", help="Largest decoded scene accepted (default 64GiB)."),
    max_dimension: int | None = typer.Option(None, "--max-dimension", help="Most rows or columns accepted (default 1,000,000)."),
    max_bands: int | None = typer.Option(None, "--max-bands", help="Most bands accepted (default 10,000)."),
    report_dir: Path | None = typer.Option(None, "--report-dir", help="Also write one JSON report per scene here."),
    fmt: OutputFormat = typer.Option(OutputFormat.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Run every check (every block is decoded) without writing any product."""
    from cubelake.ingest import iter_validate
    from cubelake.lake import safe_scene_id

    configure_output(verbose, quiet)
    opts = _options(profile, "cog", chunk, None, None, _limits(max_bytes, max_dimension, max_bands), variable, axes,
                    False, wavelength_variable=wavelength_variable)
    reports: list[ValidationReport] = []
    out = out_console()
    try:
        with progress_bars(fmt is OutputFormat.text) as on_event:
            for r in iter_validate(paths, opts, progress=on_event):
                reports.append(r)
                if fmt is OutputFormat.text:
                    _render_report(out, r)
    except KeyboardInterrupt:
        err_console().print("interrupted")
        raise typer.Exit(130) from None
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        used: set[str] = set()
        for r in reports:  # safe names, and a second x.tif from another folder does not overwrite the first
            name = safe_scene_id(Path(r.path).name)
            stem, n = name, 1
            while name in used:
                n += 1
                name = f"{stem}-{n}"
            used.add(name)
            (report_dir / f"{name}.validation.json").write_text(r.to_json() + "\n")
    if fmt is OutputFormat.json:
        print_json({"reports": [r.to_dict() for r in reports]})
    else:
        bad = sum(not r.ok for r in reports)
        out.print(f"\n{len(reports)} scene(s): {len(reports) - bad} ok, {bad} rejected")
    raise typer.Exit(1 if any(not r.ok for r in reports) else 0)
