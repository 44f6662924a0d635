"""A read-only STAC API over a lake's catalog: ``cubelake catalog serve``.

Built on stac-fastapi (landing page, conformance, request models, routes, CORS) with this module's
client mapping each request onto the lake's index (:class:`~cubelake.catalog.Query`, CQL2 included),
so ``/search`` and ``cubelake catalog search`` answer from the same SQL. Items are served with API
links and asset hrefs under ``/lake/`` (the lake's own files, or a redirect to a presigned URL for a
lake on object storage). Errors are STAC API error objects, ``{"code", "description"}``, never a trace.

>>> from cubelake.catalog.api import create_app
>>> app = create_app("lake")          # then: uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlencode

import attr
import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from stac_fastapi.api.app import StacApi
from stac_fastapi.api.models import (
    ItemCollectionUri,
    create_get_request_model,
    create_post_request_model,
    create_request_model,
)
from stac_fastapi.extensions import FilterExtension, SortExtension, TokenPaginationExtension
from stac_fastapi.extensions.filter.client import BaseFiltersClient
from stac_fastapi.types.config import ApiSettings
from stac_fastapi.types.core import BaseCoreClient
from stac_fastapi.types.search import APIRequest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from cubelake.errors import CatalogError, CatalogQueryError, CubelakeError, ItemNotFoundError

from .query import Query
from .schema import STAC_VERSION

__all__ = ["MAX_LIMIT", "create_app"]

log = logging.getLogger(__name__)

MAX_LIMIT = 10_000  # OGC API Features: a larger limit is served as the maximum, not refused
DEFAULT_LIMIT = 10
_REFRESH_S = 5.0  # an object-store lake's index snapshot is looked for again at most this often
_GEOJSON = "application/geo+json"


class ApiError(CubelakeError):
    """A request the API answers with ``status`` and a STAC error object."""

    def __init__(self, status: int, code: str, description: str) -> None:
        super().__init__(description)
        self.status, self.code = status, code


def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode().rstrip("=")


def _offset(token: str | None) -> int:
    """The offset a paging token stands for; a token not made here is a 400."""
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        kind, _, value = text.partition(":")
        offset = int(value)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "InvalidParameterValue", f"token {token[:60]!r} is not a paging token of this API; "
                       "follow the 'next' link of a previous page") from None
    if kind != "o" or offset < 0:
        raise ApiError(400, "InvalidParameterValue", f"token {token[:60]!r} is not a paging token of this API")
    return offset


class _Catalogs:
    """One :class:`LakeCatalog` per server thread (the index is thread-confined), refreshed on object stores."""

    def __init__(self, lake: str) -> None:
        self.lake = lake
        self._local = threading.local()

    def get(self) -> Any:
        from .lake import LakeCatalog

        cat = getattr(self._local, "cat", None)
        if cat is None:
            cat = self._local.cat = LakeCatalog(self.lake)
            self._local.seen = time.monotonic()
        elif hasattr(cat, "refresh") and time.monotonic() - self._local.seen > _REFRESH_S:
            cat.refresh()
            self._local.seen = time.monotonic()
        return cat


class GeoJSONResponse(Response):
    """JSON serialised once, by orjson: FastAPI's ``jsonable_encoder`` walks every band of every item first
    (a 36-item page of hyperspectral items: 210 ms of the 250 ms a search took)."""

    media_type = _GEOJSON

    def render(self, content: Any) -> bytes:
        return bytes(orjson.dumps(content))


class JSONDocResponse(GeoJSONResponse):
    media_type = "application/json"


def _base(request: Request) -> str:
    return str(request.base_url)


def _sort_keys(sortby: Any) -> tuple[str, ...]:
    """GET ``sortby=-datetime,id`` or POST ``[{"field": ..., "direction": ...}]`` as the index's sort keys."""
    keys: list[str] = []
    for entry in sortby or []:
        if isinstance(entry, str):
            keys += [k for k in entry.split(",") if k.strip()]
            continue
        field = getattr(entry, "field", None) or (entry.get("field") if isinstance(entry, dict) else None)
        direction = getattr(entry, "direction", None) or (entry.get("direction") if isinstance(entry, dict) else "asc")
        keys.append(("-" if str(getattr(direction, "value", direction)) == "desc" else "") + str(field))
    return tuple(_sort_key(k) for k in keys)


