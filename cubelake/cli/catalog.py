"""``cubelake catalog``: search, show, stats, validate, reindex and export the lake's STAC catalog."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cubelake.errors import CatalogQueryError, CubelakeError

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

if TYPE_CHECKING:  # the library is imported by the command bodies: ``--help`` stays quick
    from shapely.geometry.base import BaseGeometry

    from cubelake.catalog.index import SearchHit
    from cubelake.catalog.lake import LakeCatalog

catalog_app = typer.Typer(help="The lake's STAC catalog: search by space, time, wavelength and properties.",
                          no_args_is_help=True)

LAKE = typer.Option("lake", "--lake", "-l", help="Lake folder or object-store URL (s3://bucket/prefix).",
                    envvar="CUBELAKE_LAKE")


class SearchFormat(StrEnum):
    table = "table"
    json = "json"
    geojson = "geojson"
    summary = "summary"


class TextOrJson(StrEnum):
    text = "text"
    json = "json"


#: --intersects files larger than this are refused (a field outline is kilobytes)
MAX_GEOJSON_BYTES = 64 * 1024 * 1024


def _fail(exc: CubelakeError) -> typer.Exit:
    """A malformed query is a usage error (exit 2); anything else exit 1."""
    return fail(exc, 2 if isinstance(exc, CatalogQueryError) else 1)


def _open(lake: str) -> LakeCatalog:
    from cubelake.catalog.lake import LakeCatalog

    try:
        return LakeCatalog(lake)
    except CubelakeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lake") from exc


def _intersects(value: str | None) -> BaseGeometry | None:
    """The --intersects geometry: GeoJSON text, or a file holding a geometry, Feature or FeatureCollection."""
    if value is None:
        return None
    from cubelake.catalog.query import parse_intersects

    if value.lstrip().startswith("{"):
        return parse_intersects(value, "--intersects")
    path = Path(value)
    if not path.is_file():
        raise CatalogQueryError(f"--intersects {value}: neither GeoJSON text nor a GeoJSON file "
                                f"({'not a regular file' if path.exists() else 'no such file'})")
    try:
        if path.stat().st_size > MAX_GEOJSON_BYTES:
            raise CatalogQueryError(f"{value}: {path.stat().st_size} bytes is too large for a search geometry "
                                    f"(at most {MAX_GEOJSON_BYTES} bytes); simplify it first")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogQueryError(f"{value}: cannot be read as GeoJSON text ({exc})") from None
    return parse_intersects(text, value)


def _when(hit: SearchHit) -> str:
    """The acquisition time in full: the instant, the START/END interval, or 'unknown'."""
    p = hit.properties
    if p.get("cubelake:datetime_source") == "unknown":
        return "unknown"
    if hit.datetime:
        return hit.datetime
    return f"{p.get('start_datetime', '..')}/{p.get('end_datetime', '..')}"


def _table(hits: list[SearchHit]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("id", "left"), ("collection", "left"), ("datetime", "left"), ("bands", "right"),
                          ("nm covered", "left"), ("cloud", "right"), ("bbox", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for h in hits:
        p = h.properties
        cov = p.get("cubelake:wavelength_coverage_nm") or []
        span = f"{cov[0][0]:.0f}-{cov[-1][1]:.0f} ({len(cov)} part{'s' if len(cov) != 1 else ''})" if cov else "-"
        cloud = p.get("eo:cloud_cover")
        box_text = ",".join(f"{v:.3f}" for v in h.bbox) if h.bbox else "-"
        table.add_row(Text(h.id), Text(h.collection), Text(_when(h)), str(h.band_count), span,
                      "-" if cloud is None else f"{cloud:g}", box_text)
    return table


def _print_table(hits: list[SearchHit]) -> None:
    """The table at its own width, on a terminal too: no cell is ever cut, folded or dropped (a narrow
    terminal wraps whole lines; a pipe, a file or CI gets one line per item)."""
    from rich.measure import Measurement

    table = _table(hits)
    wide = Console(file=sys.stdout, highlight=False, width=100_000)
    out = Console(file=sys.stdout, highlight=False, soft_wrap=True,
                  width=Measurement.get(wide, wide.options, table).maximum)
    out.print(table)
    out.print(f"{len(hits)} item(s)")


@catalog_app.command("search")
def search_cmd(
    lake: str = LAKE,
    bbox: str | None = typer.Option(None, "--bbox", help="west,south,east,north in degrees (use --bbox=-10,... for a negative west)."),
    intersects: str | None = typer.Option(None, "--intersects", help="GeoJSON (text or file): a geometry, Feature or FeatureCollection (their union), WGS84."),
    datetime: str | None = typer.Option(None, "--datetime", "-t", help="START/END, '..' for an open end; 2022-06/2022-08, 2022."),
    collection: list[str] = typer.Option([], "--collection", "-c", help="Collection (sensor profile); repeatable."),
    ids: list[str] = typer.Option([], "--id", help="Item id; repeatable."),
    wavelength: str | None = typer.Option(None, "--wavelength", "-w", help="LO:HI nm that the kept bands cover without a hole."),
    min_bands: int | None = typer.Option(None, "--min-bands", help="At least this many bands."),
    geohash: str | None = typer.Option(None, "--geohash", help="Footprint meets a geohash cell with this prefix."),
    filters: list[str] = typer.Option([], "--filter", "-f", help="CQL2 text, e.g. \"eo:cloud_cover < 10 AND platform IN ('enmap')\", or PROPERTY OP VALUE ('platform=enmap'); repeatable, all must hold."),
    sort: list[str] = typer.Option([], "--sort", "-s", help="datetime, id, collection or a property; '-' prefix = descending."),
    limit: int | None = typer.Option(None, "--limit", "-n", help="At most this many items."),
    fmt: SearchFormat = typer.Option(SearchFormat.table, "--format", help="table; json (= geojson): a STAC ItemCollection with absolute hrefs; summary: one compact record per item."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Find items; every option given must hold."""
    configure_output(verbose, quiet)
    from cubelake.catalog import Query

    with _open(lake) as cat:
        try:
            hits = cat.search(Query(bbox=bbox, intersects=_intersects(intersects), datetime=datetime,
                                    collections=collection, ids=ids, wavelength_nm=wavelength, min_bands=min_bands,
                                    geohash=geohash, filters=filters, sort=sort, limit=limit))
            if fmt in (SearchFormat.json, SearchFormat.geojson):
                print_json(cat.item_collection(hits, matched=len(hits) if limit is None else None))
                return
        except CubelakeError as exc:
            raise _fail(exc) from None
    if fmt is SearchFormat.summary:
        print_json([h.to_dict() for h in hits])
        return
    _print_table(hits)


