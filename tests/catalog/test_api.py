"""The STAC API (``cubelake catalog serve``) against the real client: pystac-client finds exactly what
``cubelake catalog search`` finds, pages through hundreds of items, filters with CQL2, and every bad
request is a STAC error object (400/404), never a 500 or a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pystac_client import Client
from shapely.geometry import box

from cubelake.testing.lakes import api_server, synthetic_lake

from ..conftest import run_cli
from .conftest import Synth

POTSDAM = (12.9, 52.3, 13.2, 52.5)


@pytest.fixture(scope="module")
def api(real_lake: Path) -> Iterator[str]:
    with api_server(real_lake) as url:
        yield url


def cli_ids(lake: Path, *args: str) -> list[str]:
    res = run_cli("catalog", "search", "--lake", str(lake), "--format", "summary", *args)
    assert res.returncode == 0, res.stderr
    return [h["id"] for h in json.loads(res.stdout)]


def client_ids(url: str, **search: Any) -> list[str]:
    return [i.id for i in Client.open(url).search(**search).items()]


# the same query, as pystac-client's search() keywords and as the CLI's options
PARITY = [
    ({}, []),
    ({"bbox": POTSDAM}, ["--bbox", "12.9,52.3,13.2,52.5"]),
    ({"datetime": "2022-06-01/2022-08-31"}, ["--datetime", "2022-06-01/2022-08-31"]),
    ({"bbox": POTSDAM, "datetime": "2022-06-01T00:00:00Z/.."}, ["--bbox", "12.9,52.3,13.2,52.5", "--datetime", "2022-06-01/.."]),
    ({"collections": ["landsat8-oli"]}, ["--collection", "landsat8-oli"]),
    ({"filter": "eo:cloud_cover < 10"}, ["--filter", "eo:cloud_cover < 10"]),
    ({"filter": "eo:cloud_cover BETWEEN 0.01 AND 0.5 OR platform = 'landsat-5'"},
     ["--filter", "eo:cloud_cover BETWEEN 0.01 AND 0.5 OR platform = 'landsat-5'"]),
    ({"filter": "cubelake:covers_wavelength(450, 1300) AND collection <> 'generic'"},
     ["--filter", "cubelake:covers_wavelength(450, 1300) AND collection <> 'generic'"]),
    ({"filter": "S_INTERSECTS(geometry, BBOX(12.9, 52.3, 13.2, 52.5)) AND T_AFTER(datetime, TIMESTAMP('2020-01-01T00:00:00Z'))"},
     ["--filter", "S_INTERSECTS(geometry, BBOX(12.9, 52.3, 13.2, 52.5)) AND T_AFTER(datetime, TIMESTAMP('2020-01-01T00:00:00Z'))"]),
    ({"filter": "id LIKE 'enmap%' AND NOT (id LIKE '%_0')"}, ["--filter", "id LIKE 'enmap%' AND NOT (id LIKE '%_0')"]),
    ({"sortby": "-datetime"}, ["--sort", "-datetime"]),
]


@pytest.mark.parametrize(("search", "cli"), PARITY, ids=[str(i) for i in range(len(PARITY))])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_pystac_client_finds_what_the_cli_finds(api: str, real_lake: Path, search: dict[str, Any], cli: list[str],
                                                method: str) -> None:
    want = cli_ids(real_lake, *cli)
    got = client_ids(api, method=method, limit=3, **search)  # limit 3: several pages for the larger answers
    assert got == want
    if cli and "--sort" not in cli:  # the query narrowed the answer (not a vacuous comparison)
        assert 0 < len(want) < len(cli_ids(real_lake))


def test_paging_links_cover_hundreds_of_items_once(tmp_path: Path) -> None:
    items = [Synth(f"s{n:04d}", geometry=box(n % 30, n // 30, n % 30 + 0.5, n // 30 + 0.5),
                   datetime=f"2021-{1 + n % 12:02d}-{1 + n % 28:02d}T10:00:00Z",
                   properties={"eo:cloud_cover": n % 101}).to_item() for n in range(260)]
    lake = synthetic_lake(tmp_path / "lake", items)
    with api_server(lake) as url:
        client = Client.open(url)
        for method in ("GET", "POST"):
            search = client.search(method=method, limit=25)
            pages = list(search.pages())
            ids = [i.id for p in pages for i in p.items]
            assert len(pages) == 11
            assert [len(p.items) for p in pages][-1] == 10
            assert sorted(ids) == sorted(i["id"] for i in items)
            assert len(set(ids)) == 260
            cloudy = [i.id for i in client.search(method=method, limit=7, filter="eo:cloud_cover >= 90",
                                                  sortby="-eo:cloud_cover").items()]
            assert cloudy == cli_ids(lake, "--filter", "eo:cloud_cover >= 90", "--sort", "-eo:cloud_cover")
            assert len(cloudy) == sum(1 for n in range(260) if n % 101 >= 90)
        # the page after the last one is empty, and a forged token is a 400
        last = httpx.get(url + "search", params={"limit": 300}).json()
        assert last["numberReturned"] == 260
        assert not [lk for lk in last["links"] if lk["rel"] == "next"]


def test_landing_conformance_collections_and_items(api: str, real_lake: Path) -> None:
    landing = httpx.get(api).json()
    assert landing["type"] == "Catalog"
    assert landing["stac_version"] == "1.1.0"
    conf = set(httpx.get(api + "conformance").json()["conformsTo"])
    for c in ("https://api.stacspec.org/v1.0.0/item-search", "http://www.opengis.net/spec/cql2/1.0/conf/cql2-text",
              "http://www.opengis.net/spec/cql2/1.0/conf/cql2-json"):
        assert c in conf
    colls = {c["id"]: c for c in httpx.get(api + "collections").json()["collections"]}
    assert set(colls) == set(json.loads(run_cli("catalog", "stats", "--lake", str(real_lake), "--format", "json").stdout)
                             ["collections"])
    enmap = httpx.get(api + "collections/enmap-l2a/items", params={"limit": 100}).json()
    assert sorted(f["id"] for f in enmap["features"]) == sorted(cli_ids(real_lake, "--collection", "enmap-l2a"))
    one = enmap["features"][0]
    got = httpx.get(f"{api}collections/enmap-l2a/items/{one['id']}").json()
    assert got["id"] == one["id"]
    assert {lk["rel"] for lk in got["links"]} >= {"self", "parent", "collection", "root"}
    q = httpx.get(api + "queryables").json()
    assert q["properties"]["eo:cloud_cover"]["type"] == "number"
    assert "cubelake:covers_wavelength" in q["description"]


def test_asset_hrefs_resolve_over_the_api_with_byte_ranges(api: str, real_lake: Path) -> None:
    item = httpx.get(api + "collections/enmap-l2a/items", params={"limit": 1}).json()["features"][0]
    assert not [a for a in item["assets"].values() if not a["href"].startswith(api)]  # the source is not served
    cog = next(a for a in item["assets"].values() if a["type"].startswith("image/tiff") and "data" in a["roles"])
    assert cog["href"].startswith(api + "lake/scenes/")
    local = real_lake / cog["href"].removeprefix(api + "lake/")
    whole = httpx.get(cog["href"])
    assert whole.status_code == 200
    assert whole.content == local.read_bytes()
    part = httpx.get(cog["href"], headers={"Range": "bytes=100-199"})
    assert part.status_code == 206
    assert part.content == local.read_bytes()[100:200]
    import rasterio

    with rasterio.open(cog["href"]) as remote, rasterio.open(local) as here:  # GDAL through /vsicurl/
        assert (remote.read(1) == here.read(1)).all()
    for bad in ("lake/../lake.json", "lake/catalog.sqlite", "lake/scenes/../catalog.sqlite", "lake/.pending/x",
                "lake/scenes/%2e%2e/catalog.sqlite", "lake/lake.json"):
        r = httpx.get(api + bad)
        assert r.status_code == 404, bad
        assert set(r.json()) == {"code", "description"}, bad


BAD_REQUESTS = [
    ("GET", "search?bbox=1,2,3", 400, "bbox"),
    ("GET", "search?bbox=10,60,20,50", 400, "south"),
    ("GET", "search?bbox=a,b,c,d", 400, "bbox"),
    ("GET", "search?datetime=2022-13-45", 400, "datetime"),
    ("GET", "search?datetime=../..", 400, "datetime"),
    ("GET", "search?filter=eo:cloud_cover <", 400, "CQL2"),
    ("GET", "search?filter=nosuch:prop = 3", 400, "unknown property"),
    ("GET", "search?filter=eo:cloud_cover = 'x'", 400, "number"),
    ("GET", "search?filter=" + "(" * 200 + "a=1" + ")" * 200, 400, "nested"),
    ("GET", "search?limit=0", 400, "limit"),
    ("GET", "search?limit=-5", 400, "limit"),
    ("GET", "search?limit=abc", 400, "limit"),
    ("GET", "search?token=forged", 400, "token"),
    ("GET", "search?intersects={not json", 400, "intersects"),
    ("GET", "search?sortby=-nosuch", 400, "unknown property"),
    ("POST", "search", 400, "filter"),
    ("GET", "collections/nope", 404, "nope"),
    ("GET", "collections/nope/items", 404, "nope"),
    ("GET", "collections/enmap-l2a/items/nope", 404, "nope"),
    ("GET", "nope", 404, ""),
]


@pytest.mark.parametrize(("method", "path", "status", "words"), BAD_REQUESTS, ids=[b[1][:40] for b in BAD_REQUESTS])
def test_bad_requests_are_stac_errors(api: str, method: str, path: str, status: int, words: str) -> None:
    body = {"filter": {"op": "frobnicate", "args": []}} if method == "POST" else None
    r = httpx.request(method, api + path, json=body)
    assert r.status_code == status, r.text
    doc = r.json()
    assert set(doc) == {"code", "description"}, doc
    assert words.lower() in doc["description"].lower(), doc
    assert "Traceback" not in r.text


def test_huge_limits_are_served_as_the_maximum(api: str) -> None:
    r = httpx.get(api + "search", params={"limit": 10**12})
    assert r.status_code == 200
    assert r.json()["numberReturned"] == len(httpx.get(api + "search?limit=10000").json()["features"])


def test_post_search_with_cql2_json_and_intersects(api: str, real_lake: Path) -> None:
    body = {"intersects": box(*POTSDAM).__geo_interface__, "limit": 100,
            "filter-lang": "cql2-json", "filter": {"op": "t_intersects", "args": [
                {"property": "datetime"}, {"interval": ["2022-07-01T00:00:00Z", "2022-07-31T23:59:59Z"]}]}}
    r = httpx.post(api + "search", json=body)
    assert r.status_code == 200, r.text
    got = [f["id"] for f in r.json()["features"]]
    assert got == cli_ids(real_lake, "--bbox", "12.9,52.3,13.2,52.5", "--filter",
                          "T_INTERSECTS(datetime, INTERVAL('2022-07-01T00:00:00Z', '2022-07-31T23:59:59Z'))")
    assert got  # the EnMAP tiles


@pytest.mark.timeout(300)  # a load test: a thousand requests (~8 s alone)
def test_the_server_survives_a_thousand_concurrent_malformed_requests(real_lake: Path) -> None:
    import asyncio

    bad = [("GET", "search?bbox=1,2,x,4", None), ("GET", "search?datetime=yesterday", None),
           ("GET", "search?filter=((((", None), ("POST", "search", {"bbox": [1, 2]}),
           ("POST", "search", {"filter": {"op": "and", "args": "x"}}), ("POST", "search", b"{not json"),
           ("GET", "collections/x/items/y", None), ("GET", "search?limit=-1", None),
           ("GET", "search?filter=" + "NOT " * 5000 + "a = 1", None), ("POST", "search", {"intersects": {"type": "Nope"}})]

    async def one(host: str, port: int, method: str, target: bytes, body: bytes | None) -> int:
        """One request on its own connection (``Connection: close``), raw: httpx's async pool spent 36 s of CPU
        on 1,000 requests over 200 connections, the server under 4 s."""
        reader, writer = await asyncio.open_connection(host, port)
        head = [f"{method} ".encode() + target + b" HTTP/1.1", f"Host: {host}:{port}".encode(), b"Connection: close"]
        if body is not None:
            head += [b"Content-Type: application/json", f"Content-Length: {len(body)}".encode()]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + (body or b""))
        answer = await reader.read()  # to the end: the server closes the connection after its answer
        writer.close()
        status_line, _, rest = answer.partition(b"\r\n")
        headers, _, payload = rest.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in headers.lower(), headers
        assert set(json.loads(payload)) == {"code", "description"}, payload
        return int(status_line.split()[1])

    async def hammer(url: str) -> list[int]:
        base = httpx.URL(url)
        gate = asyncio.Semaphore(200)  # 200 connections open at a time

        async def limited(n: int) -> int:
            method, path, body = bad[n % len(bad)]
            data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
            async with gate:  # each answer within 60 s of being sent
                return await asyncio.wait_for(one(base.host, base.port or 80, method, base.join(path).raw_path,
                                                  data), 60)
        return await asyncio.gather(*(limited(n) for n in range(1000)))

    with api_server(real_lake) as url:
        codes = asyncio.run(hammer(url))
        assert len(codes) == 1000
        assert set(codes) <= {400, 404}
        assert codes.count(404) == 100
        ok = httpx.get(url + "search", params={"bbox": "12.9,52.3,13.2,52.5"})
        assert ok.status_code == 200
        assert ok.json()["numberReturned"] == len(cli_ids(real_lake, "--bbox", "12.9,52.3,13.2,52.5"))


def test_a_lake_on_s3_is_served_with_presigned_asset_hrefs(real_lake: Path, s3_server: Any, s3_bucket: str,
                                                            tmp_path: Path) -> None:
    env = s3_server.env(tmp_path)
    url = f"s3://{s3_bucket}/lake"
    res = run_cli("lake", "copy", str(real_lake), url, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    with api_server(url, env=env) as api:
        for search, cli in PARITY[1:3] + PARITY[5:6]:
            got = client_ids(api, limit=2, **search)
            want = run_cli("catalog", "search", "--lake", url, "--format", "summary", *cli, env=env)
            assert got == [h["id"] for h in json.loads(want.stdout)] == cli_ids(real_lake, *cli)
        item = httpx.get(api + "collections/enmap-l2a/items", params={"limit": 1}).json()["features"][0]
        href = item["assets"]["cog"]["href"]
        assert href.startswith(api + "lake/scenes/")
        r = httpx.get(href)
        assert r.status_code == 307
        assert r.headers["location"].startswith(s3_server.endpoint + f"/{s3_bucket}/lake/scenes/")
        assert "X-Amz-Signature=" in r.headers["location"]
        local = real_lake / "scenes" / item["id"] / href.rsplit("/", 1)[1]  # an object lake versions its products
        assert httpx.get(href, follow_redirects=True).content == local.read_bytes()


def test_pixel_spectra_are_the_cogs_values(api: str, real_lake: Path) -> None:
    import rasterio
    from rasterio.warp import transform

    item = httpx.get(api + "collections/enmap-l2a/items", params={"limit": 1}).json()["features"][0]
    cog = real_lake / item["assets"]["cog"]["href"].removeprefix(api + "lake/")
    with rasterio.open(cog) as src:
        x, y = src.xy(5, 7)
        (lon,), (lat,) = transform(src.crs, "EPSG:4326", [x], [y])
        want = src.read(window=((5, 6), (7, 8)))[:, 0, 0]
    url = f"{api}collections/enmap-l2a/items/{item['id']}/spectrum"
    got = httpx.get(url, params={"lon": lon, "lat": lat}).json()
    assert (got["row"], got["col"]) == (5, 7)
    assert got["values"] == [float(v) for v in want]
    assert len(got["wavelength_um"]) == len(want)
    assert got["wavelength_um"][0] == item["assets"]["cog"]["bands"][0]["eo:center_wavelength"]
    for params, status in (({"lon": 0, "lat": 0}, 404), ({"lon": 500, "lat": 0}, 400), ({"lon": "x", "lat": 0}, 400)):
        r = httpx.get(url, params=params)
        assert r.status_code == status, r.text
        assert set(r.json()) == {"code", "description"}
    assert httpx.get(f"{api}collections/enmap-l2a/items/nope/spectrum", params={"lon": 0, "lat": 0}).status_code == 404


def test_collection_queryables(api: str) -> None:
    q = httpx.get(api + "collections/landsat8-oli/queryables").json()
    assert q["$id"].endswith("collections/landsat8-oli/queryables")
    assert q["properties"]["eo:cloud_cover"]["type"] == "number"
    assert httpx.get(api + "collections/nope/queryables").status_code == 404


def test_serve_refuses_what_it_cannot_serve(tmp_path: Path, api: str, real_lake: Path) -> None:
    res = run_cli("catalog", "serve", "--lake", str(tmp_path / "nolake"), "--port", "0")
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert str(tmp_path / "nolake") in res.stderr
    taken = api.rsplit(":", 1)[1].strip("/")  # the module's server holds this port
    res = run_cli("catalog", "serve", "--lake", str(real_lake), "--port", taken)
    assert res.returncode == 1
    assert f"cannot listen on 127.0.0.1:{taken}" in res.stderr
    assert "--port" in res.stderr
    assert "Traceback" not in res.stderr
