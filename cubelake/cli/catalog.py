"""``cubelake catalog``: search, show, stats, reindex and export the lake's STAC catalog."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from cubelake.catalog.lake import LakeCatalog
from cubelake.errors import CatalogQueryError, CubelakeError

from ._render import (
    QUIET,
    VERBOSE,
    configure_output,
    err_console,
    escape,
    fail,
    out_console,
    print_json,
)

catalog_app = typer.Typer(help="The lake's STAC catalog: search by space, time, wavelength and properties.",
                          no_args_is_help=True)

LAKE = typer.Option(Path("lake"), "--lake", "-l", help="Lake folder.", envvar="CUBELAKE_LAKE")


class SearchFormat(StrEnum):
    table = "table"
    json = "json"
    geojson = "geojson"


class TextOrJson(StrEnum):
    text = "text"
    json = "json"


def _fail(exc: CubelakeError) -> typer.Exit:
    """A malformed query is a usage error (exit 2); anything else exit 1."""
    return fail(exc, 2 if isinstance(exc, CatalogQueryError) else 1)


def _open(lake: Path) -> LakeCatalog:
    try:
        return LakeCatalog(lake)
    except CubelakeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lake") from exc


def _intersects(value: str | None) -> str | None:
    if value is None or value.lstrip().startswith("{"):
        return value
    path = Path(value)
    if not path.is_file():
        raise typer.BadParameter(f"{value}: neither GeoJSON text nor a GeoJSON file", param_hint="--intersects")
    return path.read_text()


@catalog_app.command("search")
def search_cmd(
    lake: Path = LAKE,
    bbox: str | None = typer.Option(None, "--bbox", help="west,south,east,north in degrees (use --bbox=-10,... for a negative west)."),
    intersects: str | None = typer.Option(None, "--intersects", help="GeoJSON geometry (text or file), WGS84."),
    datetime: str | None = typer.Option(None, "--datetime", "-t", help="START/END, '..' for an open end; 2022-06/2022-08, 2022."),
    collection: list[str] = typer.Option([], "--collection", "-c", help="Collection (sensor profile); repeatable."),
    ids: list[str] = typer.Option([], "--id", help="Item id; repeatable."),
    wavelength: str | None = typer.Option(None, "--wavelength", "-w", help="LO:HI nm that the kept bands cover without a hole."),
    min_bands: int | None = typer.Option(None, "--min-bands", help="At least this many bands."),
    geohash: str | None = typer.Option(None, "--geohash", help="Footprint meets a geohash cell with this prefix."),
    filters: list[str] = typer.Option([], "--filter", "-f", help="PROPERTY OP VALUE, e.g. 'eo:cloud_cover<10'; repeatable."),
    sort: list[str] = typer.Option([], "--sort", "-s", help="datetime, id, collection or a property; '-' prefix = descending."),
    limit: int | None = typer.Option(None, "--limit", "-n", help="At most this many items."),
    fmt: SearchFormat = typer.Option(SearchFormat.table, "--format", help="table, json, or geojson (a FeatureCollection of the items)."),
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
            if fmt is SearchFormat.geojson:
                print_json({"type": "FeatureCollection", "features": cat.items(hits), "numberReturned": len(hits),
                            **({"numberMatched": len(hits)} if limit is None else {})})
                return
        except CubelakeError as exc:
            raise _fail(exc) from None
    if fmt is SearchFormat.json:
        print_json([h.to_dict() for h in hits])
        return
    out = out_console()
    out.print(f"{'id':<36} {'collection':<20} {'datetime':<20} {'bands':>5} {'nm covered':<22} {'cloud':>5}  bbox")
    for h in hits:
        p = h.properties
        cov = p.get("cubelake:wavelength_coverage_nm") or []
        span = f"{cov[0][0]:.0f}-{cov[-1][1]:.0f} ({len(cov)} part{'s' if len(cov) != 1 else ''})" if cov else "-"
        when = (h.datetime or (f"{p.get('start_datetime', '')[:10]}..{p.get('end_datetime', '')[:10]}"
                               if p.get("cubelake:datetime_source") != "unknown" else "unknown"))
        cloud = p.get("eo:cloud_cover")
        box = ",".join(f"{v:.3f}" for v in h.bbox) if h.bbox else "-"
        out.print(f"{escape(h.id):<36} {escape(h.collection):<20} {escape(str(when)[:20]):<20} {h.band_count:>5} "
                  f"{span:<22} {('-' if cloud is None else f'{cloud:g}'):>5}  {box}")
    out.print(f"{len(hits)} item(s)")


@catalog_app.command("show")
def show_cmd(
    item_id: str = typer.Argument(..., help="Item id (the scene id)."),
    lake: Path = LAKE,
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
    lake: Path = LAKE,
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
        out.print(f"  {escape(name)}: {c['items']} item(s), {span}, {c['bands'][0]}-{c['bands'][1]} bands, "
                  f"{c['georeferenced']} georeferenced, {c['unknown_time']} with unknown time")


@catalog_app.command("reindex")
def reindex_cmd(
    lake: Path = LAKE,
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json."),
    verbose: int = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Rebuild the index from the item JSON files. Exit 1 if any item file was corrupt (each is named)."""
    configure_output(verbose, quiet)
    with _open(lake) as cat:
        try:
            report = cat.reindex()
        except CubelakeError as exc:
            raise _fail(exc) from None
    if fmt is TextOrJson.json:
        print_json(report.to_dict())
    else:
        out = out_console()
        out.print(f"indexed {report.indexed} item(s)")
        for sid in report.built:
            out.print(f"  built item {escape(sid)} from its scene record (it had none)")
        for path, why in report.corrupt:
            err_console().print(f"[red]skipped[/red] {escape(path)}: {escape(why)}")
    if report.corrupt:
        raise typer.Exit(1)


@catalog_app.command("export")
def export_cmd(
    output: Path = typer.Option(..., "--output", "-o", help="The .parquet file to write."),
    lake: Path = LAKE,
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
    out_console().print(f"{n} item(s) -> {escape(str(output))}")
