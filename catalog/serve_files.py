"""What the STAC API serves besides STAC JSON: the lake's asset files, the map view and pixel spectra.

- ``GET /lake/{key}``: a product file of the lake (byte ranges too, so GDAL's ``/vsicurl/`` reads COG
  tiles); on object storage, a redirect to a presigned URL. Only files of published scenes and
  derived products are served (no index, no staging, no hidden files) and a key never leaves the lake.
- ``GET /`` from a browser (``Accept: text/html``), ``GET /map``: the map view (``catalog/web/``, with
  Leaflet vendored from npm: it works offline); ``/static/...``: its files.
- ``GET /collections/{c}/items/{id}/spectrum?lon=&lat=``: one pixel's spectrum from the item's COG.
"""

from __future__ import annotations

import math
import posixpath
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from cubelake.lake import DERIVED_ROOTS

__all__ = ["WEB_DIR", "install_lake_files", "install_map", "lake_key"]

WEB_DIR = Path(__file__).parent / "web"
# the lake's top-level folders whose files the API may serve (scenes and derived products)
_SERVED_ROOTS = ("scenes", "collections", *DERIVED_ROOTS)
_MAX_KEY = 1024


def lake_key(path: str) -> str | None:
    """``path`` as a servable key of the lake, or ``None`` (traversal, hidden segments, outside the served roots)."""
    if not path or len(path) > _MAX_KEY or "\\" in path or "\x00" in path:
        return None
    parts = path.split("/")
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        return None
    if parts[0] not in _SERVED_ROOTS or len(parts) < 2:
        return None
    return posixpath.join(*parts)


def _not_found(key: str) -> JSONResponse:
    return JSONResponse({"code": "NotFound", "description": f"no file {key[:200]!r} in this lake"}, status_code=404)


def install_lake_files(app: FastAPI, catalogs: Any) -> None:
    async def lake_file(path: str, request: Request) -> Response:
        key = lake_key(path)
        if key is None:
            return _not_found(path)
        store = catalogs.get().lake.store
        if not store.is_local:
            from starlette.concurrency import run_in_threadpool

            url = await run_in_threadpool(store.signed_url, key)
            return RedirectResponse(url, status_code=307)
        root = store.local_path().resolve()
        file = (root / key).resolve()
        if not file.is_relative_to(root) or not file.is_file():  # a symlink out of the lake is not served
            return _not_found(path)
        return FileResponse(file, media_type=_media_type(file.name))

    app.add_api_route("/lake/{path:path}", lake_file, methods=["GET", "HEAD"], include_in_schema=False)

    async def spectrum(collection_id: str, item_id: str, lon: float, lat: float, request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        return JSONResponse(await run_in_threadpool(_spectrum, catalogs, collection_id, item_id, lon, lat))

    app.add_api_route("/collections/{collection_id}/items/{item_id}/spectrum", spectrum, methods=["GET"],
                      tags=["cubelake"], summary="One pixel's spectrum (from the item's COG)")


def _media_type(name: str) -> str:
    if name.endswith((".tif", ".tiff")):
        return "image/tiff; application=geotiff; profile=cloud-optimized"
    if name.endswith(".json"):
        return "application/json"
    if name.endswith(".png"):
        return "image/png"
    return "application/octet-stream"


def _cog_asset(item: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    for key, asset in (item.get("assets") or {}).items():
        roles = asset.get("roles") or []
        if "data" in roles and not {"auxiliary", "source"} & set(roles) \
                and str(asset.get("type", "")).startswith("image/tiff"):
            return key, asset
    return None


def _spectrum(catalogs: Any, collection_id: str, item_id: str, lon: float, lat: float) -> dict[str, Any]:
    import numpy as np
    import rasterio
    from rasterio.warp import transform as warp_transform

    from .api import ApiError

    if not (math.isfinite(lon) and math.isfinite(lat) and -180 <= lon <= 180 and -90 <= lat <= 90):
        raise ApiError(400, "InvalidParameterValue", f"lon {lon}, lat {lat}: need WGS84 degrees")
    cat = catalogs.get()
    hit = cat.index.get(item_id)
    if hit is None or hit.collection != collection_id or not hit.href:
        raise ApiError(404, "NotFound", f"no item {item_id!r} in collection {collection_id!r}")
    item = cat.item_at(hit.href)
    found = _cog_asset(item)
    if found is None:
        raise ApiError(404, "NotFound", f"item {item_id!r} has no COG to read a spectrum from")
    key = posixpath.normpath(posixpath.join(posixpath.dirname(hit.href), found[1]["href"]))
    store = cat.lake.store
    path = str(store.local_path(key)) if store.is_local else f"/vsicurl/{store.signed_url(key)}"
    with rasterio.open(path) as src:
        if src.crs is None:
            raise ApiError(404, "NotFound", f"item {item_id!r} is not georeferenced")
        xs, ys = warp_transform("EPSG:4326", src.crs, [lon], [lat])
        row, col = src.index(xs[0], ys[0])
        if not (0 <= row < src.height and 0 <= col < src.width):
            raise ApiError(404, "NotFound", f"({lon}, {lat}) is outside item {item_id!r}")
        values = src.read(window=((row, row + 1), (col, col + 1)))[:, 0, 0].astype("float64")
        nodata = src.nodata
    bands = found[1].get("bands") or []
    wl = [b.get("eo:center_wavelength") for b in bands] if len(bands) == len(values) else [None] * len(values)
    valid = ~np.isnan(values) if nodata is None or (isinstance(nodata, float) and math.isnan(nodata)) \
        else (values != nodata) & ~np.isnan(values)
    return {"item": item_id, "lon": lon, "lat": lat, "row": int(row), "col": int(col), "asset": found[0],
            "wavelength_um": wl, "values": [float(v) if ok else None for v, ok in zip(values, valid, strict=True)]}


def install_map(app: FastAPI) -> None:
    """The map page at ``/map`` and at ``/`` for browsers; the landing page JSON stays ``/`` for STAC clients."""
    index = WEB_DIR / "index.html"

    async def map_page() -> Response:
        return FileResponse(index, media_type="text/html")

    app.add_api_route("/map", map_page, methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")

    @app.middleware("http")
    async def browsers_get_the_map(request: Request, call_next: Any) -> Response:
        accept = request.headers.get("accept", "")
        if request.url.path == "/" and request.method == "GET" and "text/html" in accept \
                and request.query_params.get("f") != "json":
            return FileResponse(index, media_type="text/html")
        response: Response = await call_next(request)
        return response
