"""``cubelake lake``: what a lake holds; ``lake gc`` and ``lake copy`` for lakes on disk and on object stores."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import typer

from cubelake.errors import CubelakeError
from cubelake.storage import StorageError

from ._render import (
    QUIET,
    VERBOSE,
    configure_output,
    err_console,
    fail,
    out_console,
    print_json,
    show,
)
from .ingest import OutputFormat

if TYPE_CHECKING:  # the library is imported by the command bodies: ``--help`` stays quick
    from cubelake.lake import AnyLake
    from cubelake.record import SceneRecord

lake_app = typer.Typer(help="What a lake holds; gc and copy.", invoke_without_command=True, no_args_is_help=False)

LAKE_OPT = typer.Option("lake", "--lake", "-l", help="Lake folder or object-store URL (s3://bucket/prefix).",
                        envvar="CUBELAKE_LAKE")


def _open(lake: str) -> AnyLake:
    from cubelake.lake import open_lake

    try:
        return open_lake(lake, create=False)
    except CubelakeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lake") from exc


def _scene_rows(lk: AnyLake) -> list[dict[str, Any]]:
    rows = []
    for sid in lk.scene_ids():
        rec = lk.scene_record(sid)
        if rec is None and not lk.is_local:
            continue  # an object-store folder with no commit (an upload gc will remove)
        rows.append(_scene_row(sid, rec))
    return rows


def _scene_row(sid: str, rec: SceneRecord | None) -> dict[str, Any]:
    """What ``cubelake lake`` shows of a scene (an unreadable record shows as empty)."""
    if rec is None:
        return {"id": sid, "bands": 0, "shape": [None, None], "dtype": None, "profile": None, "products": {},
                "warnings": 0}
    return {
        "id": sid,
        "bands": rec.band_count,
        "shape": [rec.grid.height, rec.grid.width],
        "dtype": rec.encoding.dtype,
        "profile": rec.profile.name,
        "products": {k: v.path for k, v in rec.products.items()},
        "warnings": len(rec.validation.warnings),
    }


@lake_app.callback()
def lake_cmd(
    ctx: typer.Context,
    lake: str = LAKE_OPT,
    fmt: OutputFormat = typer.Option(OutputFormat.text, "--format", help="text or json."),
) -> None:
    """List the scenes of a lake, their products, and the rejected inputs."""
    if ctx.invoked_subcommand is not None:
        return
    lk = _open(lake)
    try:
        scenes = _scene_rows(lk)
        rejected = []
        for rid in lk.rejected_ids():
            rec = lk.rejected_record(rid)
            if rec is None:
                continue
            rejected.append({"id": rid, "source": (rec.get("source") or {}).get("path"),
                             "errors": [e.get("code") for e in (rec.get("report") or {}).get("errors", [])]})
    except CubelakeError as exc:  # the store failing is like a bad --lake (2); a record a newer cubelake wrote: 1
        raise fail(exc, 2 if isinstance(exc, StorageError) else 1) from None
    if fmt is OutputFormat.json:
        print_json({"lake": lk.url, "scenes": scenes, "rejected": rejected})
        return
    out = out_console()
    out.print(f"lake {show(lk.url)}: {len(scenes)} scene(s), {len(rejected)} rejected input(s)")
    for s in scenes:
        prods = ", ".join(f"{k}={v}" for k, v in s["products"].items())
        shape = s["shape"]
        out.print(f"  {show(str(s['id']))}: {s['bands']} bands {shape[0]}x{shape[1]} {s['dtype']} "
                  f"{show('[' + str(s['profile']) + ']')} {show(prods)}"
                  + (f" ({s['warnings']} warning(s))" if s["warnings"] else ""))
    for r in rejected:
        out.print(f"  [red]rejected[/red] {show(str(r['source']))}: {', '.join(str(e) for e in r['errors'] or [])}")


def _grace(text: str) -> dt.timedelta:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        n, unit = (float(text[:-1]), text[-1]) if text and text[-1] in units else (float(text), "s")
    except ValueError:
        raise typer.BadParameter(f"{text!r}: give a duration such as 30m, 6h or 2d", param_hint="--grace") from None
    if n < 0:
        raise typer.BadParameter(f"{text!r}: a duration cannot be negative", param_hint="--grace")
    return dt.timedelta(seconds=n * units[unit])


@lake_app.command("gc")
def gc_cmd(
    lake: str = LAKE_OPT,
    grace: str = typer.Option("6h", "--grace",
                              help="Only remove what is older than this (30m, 6h, 2d). It must exceed the longest "
                                   "ingest: a version being uploaded is not referenced yet."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be removed; remove nothing."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Remove what crashed or replaced ingests left: unreferenced versions and index snapshots, dead builds."""
    configure_output(verbose, quiet)
    keep = _grace(grace)
    lk = _open(lake)
    from cubelake.catalog.lake import collect_garbage

    try:
        lines = collect_garbage(lk, keep, dry_run=dry_run)
    except CubelakeError as exc:
        raise fail(exc, 2) from None
    out = out_console()
    for line in lines:
        out.print(f"  {show(line)}")
    out.print(f"lake {show(lk.url)}: {len(lines)} item(s) {'to clean' if dry_run else 'cleaned'}")


@lake_app.command("copy")
def copy_cmd(
    src: str = typer.Argument(..., help="Source lake (folder or s3:// URL)."),
    dst: str = typer.Argument(..., help="Destination lake (folder or s3:// URL; created if new)."),
    scenes: list[str] = typer.Option([], "--scene", help="Copy only this scene (repeatable)."),
    bbox: str | None = typer.Option(None, "--bbox", help="Copy only scenes the catalog finds in this bbox."),
    datetime: str | None = typer.Option(None, "--datetime", help="... and in this time range."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Copy a lake, or the scenes a catalog query finds, between folders and object stores (verified, resumable)."""
    configure_output(verbose, quiet)
    from cubelake.copy import copy_lake

    source = _open(src)
    try:
        wanted = list(scenes) or None
        if bbox or datetime:
            from cubelake.catalog import LakeCatalog
            from cubelake.catalog.query import Query

            with LakeCatalog(source) as cat:
                found = [h.id for h in cat.search(Query(bbox=bbox, datetime=datetime), scenes_only=True)]
            wanted = [s for s in found if wanted is None or s in wanted]
        report = copy_lake(source, dst, wanted)
    except CubelakeError as exc:
        raise fail(exc, 2) from None
    out = out_console()
    for line in report.lines():
        out.print(f"  {show(line)}")
    if report.failed:
        for sid, why in report.failed.items():
            err_console().print(f"[red]failed[/red] {show(sid)}: {show(why)}")
        raise typer.Exit(1)
