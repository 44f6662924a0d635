"""``cubelake cube``: build, list and show datacubes (scenes of one sensor reprojected onto one grid)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cubelake.errors import CatalogQueryError, CubelakeError

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

cube_app = typer.Typer(help="Datacubes: scenes of one sensor reprojected onto one grid, as native Zarr v3 "
                            "(refs combine stacks scenes already on one grid).", no_args_is_help=True)

LAKE = typer.Option("lake", "--lake", "-l", help="Lake folder or object-store URL (s3://bucket/prefix).",
                    envvar="CUBELAKE_LAKE")


class TextOrJson(StrEnum):
    text = "text"
    json = "json"


def _open(lake: str) -> Any:
    from cubelake.lake import open_lake

    try:
        return open_lake(lake, create=False)
    except CubelakeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lake") from exc


def _fail(exc: CubelakeError) -> typer.Exit:
    """A bad option or search is a usage error (exit 2); anything about the scenes or the lake exits 1."""
    from cubelake.datacube import CubeSettingsError

    return fail(exc, 2 if isinstance(exc, CubeSettingsError | CatalogQueryError) else 1)


def _query(bbox: str | None, intersects: str | None, datetime: str | None, collection: list[str],
           filters: list[str]) -> Any:
    """The catalog query of the search options, or ``None`` when none was given."""
    if bbox is None and intersects is None and datetime is None and not collection and not filters:
        return None
    from cubelake.catalog import Query

    from .catalog import _intersects

    return Query(bbox=bbox, intersects=_intersects(intersects), datetime=datetime, collections=collection,
                 filters=filters)


@contextmanager
def _progress() -> Iterator[Callable[[int, int], None] | None]:
    """A bar of output blocks on stderr when it is a terminal (and not -q)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = err_console()
    if STATE.quiet or not console.is_terminal:
        yield None
        return
    with Progress(TextColumn("warping blocks"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bars:
        task = bars.add_task("blocks", total=None)
        yield lambda done, total: bars.update(task, completed=done, total=total)


def _crs_text(grid: Any) -> str:
    return f"EPSG:{grid.epsg}" if grid.epsg else "a custom CRS"


@cube_app.command("build")
def build_cmd(
    name: str = typer.Argument(..., help="The cube's name (letters, digits, '.', '_', '-')."),
    scene_ids: list[str] | None = typer.Argument(None, help="Scene ids; with search options, both must hold."),
    lake: str = LAKE,
    bbox: str | None = typer.Option(None, "--bbox", help="Scenes meeting west,south,east,north (degrees)."),
    intersects: str | None = typer.Option(None, "--intersects", help="Scenes meeting this GeoJSON (text or file)."),
    datetime: str | None = typer.Option(None, "--datetime", "-t", help="Scenes acquired in START/END ('..' open)."),
    collection: list[str] = typer.Option([], "--collection", "-c", help="Scenes of this collection (sensor profile); repeatable."),
    filters: list[str] = typer.Option([], "--filter", "-f", help="PROPERTY OP VALUE, as in catalog search; repeatable."),
    crs: str | None = typer.Option(None, "--crs", help="Target CRS (EPSG:32633, WKT); default: the scenes' most common."),
    resolution: float | None = typer.Option(None, "--resolution", help="Pixel size in the CRS's units; default: the finest scene's."),
    bounds: tuple[float, float, float, float] | None = typer.Option(
        None, "--bounds", help="MINX MINY MAXX MAXY in the target CRS; default: the scenes' union, snapped to the pixel size."),
    resampling: str = typer.Option("nearest", "--resampling", help="nearest, bilinear, cubic or average."),
    chunk: int = typer.Option(256, "--chunk", help="Spatial chunk side (pixels); one chunk is warped at a time."),
    band_chunk: int | None = typer.Option(None, "--band-chunk", help="Bands per chunk (default: all)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 (decoded, NaN fill) or source (the scenes' stored encoding)."),
    wavelength_tolerance: float = typer.Option(1.0, "--wavelength-tolerance", help="Largest centre-wavelength difference (nm) of one sensor's bands."),
    workers: int = typer.Option(1, "--workers", "-j", help="Blocks warped at once (threads)."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Reproject scenes of one sensor onto one grid as a Zarr v3 cube data (time, band, y, x) in the lake.

    Published atomically under datacubes/NAME/ with a STAC item; run again with the same scenes and
    settings, it does nothing ("up to date"). Exit 1 if the scenes cannot make a cube (each reason named).
    """
    configure_output(verbose, quiet)
    from cubelake.datacube import CubeSettings, build_cube

    lk = _open(lake)
    settings = CubeSettings(crs=crs, resolution=resolution, bounds=bounds, resampling=resampling,  # type: ignore[arg-type]
                            chunk=chunk, band_chunk=band_chunk, dtype=dtype,  # type: ignore[arg-type]
                            wavelength_tolerance_nm=wavelength_tolerance, workers=workers)
    try:
        with _progress() as progress:
            res = build_cube(lk, name, scene_ids or (), query=_query(bbox, intersects, datetime, collection, filters),
                             settings=settings, progress=progress)
    except CubelakeError as exc:
        raise _fail(exc) from None
    if fmt is TextOrJson.json:
        print_json(res.to_dict())
        return
    t, b, y, x = res.shape
    what = "is up to date" if res.status == "up to date" else "built"
    out_console().print(f"cube {show(name)} {what}: {t} time step(s) x {b} bands x {y} x {x} pixels "
                        f"({_crs_text(res.grid)}, {res.grid.res[0]:g} per pixel) from {len(res.scenes)} scene(s)")
    out_console().print(f"  zarr: {show(res.zarr_url)}")
    out_console().print(f"  item: {show(res.item_url)}")


def _table(items: list[dict[str, Any]]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col, justify in (("name", "left"), ("time steps", "right"), ("from", "left"), ("to", "left"),
                         ("bands", "right"), ("y x", "right"), ("crs", "left"), ("scenes", "right")):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for it in items:
        p = it.get("properties") or {}
        dims = p.get("cube:dimensions") or {}
        times = (dims.get("time") or {}).get("values") or []
        bands = (dims.get("band") or {}).get("values") or []
        shape = p.get("proj:shape") or ["?", "?"]
        table.add_row(Text(str(it.get("id"))), str(len(times)), times[0] if times else "-",
                      times[-1] if times else "-", str(len(bands)), f"{shape[0]} x {shape[1]}",
                      Text(str(p.get("proj:code") or "custom")), str(len(p.get("cubelake:scenes") or [])))
    return table


@cube_app.command("list")
def list_cmd(
    lake: str = LAKE,
    bbox: str | None = typer.Option(None, "--bbox", help="Cubes meeting west,south,east,north (degrees)."),
    intersects: str | None = typer.Option(None, "--intersects", help="Cubes meeting this GeoJSON (text or file)."),
    datetime: str | None = typer.Option(None, "--datetime", "-t", help="Cubes with a time step in START/END."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text (a table) or json (a STAC ItemCollection, absolute hrefs)."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """The lake's datacubes (their STAC items), optionally those meeting a place and a time."""
    configure_output(verbose, quiet)
    from cubelake.datacube import search_cube_items

    lk = _open(lake)
    try:
        items = search_cube_items(lk, _query(bbox, intersects, datetime, [], []), absolute=fmt is TextOrJson.json)
    except CubelakeError as exc:
        raise _fail(exc) from None
    if fmt is TextOrJson.json:
        print_json({"type": "FeatureCollection", "features": items, "numberReturned": len(items), "links": []})
        return
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True, width=100_000)
    if items:
        console.print(_table(items))
    console.print(f"{len(items)} cube(s)")


@cube_app.command("show")
def show_cmd(
    name: str = typer.Argument(..., help="The cube's name."),
    lake: str = LAKE,
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Print a cube's STAC item (hrefs relative to datacubes/NAME/)."""
    configure_output(verbose, quiet)
    from cubelake.datacube import DatacubeError, read_cube_item
    from cubelake.datacube.publish import check_name

    lk = _open(lake)
    try:
        item, _ = read_cube_item(lk, check_name(name))
        if item is None:
            raise DatacubeError(f"no datacube {name!r} in {lk.url}; list them with 'cubelake cube list --lake {lake}'")
    except CubelakeError as exc:
        raise _fail(exc) from None
    print_json(item)