def _sort_key(key: str) -> str:
    """``-properties.eo:cloud_cover`` as ``-eo:cloud_cover``: the direction kept, the STAC prefix dropped."""
    key = key.strip()
    sign = key[0] if key[:1] in ("+", "-") else ""
    return sign + key[len(sign):].strip().removeprefix("properties.")


@attr.s
class LakeClient(BaseCoreClient):
    """The core client stac-fastapi calls: each request onto the lake's index."""

    catalogs: _Catalogs = attr.ib(default=None)

    # -- collections -------------------------------------------------------------
    def _collection(self, cat: Any, coll: str, base: str) -> dict[str, Any]:
        doc = cat.collection_document(coll)
        if doc is None:
            raise ApiError(404, "NotFound", f"no collection {coll!r}; GET /collections lists them")
        doc["links"] = [
            {"rel": "self", "type": "application/json", "href": f"{base}collections/{coll}"},
            {"rel": "parent", "type": "application/json", "href": base},
            {"rel": "root", "type": "application/json", "href": base},
            {"rel": "items", "type": _GEOJSON, "href": f"{base}collections/{coll}/items"},
            {"rel": "http://www.opengis.net/def/rel/ogc/1.0/queryables", "type": "application/schema+json",
             "href": f"{base}collections/{coll}/queryables"},
        ]
        return doc

    def all_collections(self, **kwargs: Any) -> Any:
        base, cat = _base(kwargs["request"]), self.catalogs.get()
        colls = [self._collection(cat, c, base) for c in cat.index.collections()]
        return JSONDocResponse({"collections": colls, "links": [
            {"rel": "self", "type": "application/json", "href": f"{base}collections"},
            {"rel": "root", "type": "application/json", "href": base},
            {"rel": "parent", "type": "application/json", "href": base}]})

    def get_collection(self, collection_id: str, **kwargs: Any) -> Any:
        return JSONDocResponse(self._collection(self.catalogs.get(), collection_id, _base(kwargs["request"])))

    # -- items -------------------------------------------------------------------
    def _api_item(self, cat: Any, href: str, base: str) -> dict[str, Any]:
        from .items import with_absolute_hrefs

        item = cat.item_at(href)
        # a source file outside the lake (an absolute local path) is not served: no client could use its href
        item["assets"] = {k: a for k, a in (item.get("assets") or {}).items()
                          if not str(a.get("href", "")).startswith("/")}
        item = with_absolute_hrefs(item, f"{base}lake/{href}", in_place=True)
        coll, iid = item.get("collection"), item["id"]
        item["links"] = [
            {"rel": "self", "type": _GEOJSON, "href": f"{base}collections/{coll}/items/{iid}"},
            {"rel": "parent", "type": "application/json", "href": f"{base}collections/{coll}"},
            {"rel": "collection", "type": "application/json", "href": f"{base}collections/{coll}"},
            {"rel": "root", "type": "application/json", "href": base},
            *[lk for lk in item["links"] if lk.get("rel") not in ("self", "parent", "collection", "root")],
        ]
        return item

    def get_item(self, item_id: str, collection_id: str, **kwargs: Any) -> Any:
        cat = self.catalogs.get()
        hit = cat.index.get(item_id)
        if hit is None or hit.collection != collection_id or not hit.href:
            raise ApiError(404, "NotFound", f"no item {item_id!r} in collection {collection_id!r}")
        return GeoJSONResponse(self._api_item(cat, hit.href, _base(kwargs["request"])))

    def _page(self, request: Request, query: Query, offset: int, limit: int, body: dict[str, Any] | None) -> Response:
        import dataclasses

        cat, base = self.catalogs.get(), _base(request)
        hits = cat.search(dataclasses.replace(query, limit=limit + 1, offset=offset))
        more, hits = len(hits) > limit, hits[:limit]
        features = [self._api_item(cat, h.href, base) for h in hits if h.href]
        links: list[dict[str, Any]] = [{"rel": "root", "type": "application/json", "href": base}]
        if more:
            links.append(self._next(request, offset + limit, body))
        return GeoJSONResponse({"type": "FeatureCollection", "features": features, "numberReturned": len(features),
                                "links": links})

    def _next(self, request: Request, offset: int, body: dict[str, Any] | None) -> dict[str, Any]:
        url = str(request.url).split("?", 1)[0]
        if body is not None:  # POST: the same body with the next token
            return {"rel": "next", "type": _GEOJSON, "href": url, "method": "POST", "merge": False,
                    "body": {**body, "token": _token(offset)}}
        params = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        return {"rel": "next", "type": _GEOJSON, "href": f"{url}?{urlencode([*params, ('token', _token(offset))])}",
                "method": "GET"}

    def item_collection(self, collection_id: str, bbox: Any = None, datetime: str | None = None,
                        limit: int | None = DEFAULT_LIMIT, token: str | None = None, **kwargs: Any) -> Any:
        cat = self.catalogs.get()
        if collection_id not in cat.index.collections():
            raise ApiError(404, "NotFound", f"no collection {collection_id!r}; GET /collections lists them")
        query = _query(collections=[collection_id], bbox=bbox, datetime=datetime, **_extension_args(kwargs))
        return self._page(kwargs["request"], query, _offset(token), _limit(limit), None)

    def get_search(self, collections: list[str] | None = None, ids: list[str] | None = None,
                   bbox: Any = None, intersects: Any = None, datetime: str | None = None,
                   limit: int | None = DEFAULT_LIMIT, token: str | None = None, **kwargs: Any) -> Any:
        if intersects is not None and bbox is not None:
            raise ApiError(400, "InvalidParameterValue", "bbox and intersects are mutually exclusive; give one")
        query = _query(collections=collections, ids=ids, bbox=bbox, intersects=intersects, datetime=datetime,
                       **_extension_args(kwargs))
        return self._page(kwargs["request"], query, _offset(token), _limit(limit), None)

    def post_search(self, search_request: Any, **kwargs: Any) -> Any:
        # (bbox with intersects never reaches here: stac-fastapi's POST model refuses it, a 400 like GET's)
        body = search_request.model_dump(mode="json", by_alias=True, exclude_none=True)
        query = _query(collections=body.get("collections"), ids=body.get("ids"), bbox=body.get("bbox"),
                       intersects=body.get("intersects"), datetime=body.get("datetime"),
                       sortby=body.get("sortby"), filter_expr=body.get("filter"), filter_lang=body.get("filter-lang"))
        return self._page(kwargs["request"], query, _offset(body.get("token")), _limit(body.get("limit")), body)


