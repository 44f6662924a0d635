"""``cubelake refs``: make, stack and check kerchunk reference sets."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from cubelake.errors import CubelakeError

from ._render import QUIET, VERBOSE, configure_output, fail, out_console, print_json, show
from .ingest import OutputFormat

refs_app = typer.Typer(help="Kerchunk references: virtual Zarr over (cloud-optimized) GeoTIFF tiles.",
                       no_args_is_help=True)


def _outside_hint(targets: list[str], out: Path) -> str | None:
    """How to open a set whose targets lie outside its own folder (which alone is trusted by default)."""
    from cubelake.refs.security import root_to_allow, split_url

    outside = [u for u in targets if split_url(u)[0] != "file" or Path(split_url(u)[1]).is_absolute()]
    if not outside:
        return None
    roots = sorted({root_to_allow(u) for u in outside})
    flags = " ".join(f"--allow-root {shlex.quote(r)}" for r in roots)
    return (f"the targets lie outside {out.parent}/, which is all a reference set is trusted with by default: "
            f"check it with `cubelake refs check {shlex.quote(str(out))} {flags}` "
            f"(allowed_roots={roots!r} in Python)")


def _format(fmt: str) -> str:
    if fmt not in ("auto", "json", "parquet"):
        raise typer.BadParameter(f"{fmt!r}: use auto, json or parquet", param_hint="--refs-format")
    return fmt


@refs_app.command("build")
def build_cmd(
    source: str = typer.Argument(..., help="Tiled GeoTIFF: local path or s3://bucket/key."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write: NAME.json, or a folder for Parquet."),
    refs_format: str = typer.Option("auto", "--refs-format", help="json, parquet, or auto (parquet from 100,000 chunks)."),
    chunk: int | None = typer.Option(None, "--chunk", help="Refuse unless the tiles are this size."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Reference every tile of a tiled GeoTIFF where it is (S3 credentials/endpoint from AWS_* variables)."""
    configure_output(verbose, quiet)
    from cubelake.refs import build_refs, write_refs
    from cubelake.refs.formats import relative_targets

    try:
        refs = build_refs(source, chunk=chunk)
        path = write_refs(refs, output, _format(refs_format))  # type: ignore[arg-type]
    except CubelakeError as exc:
        raise fail(exc) from None
    out_console().print(f"{refs.n_chunks} chunks of {show(source)} -> {show(str(path))}")
    hint = _outside_hint([t.url for t in relative_targets(refs, path.parent).targets], path)
    if hint:
        out_console().print(f"note: {show(hint)}")


@refs_app.command("combine")
def combine_cmd(
    refs: list[Path] = typer.Argument(..., help="Reference sets of scenes on one grid (JSON files or Parquet folders)."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the stacked set."),
    dim: str = typer.Option("time", "--dim", help="time (ordered by acquisition time) or scene (as given)."),
    refs_format: str = typer.Option("auto", "--refs-format", help="json, parquet, or auto."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Stack scenes on the same grid into one virtual cube ``data (time, band, y, x)``."""
    configure_output(verbose, quiet)
    from cubelake.refs import write_refs
    from cubelake.refs.combine import combine_refs
    from cubelake.refs.formats import relative_targets

    if dim not in ("time", "scene"):
        raise typer.BadParameter(f"{dim!r}: use time or scene", param_hint="--dim")
    try:
        stacked = combine_refs(refs, dim=dim)  # type: ignore[arg-type]
        path = write_refs(stacked, output, _format(refs_format))  # type: ignore[arg-type]
    except CubelakeError as exc:
        raise fail(exc) from None
    out_console().print(f"{len(refs)} scenes, {stacked.n_chunks} chunks -> {show(str(path))}")
    hint = _outside_hint([t.url for t in relative_targets(stacked, path.parent).targets], path)
    if hint:
        out_console().print(f"note: {show(hint)}")


@refs_app.command("check")
def check_cmd(
    refs: str = typer.Argument(..., help="A reference set (JSON file or Parquet folder; s3:// URLs of JSON sets too)."),
    allow_root: list[str] = typer.Option([], "--allow-root", help="Also trust targets under this folder or s3:// prefix."),
    lake: str | None = typer.Option(None, "--lake", "-l",
                                     help="The lake the set belongs to: also trust its folder and allowed roots."),
    fmt: OutputFormat = typer.Option(OutputFormat.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Check every entry, that every target is allowed, present and unchanged, and that the set opens in zarr.

    Only the set's own folder, the lake given with --lake and the roots given with --allow-root
    are trusted: nothing that comes with the set (such as a lake.json beside it) widens that.
    """
    configure_output(verbose, quiet)
    from cubelake.lake import open_lake
    from cubelake.refs import open_array

    try:
        opened_lake = open_lake(lake, create=False) if lake is not None else None
    except CubelakeError as exc:  # an unusable --lake is a usage error (exit code 2)
        raise fail(exc, 2) from None
    try:
        arr = open_array(refs, lake=opened_lake, allowed_roots=allow_root)
        store = arr.store
        info = {"refs": str(refs), "format": store.refs.format, "shape": list(arr.shape), "chunks": list(arr.chunks),
                "dtype": str(arr.dtype), "targets": [t.to_dict() for t in store.refs.targets],
                "allowed_roots": store.roots.roots, "ok": True}
    except CubelakeError as exc:
        if fmt is OutputFormat.json:
            print_json({"refs": str(refs), "ok": False, "error": str(exc)})
            raise typer.Exit(1) from None
        raise fail(exc) from None
    if fmt is OutputFormat.json:
        print_json(info)
        return
    out_console().print(f"ok: {show(str(refs))} ({info['format']}): data {tuple(arr.shape)} in chunks "
                        f"{tuple(arr.chunks)}, {len(info['targets'])} target(s) unchanged and allowed")


@refs_app.command("allow")
def allow_cmd(
    root: str = typer.Argument(..., help="Folder or s3://bucket/prefix that the lake's references may point into."),
    lake: str = typer.Option("lake", "--lake", "-l", help="Lake folder or s3:// URL.", envvar="CUBELAKE_LAKE"),
) -> None:
    """Trust a root for reference targets in this lake (recorded in lake.json).

    Readers use it when they name the lake: `cubelake refs check SET --lake LAKE`, lake=LAKE in Python.
    """
    from cubelake.lake import open_lake

    try:
        added = open_lake(lake, create=False).allow_root(root)
    except CubelakeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lake") from exc
    out_console().print(f"{'allowed' if added else 'already allowed'}: {show(root)}")
