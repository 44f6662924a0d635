"""What the STAC API serves besides STAC JSON, in process (Starlette's test client, no server): the lake's files
and nothing outside them, and pixel spectra up to a scene's very edges."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio
from fastapi.testclient import TestClient
from rasterio.transform import from_origin
from shapely.geometry import box

from cubelake.catalog.api import create_app
from cubelake.catalog.serve_files import lake_key
from cubelake.testing.lakes import synthetic_lake

from .conftest import Synth

# a 6-band, 4 x 5 scene in lon/lat (no reprojection between the request and the pixel grid): 0.25 degrees a pixel
WEST, NORTH, RES, ROWS, COLS, BANDS = 10.0, 50.0, 0.25, 4, 5, 6
EAST, SOUTH = WEST + COLS * RES, NORTH - ROWS * RES
NODATA = -9999


def _cube() -> np.ndarray:
    data = np.arange(BANDS * ROWS * COLS, dtype=np.int16).reshape(BANDS, ROWS, COLS)
    data[:, 0, 1] = NODATA
    data[2, 0, 2] = NODATA
    return data


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served") / "lake"
    item = Synth("s1", geometry=box(WEST, SOUTH, EAST, NORTH), datetime="2021-06-01T10:00:00Z",
                 bands_um=[(0.4 + 0.1 * b, 0.01) for b in range(BANDS)]).to_item()
    item["assets"] = {
        "cog": {"href": "./s1.tif", "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                "roles": ["data"], "bands": item["properties"]["bands"]},
        "thumbnail": {"href": "./s1.png", "type": "image/png", "roles": ["thumbnail"]},
    }
    # a float scene whose nodata is a number, with a NaN pixel too, and an asset that lists no bands
    other = Synth("f1", geometry=box(WEST, SOUTH, EAST, NORTH), datetime="2021-06-02T10:00:00Z").to_item()
    other["assets"] = {"data": {"href": "./f1.tif", "type": "image/tiff; application=geotiff", "roles": ["data"],
                                "bands": [{"name": "b1", "eo:center_wavelength": 0.5}]}}
    synthetic_lake(root, [item, other])
    with rasterio.open(root / "scenes" / "f1" / "f1.tif", "w", driver="GTiff", width=COLS, height=ROWS, count=3,
                       dtype="float32", crs="EPSG:4326", transform=from_origin(WEST, NORTH, RES, RES),
                       nodata=-1.0) as dst:
        data = np.full((3, ROWS, COLS), 0.25, dtype="float32")
        data[0, 1, 1], data[1, 1, 1] = np.nan, -1.0
        dst.write(data)
    scene = root / "scenes" / "s1"
    with rasterio.open(scene / "s1.tif", "w", driver="GTiff", width=COLS, height=ROWS, count=BANDS, dtype="int16",
                       crs="EPSG:4326", transform=from_origin(WEST, NORTH, RES, RES), nodata=NODATA) as dst:
        dst.write(_cube())
    (scene / "s1.png").write_bytes(b"\x89PNG not really")
    (scene / "notes.bin").write_bytes(b"\x00\x01")
    (scene / ".hidden").write_text("a hidden file of a scene")
    (scene / ".cache").mkdir()
    (scene / ".cache" / "x.json").write_text("{}")
    outside = root.parent / "secret.txt"
    outside.write_text("outside the lake")
    os.symlink(outside, scene / "leak.tif")  # a symlink that leads out of the lake
    os.symlink(scene / "s1.png", scene / "alias.png")  # one that stays inside
    return root


@pytest.fixture(scope="module")
def client(lake: Path) -> Iterator[TestClient]:
    with TestClient(create_app(lake)) as c:
        yield c


def test_a_scene_file_is_served_whole_and_by_range_with_its_media_type(client: TestClient, lake: Path) -> None:
    cog = (lake / "scenes" / "s1" / "s1.tif").read_bytes()
    r = client.get("/lake/scenes/s1/s1.tif")
    assert r.status_code == 200
    assert r.content == cog
    assert r.headers["content-type"] == "image/tiff; application=geotiff; profile=cloud-optimized"
    part = client.get("/lake/scenes/s1/s1.tif", headers={"Range": "bytes=8-23"})
    assert part.status_code == 206
    assert part.content == cog[8:24]
    head = client.head("/lake/scenes/s1/s1.tif")
    assert head.status_code == 200
    assert int(head.headers["content-length"]) == len(cog)
    for name, media in (("item.json", "application/json"), ("s1.png", "image/png"),
                        ("notes.bin", "application/octet-stream"), ("alias.png", "image/png")):
        r = client.get(f"/lake/scenes/s1/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"].split(";")[0] == media.split(";")[0], name


@pytest.mark.parametrize("path", [
    "scenes/s1/.hidden", "scenes/s1/.cache/x.json",  # hidden segments below a served root
    "scenes/s1/leak.tif",  # a symlink out of the lake
    "lake.json", "catalog.sqlite", ".pending/x", "scenes", "scenes/", "scenes/s1/", "scenes//s1/s1.tif",
    "scenes/%2e%2e/catalog.sqlite", "scenes/s1/%2e%2e/%2e%2e/lake.json", "scenes/s1/nope.tif",
    "scenes/s1", "other/s1/s1.tif",
])
def test_nothing_but_published_files_inside_the_lake_is_served(client: TestClient, path: str) -> None:
    r = client.get("/lake/" + path)
    assert r.status_code == 404, (path, r.status_code)
    assert set(r.json()) == {"code", "description"}
    assert "outside the lake" not in r.text


@pytest.mark.parametrize(("path", "key"), [
    ("scenes/s1/s1.tif", "scenes/s1/s1.tif"), ("collections/c/x.json", "collections/c/x.json"),
    ("scenes/s1/.hidden", None), ("scenes/.s1/a", None), ("scenes", None), ("lake.json", None),
    ("scenes/a\\b", None), ("scenes/a\x00b", None), ("scenes/" + "a" * 1017, "scenes/" + "a" * 1017),
    ("scenes/" + "a" * 1018, None), ("", None), ("scenes//a", None), ("/scenes/a", None),
    ("scenes/./a", None), ("scenes/s1/../../lake.json", None),  # (an HTTP client folds these before sending)
])
def test_lake_keys(path: str, key: str | None) -> None:
    assert lake_key(path) == key


def _spectrum(client: TestClient, lon: float, lat: float) -> tuple[int, dict]:
    r = client.get("/collections/synth/items/s1/spectrum", params={"lon": lon, "lat": lat})
    return r.status_code, r.json()


@pytest.mark.parametrize(("lon", "lat", "row", "col"), [
    (WEST, NORTH, 0, 0),  # the top-left corner belongs to the first pixel
    (EAST - RES / 2, SOUTH + RES / 2, ROWS - 1, COLS - 1),  # the last pixel
    (WEST + 3 * RES, NORTH - 2 * RES, 2, 3),  # a pixel's own corner is that pixel
    (EAST - 1e-9, SOUTH + 1e-9, ROWS - 1, COLS - 1),
])
def test_a_spectrum_is_the_pixels_values(client: TestClient, lon: float, lat: float, row: int, col: int) -> None:
    status, doc = _spectrum(client, lon, lat)
    assert status == 200, doc
    assert (doc["row"], doc["col"]) == (row, col)
    assert doc["values"] == [float(v) for v in _cube()[:, row, col]]
    assert doc["asset"] == "cog"
    assert doc["wavelength_um"] == pytest.approx([0.4 + 0.1 * b for b in range(BANDS)])


def test_nodata_in_a_spectrum_is_null(client: TestClient) -> None:
    status, doc = _spectrum(client, WEST + RES * 1.5, NORTH - RES / 2)  # row 0, col 1: nodata in every band
    assert status == 200
    assert doc["values"] == [None] * BANDS
    status, doc = _spectrum(client, WEST + RES * 2.5, NORTH - RES / 2)  # row 0, col 2: band 3 only
    assert [v is None for v in doc["values"]] == [b == 2 for b in range(BANDS)]


@pytest.mark.parametrize(("lon", "lat"), [
    (EAST, NORTH - RES), (WEST + RES, SOUTH), (EAST, SOUTH),  # exactly on the right or bottom edge: outside
    (WEST - 1e-9, NORTH - RES), (WEST + RES, NORTH + 1e-9), (0.0, 0.0),
])
def test_a_point_on_or_beyond_the_right_or_bottom_edge_is_outside(client: TestClient, lon: float, lat: float) -> None:
    status, doc = _spectrum(client, lon, lat)
    assert status == 404, doc
    assert set(doc) == {"code", "description"}
    assert "is outside item 's1'" in doc["description"]


@pytest.mark.parametrize(("params", "status", "words"), [
    ({"lon": 180.5, "lat": 0}, 400, "WGS84"), ({"lon": 0, "lat": -90.01}, 400, "WGS84"),
    ({"lon": "nan", "lat": 0}, 400, "WGS84"), ({"lon": 0, "lat": "inf"}, 400, "WGS84"),
])
def test_a_spectrum_needs_degrees(client: TestClient, params: dict, status: int, words: str) -> None:
    r = client.get("/collections/synth/items/s1/spectrum", params=params)
    assert r.status_code == status, r.text
    assert words in r.json()["description"]


def test_a_spectrum_of_an_unknown_item_or_collection_is_not_found(client: TestClient) -> None:
    for path in ("/collections/synth/items/nope/spectrum", "/collections/other/items/s1/spectrum"):
        r = client.get(path, params={"lon": WEST, "lat": NORTH})
        assert r.status_code == 404
        assert "no item" in r.json()["description"]


def test_a_float_spectrum_nulls_nan_and_nodata_and_unlisted_bands_have_no_wavelength(client: TestClient) -> None:
    r = client.get("/collections/synth/items/f1/spectrum", params={"lon": WEST + RES * 1.5, "lat": NORTH - RES * 1.5})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (doc["row"], doc["col"], doc["asset"]) == (1, 1, "data")
    assert doc["values"] == [None, None, 0.25]  # NaN, the nodata value, a value
    assert doc["wavelength_um"] == [None, None, None]  # the asset lists 1 band of 3: none is guessed


@pytest.mark.parametrize(("path", "accept", "html"), [
    ("/", "text/html,application/xhtml+xml", True), ("/map", "*/*", True), ("/", "application/json", False),
    ("/?f=json", "text/html", False), ("/conformance", "text/html", False), ("/", "", False),
])
def test_browsers_get_the_map_and_clients_the_landing_page(client: TestClient, path: str, accept: str,
                                                           html: bool) -> None:
    r = client.get(path, headers={"Accept": accept})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html") is html
    if html:
        assert "leaflet" in r.text.lower()
    else:
        doc = r.json()
        assert doc["conformsTo"] if path == "/conformance" else doc["type"] == "Catalog"
    head = client.head("/", headers={"Accept": "text/html"})  # only a GET of / is the map
    assert not head.headers.get("content-type", "").startswith("text/html")