def _limit(limit: int | None) -> int:
    return DEFAULT_LIMIT if limit is None else min(int(limit), MAX_LIMIT)


def _extension_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"sortby": kwargs.get("sortby"), "filter_expr": kwargs.get("filter_expr"),
            "filter_lang": kwargs.get("filter_lang")}


def _query(*, collections: Any = None, ids: Any = None, bbox: Any = None, intersects: Any = None,
           datetime: Any = None, sortby: Any = None, filter_expr: Any = None, filter_lang: Any = None) -> Query:
    if intersects is not None and hasattr(intersects, "model_dump"):
        intersects = intersects.model_dump(mode="json", exclude_none=True)
    return Query(bbox=list(bbox) if bbox is not None else None, intersects=intersects,
                 datetime=str(datetime) if datetime else None, collections=tuple(collections or ()),
                 ids=tuple(ids or ()), sort=_sort_keys(sortby), filter=filter_expr, filter_lang=filter_lang)


def _queryables(catalogs: _Catalogs, base: str, collection_id: str | None) -> dict[str, Any]:
    from .queryables import queryables_schema

    cat = catalogs.get()
    if collection_id is not None and collection_id not in cat.index.collections():
        raise ApiError(404, "NotFound", f"no collection {collection_id!r}; GET /collections lists them")
    url = f"{base}collections/{collection_id}/queryables" if collection_id else f"{base}queryables"
    return queryables_schema(cat.index.queryables(), url)