@catalog_app.command("serve")
def serve_cmd(
    lake: str = LAKE,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; 0.0.0.0 serves other machines too."),
    port: int = typer.Option(8000, "--port", "-p", help="TCP port (0: any free port, printed)."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Serve the catalog as a read-only STAC API (pystac-client, odc-stac, QGIS) with a map view at /."""
    configure_output(verbose, quiet)
    from cubelake.catalog.serve import serve

    try:
        serve(lake, host=host, port=port, announce=lambda url: out_console().print(
            f"STAC API of {lake} at {url} (map view: open it in a browser); Ctrl-C stops it"))
    except CubelakeError as exc:
        raise _fail(exc) from None


@catalog_app.command("show")
def show_cmd(
    item_id: str = typer.Argument(..., help="Item id (the scene id)."),
    lake: str = LAKE,
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Print an item's full STAC JSON."""
    configure_output(verbose, quiet)
    with _open(lake) as cat:
        try:
            print_json(cat.get(item_id))
        except CubelakeError as exc:
            raise _fail(exc) from None


@catalog_app.command("stats")
def stats_cmd(
    lake: str = LAKE,
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Items per collection, time span, band counts and index size."""
    configure_output(verbose, quiet)
    with _open(lake) as cat:
        try:
            stats = cat.stats()
        except CubelakeError as exc:
            raise _fail(exc) from None
    if fmt is TextOrJson.json:
        print_json(stats)
        return
    out = out_console()
    out.print(f"{stats['items']} item(s) in {len(stats['collections'])} collection(s); {stats['bands']} bands, "
              f"{stats['geohash_cells']} geohash cells, {stats['queryables']} queryable properties; "
              f"index {stats['index_bytes'] / 1e6:.1f} MB")
    for name, c in stats["collections"].items():
        span = f"{(c['start'] or '?')[:10]} .. {(c['end'] or '?')[:10]}" if c["start"] else "no known time"
        out.print(f"  {show(name)}: {c['items']} item(s), {span}, {c['bands'][0]}-{c['bands'][1]} bands, "
                  f"{c['georeferenced']} georeferenced, {c['unknown_time']} with unknown time")


@catalog_app.command("reindex")
def reindex_cmd(
    lake: str = LAKE,
    rebuild_items: bool = typer.Option(False, "--rebuild-items", help="Also rewrite every item.json from its scene.json (after an upgrade of cubelake)."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Rebuild the index from the item JSON files. Exit 1 if any item file was corrupt (each is named)."""
    configure_output(verbose, quiet)
    with _open(lake) as cat:
        try:
            report = cat.reindex(rebuild_items=rebuild_items)
        except CubelakeError as exc:
            raise _fail(exc) from None
    if fmt is TextOrJson.json:
        print_json(report.to_dict())
    else:
        out = out_console()
        out.print(f"indexed {report.indexed} item(s)")
        for sid in report.built:
            out.print(f"  built item {show(sid)} from its scene record")
        for path, why in report.corrupt:
            err_console().print(f"[red]skipped[/red] {show(path)}: {show(why)}")
    if report.corrupt:
        raise typer.Exit(1)


@catalog_app.command("export")
def export_cmd(
    output: str = typer.Option(..., "--output", "-o",
                               help="The .parquet file to write (an s3:// URL, e.g. into the lake, works too)."),
    lake: str = LAKE,
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Write every item as one stac-geoparquet file (geopandas.read_parquet, DuckDB read it)."""
    configure_output(verbose, quiet)
    with _open(lake) as cat:
        try:
            n = cat.export_geoparquet(output)
        except (CubelakeError, OSError) as exc:
            raise _fail(exc if isinstance(exc, CubelakeError) else CubelakeError(f"{output}: {exc}")) from None
    out_console().print(f"{n} item(s) -> {show(str(output))}")


@catalog_app.command("validate")
def validate_cmd(
    lake: str = LAKE,
    schemas: list[Path] = typer.Option([], "--schemas", help="Folder of extra official schema copies (JSON, by $id); repeatable."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Check catalog.json, every collection and every item against the official STAC 1.1 schemas (offline).

    Exit 1 if any is invalid (each is named with its problems).
    """
    configure_output(verbose, quiet)
    for folder in schemas:
        if not folder.is_dir():
            raise typer.BadParameter(f"{folder}: not a folder of JSON schemas", param_hint="--schemas")
    with _open(lake) as cat:
        try:
            report = cat.validate(schemas)
        except (CubelakeError, OSError, ValueError) as exc:
            raise _fail(exc if isinstance(exc, CubelakeError) else CubelakeError(f"{lake}: {exc}")) from None
    if fmt is TextOrJson.json:
        print_json(report.to_dict())
    else:
        out = out_console()
        out.print(f"{report.checked} STAC file(s) checked: {report.checked - len(report.invalid)} valid, "
                  f"{len(report.invalid)} invalid")
        for path, problems in report.invalid.items():
            err_console().print(f"[red]invalid[/red] {show(path)}")
            for problem in problems:
                err_console().print(f"    {show(problem)}")
    if not report.ok:
        raise typer.Exit(1)
