"""The STAC API's request handling in process (Starlette's test client over ``create_app``, no server): links,
paging tokens, limits, sorting, the two search methods, queryables and every error as a STAC error object.
``test_api.py`` checks the same API end to end against pystac-client, over HTTP, on the real-scene lake."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from shapely.geometry import box

from cubelake.catalog.api import MAX_LIMIT, _offset, _sort_keys, _token, create_app
from cubelake.errors import CatalogError
from cubelake.testing.lakes import synthetic_lake

from .conftest import Synth

BASE = "http://testserver/"
ALPHA = [f"a{n:02d}" for n in range(23)]
BETA = [f"b{n:02d}" for n in range(4)]


def _items() -> list[dict[str, Any]]:
    out = []
    for n, iid in enumerate(ALPHA):
        item = Synth(iid, collection="alpha", geometry=box(n, 0, n + 0.5, 0.5), datetime=f"2021-01-{n + 1:02d}T00:00:00Z",
                     properties={"eo:cloud_cover": (n * 7) % 23}).to_item()
        item["assets"] = {"cog": {"href": f"./{iid}.tif", "type": "image/tiff", "roles": ["data"]},
                          "source": {"href": f"/data/raw/{iid}.tif", "roles": ["source"]}}
        item["links"] = [{"rel": "license", "href": "https://example.com/licence"}]
        out.append(item)
    out += [Synth(iid, collection="beta", geometry=box(50 + n, 10, 50.5 + n, 10.5), datetime="2022-06-01T00:00:00Z",
                  properties={"eo:cloud_cover": 90 + n}).to_item() for n, iid in enumerate(BETA)]
    return out


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    lake = synthetic_lake(tmp_path_factory.mktemp("api") / "lake", _items())
    with TestClient(create_app(lake, title="the test lake")) as c:
        yield c


def ids(doc: dict[str, Any]) -> list[str]:
    return [f["id"] for f in doc["features"]]


def rels(doc: dict[str, Any]) -> dict[str, Any]:
    return {lk["rel"]: lk for lk in doc["links"]}


def test_the_landing_page_names_the_lake_and_what_it_conforms_to(client: TestClient) -> None:
    doc = client.get("/", headers={"Accept": "application/json"}).json()
    assert doc["title"] == "the test lake"
    assert doc["id"] == "cubelake"
    conf = client.get("/conformance").json()["conformsTo"]
    for c in ("https://api.stacspec.org/v1.0.0/core", "https://api.stacspec.org/v1.0.0/item-search#sort",
              "https://api.stacspec.org/v1.0.0/ogcapi-features#sort"):
        assert c in conf
    assert any("filter" in c for c in conf)


def test_collections_link_to_themselves_their_items_and_queryables(client: TestClient) -> None:
    doc = client.get("/collections").json()
    assert [c["id"] for c in doc["collections"]] == ["alpha", "beta"]
    assert {k: v["href"] for k, v in rels(doc).items()} == {"self": BASE + "collections", "root": BASE, "parent": BASE}
    one = client.get("/collections/beta")
    assert one.headers["content-type"] == "application/json"
    assert {k: v["href"] for k, v in rels(one.json()).items()} == {
        "self": BASE + "collections/beta", "parent": BASE, "root": BASE, "items": BASE + "collections/beta/items",
        "http://www.opengis.net/def/rel/ogc/1.0/queryables": BASE + "collections/beta/queryables"}
    assert rels(one.json())["items"]["type"] == "application/geo+json"


def test_an_item_has_api_links_its_own_links_and_only_servable_assets(client: TestClient) -> None:
    r = client.get("/collections/alpha/items/a03")
    assert r.headers["content-type"] == "application/geo+json"
    item = r.json()
    assert item["id"] == "a03"
    assert [(lk["rel"], lk["href"]) for lk in item["links"]] == [
        ("self", BASE + "collections/alpha/items/a03"), ("parent", BASE + "collections/alpha"),
        ("collection", BASE + "collections/alpha"), ("root", BASE), ("license", "https://example.com/licence")]
    assert item["assets"] == {"cog": {"href": BASE + "lake/scenes/a03/a03.tif", "type": "image/tiff",
                                      "roles": ["data"]}}  # the source outside the lake is not listed


@pytest.mark.parametrize("path", ["/collections/alpha/items/b01", "/collections/beta/items/nope",
                                  "/collections/nope/items/a01"])
def test_an_item_outside_its_collection_is_not_found(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404
    assert r.json()["code"] == "NotFound"
    assert "no item" in r.json()["description"]


def _pages(client: TestClient, method: str, first: dict[str, Any], path: str = "/search") -> list[list[str]]:
    r = client.get(path, params=first) if method == "GET" else client.post(path, json=first)
    pages = []
    while True:
        assert r.status_code == 200, r.text
        doc = r.json()
        pages.append(ids(doc))
        assert doc["numberReturned"] == len(doc["features"])
        nxt = rels(doc).get("next")
        if nxt is None:
            return pages
        assert nxt["method"] == method
        if method == "GET":
            r = client.get(nxt["href"])
        else:
            assert nxt["merge"] is False
            assert nxt["href"] == BASE + "search"
            assert {k: nxt["body"].get(k) for k in first if k != "token"} == {k: v for k, v in first.items()
                                                                          if k != "token"}  # the same search
            r = client.post(nxt["href"], json=nxt["body"])


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_pages_cover_a_search_once_in_its_order(client: TestClient, method: str) -> None:
    first = {"limit": 5, "collections": "alpha" if method == "GET" else ["alpha"],
             "sortby": "-eo:cloud_cover" if method == "GET" else [{"field": "properties.eo:cloud_cover",
                                                                   "direction": "desc"}]}
    pages = _pages(client, method, first)
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    flat = [i for p in pages for i in p]
    assert flat == sorted(ALPHA, key=lambda i: -((int(i[1:]) * 7) % 23))


def test_a_next_link_keeps_the_other_parameters_and_replaces_the_token(client: TestClient) -> None:
    doc = client.get("/search", params={"bbox": "0,0,30,1", "limit": 10, "token": _token(10)}).json()
    assert ids(doc) == ALPHA[10:20]
    href = rels(doc)["next"]["href"]
    assert href == f"{BASE}search?bbox=0%2C0%2C30%2C1&limit=10&token={_token(20)}"
    assert ids(client.get(href).json()) == ALPHA[20:]
    assert "next" not in rels(client.get(href).json())  # the last page
    assert rels(doc)["root"]["href"] == BASE


def test_the_items_of_a_collection_page_too(client: TestClient) -> None:
    pages = _pages(client, "GET", {"limit": 10}, "/collections/alpha/items")
    assert [i for p in pages for i in p] == ALPHA
    assert ids(client.get("/collections/beta/items").json()) == BETA
    r = client.get("/collections/nope/items")
    assert r.status_code == 404
    assert "GET /collections lists them" in r.json()["description"]


def test_limits_default_to_10_and_are_capped_at_the_maximum(client: TestClient) -> None:
    assert len(ids(client.get("/search").json())) == 10
    assert len(ids(client.post("/search", json={}).json())) == 10
    every = client.get("/search", params={"limit": MAX_LIMIT * 100}).json()
    assert len(ids(every)) == len(ALPHA) + len(BETA)
    assert "next" not in rels(every)
    exact = client.get("/search", params={"limit": len(ALPHA) + len(BETA)}).json()
    assert "next" not in rels(exact)  # a page that ends exactly at the last item has no next link
    assert "next" in rels(client.get("/search", params={"limit": len(ALPHA) + len(BETA) - 1}).json())


@pytest.mark.parametrize(("params", "want"), [
    ({"ids": "b02,a05"}, ["a05", "b02"]),
    ({"collections": "beta"}, BETA),
    ({"bbox": "49.9,9.9,51.6,10.6"}, ["b00", "b01"]),
    ({"datetime": "2022-01-01T00:00:00Z/..", "sortby": "-id"}, BETA[::-1]),
    ({"filter": "eo:cloud_cover >= 92", "filter-lang": "cql2-text"}, ["b02", "b03"]),
    ({"intersects": '{"type": "Point", "coordinates": [2.25, 0.25]}'}, ["a02"]),
    ({"collections": "alpha", "sortby": "-datetime", "limit": 2}, ["a22", "a21"]),
    ({"collections": "alpha", "sortby": "+eo:cloud_cover,id", "limit": 3}, ["a00", "a10", "a20"]),
])
def test_get_search_parameters_select_and_order(client: TestClient, params: dict[str, Any], want: list[str]) -> None:
    r = client.get("/search", params=params)
    assert r.status_code == 200, r.text
    assert ids(r.json()) == want


def test_post_search_takes_the_same_in_json(client: TestClient) -> None:
    body = {"collections": ["alpha"], "bbox": [0, 0, 5.9, 1], "datetime": "2021-01-02T00:00:00Z/2021-01-05T00:00:00Z",
            "sortby": [{"field": "id", "direction": "desc"}], "filter": {"op": "<", "args": [
                {"property": "eo:cloud_cover"}, 20]}, "filter-lang": "cql2-json"}
    assert ids(client.post("/search", json=body).json()) == ["a04", "a02", "a01"]
    assert ids(client.post("/search", json={"ids": ["a01", "b01"], "collections": ["beta"]}).json()) == ["b01"]
    point = {"intersects": {"type": "Point", "coordinates": [50.25, 10.25]}}
    assert ids(client.post("/search", json=point).json()) == ["b00"]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_bbox_and_intersects_together_are_refused(client: TestClient, method: str) -> None:
    geom = {"type": "Point", "coordinates": [1.0, 0.25]}
    r = client.get("/search", params={"bbox": "0,0,1,1", "intersects": '{"type": "Point", "coordinates": [1, 0.25]}'}) \
        if method == "GET" else client.post("/search", json={"bbox": [0, 0, 1, 1], "intersects": geom})
    assert r.status_code == 400
    assert r.json()["code"] == "InvalidParameterValue"
    assert "mutually exclusive" in r.json()["description"]  # (POST: stac-fastapi's request model says it first)


@pytest.mark.parametrize(("token", "words"), [
    ("forged", "is not a paging token of this API; follow the 'next' link"),
    (base64.urlsafe_b64encode(b"x:5").decode(), "is not a paging token"),
    (base64.urlsafe_b64encode(b"o:-1").decode(), "is not a paging token"),
    (base64.urlsafe_b64encode(b"o:five").decode(), "is not a paging token"),
    (base64.urlsafe_b64encode(b"\xff\xfe:1").decode(), "is not a paging token"),
])
def test_a_token_not_made_here_is_a_400(client: TestClient, token: str, words: str) -> None:
    for r in (client.get("/search", params={"token": token}), client.post("/search", json={"token": token})):
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "InvalidParameterValue"
        assert words in r.json()["description"]


def test_tokens_round_trip() -> None:
    for offset in (0, 1, 10, 12345, 10**12):
        assert _offset(_token(offset)) == offset
        assert "=" not in _token(offset)
    assert _offset(None) == 0
    assert _offset("") == 0


@pytest.mark.parametrize(("sortby", "keys"), [
    (None, ()), ([], ()), (["-datetime,id"], ("-datetime", "id")), (["properties.eo:cloud_cover, ,id"],
                                                                    ("eo:cloud_cover", "id")),
    ([{"field": "properties.eo:cloud_cover", "direction": "desc"}, {"field": "id", "direction": "asc"}],
     ("-eo:cloud_cover", "id")),
    ([{"field": "datetime"}], ("datetime",)), (["-properties.eo:cloud_cover", "+properties.id"],
                                               ("-eo:cloud_cover", "+id")),
])
def test_sort_keys_from_get_and_post(sortby: Any, keys: tuple[str, ...]) -> None:
    assert _sort_keys(sortby) == keys


@pytest.mark.parametrize(("method", "path", "status", "code", "description"), [
    ("GET", "/search?limit=abc", 400, "InvalidParameterValue", "limit: Input should be a valid integer"),
    ("GET", "/search?bbox=1,2,3", 400, "InvalidParameterValue", "(in the request 'bbox=1,2,3')"),
    ("GET", "/search?filter=nosuch:prop = 3", 400, "InvalidParameterValue", "unknown property"),
    ("GET", "/collections/nope", 404, "NotFound", "no collection 'nope'; GET /collections lists them"),
    ("GET", "/nope", 404, "NotFound", "Not Found"),
    ("DELETE", "/search", 405, "MethodNotAllowed", "Method Not Allowed"),
    ("GET", "/collections/nope/queryables", 404, "NotFound", "no collection 'nope'"),
])
def test_errors_are_stac_error_objects(client: TestClient, method: str, path: str, status: int, code: str,
                                       description: str) -> None:
    r = client.request(method, path)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"code", "description"}
    assert r.json()["code"] == code
    assert description in r.json()["description"]


def test_a_request_with_no_query_has_no_request_in_its_error(client: TestClient) -> None:
    r = client.post("/search", json={"bbox": [1, 2, 3]})
    assert r.status_code == 400
    assert "in the request" not in r.json()["description"]
    r = client.get("/nope", params={"x": "1"})  # only a bad request (400) quotes its query
    assert r.status_code == 404
    assert r.json()["description"] == "Not Found"


@pytest.mark.parametrize("error", [CatalogError("the index is damaged"), RuntimeError("a bug")])
def test_a_failure_inside_is_a_500_without_its_trace(client: TestClient, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture, error: Exception) -> None:
    from cubelake.catalog.lake import LakeCatalog

    def fail(*_a: object, **_k: object) -> None:
        raise error

    monkeypatch.setattr(LakeCatalog, "search", fail)
    r = client.get("/search")
    assert r.status_code == 500
    assert r.json() == {"code": "InternalServerError",
                        "description": "the server failed to answer this request; its log says why"}
    assert f"GET /search failed: {type(error).__name__}: {error}" in caplog.text


def test_queryables_of_the_lake_and_of_a_collection(client: TestClient) -> None:
    lake = client.get("/queryables").json()
    assert lake["$id"] == BASE + "queryables"
    assert "eo:cloud_cover" in lake["properties"]
    coll = client.get("/collections/alpha/queryables").json()
    assert coll["$id"] == BASE + "collections/alpha/queryables"


def test_the_limit_cap_is_the_one_the_readme_states() -> None:
    from tests.conftest import ROOT

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"a limit above {MAX_LIMIT:,} is served as {MAX_LIMIT:,} (OGC API Features)" in readme
    assert MAX_LIMIT == 10_000


def test_a_long_forged_token_is_quoted_cut_to_60_characters(client: TestClient) -> None:
    token = "t" * 59 + "XYZ" + "u" * 100
    r = client.get("/search", params={"token": token})
    assert r.status_code == 400
    assert r.json()["description"].startswith(f"token {token[:60]!r} is not a paging token")


def test_an_object_store_lake_is_looked_at_again_at_most_every_5_s(monkeypatch: pytest.MonkeyPatch) -> None:
    from cubelake.catalog import api as api_mod
    from cubelake.catalog import lake as lake_mod

    class Remote:
        refreshed = 0

        def __init__(self, lake: str) -> None:
            self.lake = lake

        def refresh(self) -> None:
            Remote.refreshed += 1

    clock = [2.0]
    monkeypatch.setattr(lake_mod, "LakeCatalog", Remote)
    monkeypatch.setattr(api_mod.time, "monotonic", lambda: clock[0])
    catalogs = api_mod._Catalogs("s3://bucket/lake")
    first = catalogs.get()
    for now, refreshed in ((3.0, 0), (7.0, 0), (7.5, 1), (8.0, 1), (12.0, 1), (12.6, 2)):
        clock[0] = now
        assert catalogs.get() is first  # one catalog per thread, refreshed in place
        assert Remote.refreshed == refreshed, now