def _error(status: int, code: str, description: str) -> JSONResponse:
    return JSONResponse({"code": code, "description": description}, status_code=status)


def _validation_text(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body", "query"))
        parts.append(f"{where or 'request'}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def _install_errors(app: FastAPI) -> None:
    """Every error a STAC API error object: 400 for a bad request, 404 for what is not there, 500 without a trace."""

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return _error(exc.status, exc.code, str(exc))

    async def query_error(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, ItemNotFoundError):
            return _error(404, "NotFound", str(exc))
        return _error(400, "InvalidParameterValue", str(exc))

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _error(400, "InvalidParameterValue", _validation_text(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        code = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "InvalidParameterValue")
        query = request.url.query
        where = f" (in the request {query[:200]!r})" if exc.status_code == 400 and query else ""
        return _error(exc.status_code, code, f"{exc.detail}{where}")

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return _error(500, "InternalServerError", "the server failed to answer this request; its log says why")

    for exc_type, handler in ((ApiError, api_error), (CatalogQueryError, query_error),
                              (ItemNotFoundError, query_error), (RequestValidationError, validation),
                              (HTTPException, http_error), (CatalogError, internal)):
        app.add_exception_handler(exc_type, handler)

    # anything else: answered here, not by Starlette's error middleware (which re-raises into the server's log
    # with a traceback after answering)
    @app.middleware("http")
    async def last_resort(request: Request, call_next: Any) -> Any:
        try:
            return await call_next(request)
        except Exception as exc:
            return await internal(request, exc)


class _Filters(BaseFiltersClient):
    """``/queryables`` and ``/collections/{id}/queryables``: the properties the index has seen, typed."""

    def __init__(self, catalogs: _Catalogs) -> None:
        self.catalogs = catalogs

    def get_queryables(self, collection_id: str | None = None, **kwargs: Any) -> dict[str, Any]:
        request = kwargs["request"]
        return _queryables(self.catalogs, _base(request), collection_id)


def create_app(lake: str | Path, *, title: str | None = None) -> FastAPI:
    """The STAC API application of ``lake`` (a folder or ``s3://`` URL)."""
    catalogs = _Catalogs(str(lake))
    catalogs.get()  # a lake without a catalog fails here, before the server starts
    sort = SortExtension()
    # pystac-client looks for the v1.0.0 URI of sort; stac-fastapi 7 names v1.1.0 (the same request syntax)
    sort.conformance_classes = [*sort.conformance_classes, "https://api.stacspec.org/v1.0.0/item-search#sort",
                                "https://api.stacspec.org/v1.0.0/ogcapi-features#sort"]
    extensions = [FilterExtension(client=_Filters(catalogs)), sort, TokenPaginationExtension()]
    items_model = create_request_model("ItemCollectionUri", base_model=ItemCollectionUri, extensions=extensions,
                                       request_type="GET")
    settings = ApiSettings(stac_fastapi_title=title or f"cubelake: {lake}",
                           stac_fastapi_description=f"The STAC API of the cubelake lake {lake} (read-only)",
                           stac_fastapi_landing_id="cubelake")
    client = LakeClient(catalogs=catalogs, title=settings.stac_fastapi_title,
                        description=settings.stac_fastapi_description, landing_page_id="cubelake",
                        stac_version=STAC_VERSION)
    api = StacApi(settings=settings, client=client, extensions=extensions, exceptions={}, stac_version=STAC_VERSION,
                  search_get_request_model=create_get_request_model(extensions),
                  search_post_request_model=create_post_request_model(extensions),
                  items_get_request_model=cast("type[APIRequest]", items_model))
    app = api.app
    _install_errors(app)
    from .serve_files import install_lake_files, install_map

    install_lake_files(app, catalogs)
    install_map(app)
    return app
