"""The map view of ``cubelake catalog serve`` in a real browser (Debian's chromium driven by Playwright),
offline: every request that leaves 127.0.0.1 is aborted, so the page can only use what the server ships
(Leaflet vendored under ``catalog/web/vendor/``). The server is the real CLI process over the session lake
of real scenes; what the page shows is checked against what the STAC API answers."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
import pytest
from PIL import Image

from cubelake.testing.lakes import api_server

from .conftest import RealLake

VIEWPORT = {"width": 1280, "height": 800}
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "map-view.png"


@pytest.fixture(scope="module")
def server(real_ingest: RealLake) -> Iterator[str]:
    """The base URL of ``cubelake catalog serve --port 0`` over the session lake; stopped by SIGINT."""
    with api_server(real_ingest.root) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is needed for the map view tests: apt-get install chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser page on the map view with every non-loopback request aborted and recorded."""

    def __init__(self, browser: Any, url: str) -> None:
        self.url = url
        self.page = browser.new_page(viewport=VIEWPORT)
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def open(self) -> None:
        self.page.goto(self.url)  # "/" with the browser's Accept: text/html
        self.page.wait_for_function("document.body.dataset.ready === '1'", timeout=30_000)
        assert self.state("error") is None, self.state("error")

    def state(self, key: str) -> Any:
        return self.page.evaluate(f"window.cubelake[{key!r}]")

    def screen_xy(self, lon: float, lat: float) -> tuple[float, float]:
        """The page coordinates (px) of a lon/lat, as the map projects it now."""
        x, y = self.page.evaluate(
            """([lon, lat]) => { const m = window.cubelake.map, r = m.getContainer().getBoundingClientRect();
                const p = m.latLngToContainerPoint([lat, lon]); return [p.x + r.left, p.y + r.top]; }""",
            [lon, lat])
        return float(x), float(y)

    def fit(self, west: float, south: float, east: float, north: float) -> None:
        self.page.evaluate("([w, s, e, n]) => window.cubelake.map.fitBounds([[s, w], [n, e]], {animate: false})",
                           [west, south, east, north])
        self.page.wait_for_timeout(100)

    def drag(self, a: tuple[float, float], b: tuple[float, float], shift: bool = False) -> None:
        mouse = self.page.mouse
        if shift:
            self.page.keyboard.down("Shift")
        mouse.move(*a)
        mouse.down()
        mouse.move((a[0] + b[0]) / 2, (a[1] + b[1]) / 2, steps=4)
        mouse.move(*b, steps=4)
        mouse.up()
        if shift:
            self.page.keyboard.up("Shift")

    def search_done(self, after: int) -> None:
        self.page.wait_for_function(f"window.cubelake.searches > {after} && !window.cubelake.searching",
                                    timeout=30_000)
        assert self.state("error") is None, self.state("error")

    def listed(self) -> list[str]:
        ids: list[str] = self.page.locator("#results li").evaluate_all("els => els.map(e => e.dataset.id)")
        return ids


@pytest.fixture
def view(browser: Any, server: str) -> Iterator[Page]:
    page = Page(browser, server)
    try:
        yield page
        assert page.errors == [], page.errors
        assert page.blocked == [], f"the page asked for something beyond this server: {page.blocked}"
    finally:
        page.page.close()


@pytest.fixture(scope="module")
def everything(server: str) -> list[dict[str, Any]]:
    """Every item the API serves."""
    return api_search(server, {})


def api_search(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every item of a POST /search, paging through its ``next`` links."""
    out: list[dict[str, Any]] = []
    req: dict[str, Any] | None = {"href": url + "search", "body": {"limit": 100, **body}}
    while req is not None:
        r = httpx.post(req["href"], json=req["body"], timeout=30)
        assert r.status_code == 200, r.text
        page = r.json()
        out += page["features"]
        nxt = [lk for lk in page["links"] if lk["rel"] == "next"]
        req = {"href": nxt[0]["href"], "body": nxt[0]["body"]} if nxt else None
    return out


def ids_of(items: list[dict[str, Any]]) -> list[str]:
    return sorted(i["id"] for i in items)


def union_bbox(items: list[dict[str, Any]]) -> tuple[float, float, float, float]:
    bbs = np.array([i["bbox"][:4] for i in items])
    return float(bbs[:, 0].min()), float(bbs[:, 1].min()), float(bbs[:, 2].max()), float(bbs[:, 3].max())


def footprint_paths(view: Page) -> int:
    n: int = view.page.locator(".leaflet-overlay-pane path").count()
    return n


def test_footprints_offline_and_screenshot(view: Page, everything: list[dict[str, Any]], real_ingest: RealLake,
                                           tmp_path: Path) -> None:
    assert ids_of(everything) == real_ingest.all_ids
    located = [i for i in everything if i.get("geometry")]
    assert 0 < len(located) < len(everything)  # the lake has scenes without a footprint (samson, a pixel grid)

    view.open()
    assert footprint_paths(view) == len(located)
    assert view.state("footprints") == len(located)
    assert view.state("items") == len(everything)
    assert sorted(view.listed()) == ids_of(everything)  # before any search, the list is the catalog
    assert view.page.locator("#count").inner_text() == f"({len(everything)})"
    legend = view.page.locator(".legend").inner_text()
    for coll in {i["collection"] for i in everything}:
        assert coll in legend
    # Leaflet came from this server, not a CDN
    assert view.page.evaluate("typeof L === 'object' && L.version") == "1.9.4"
    assert any(u.endswith("/static/vendor/leaflet/leaflet.js") for u in view.requests)
    # the map was fitted to the footprints: each one's centre is inside the viewport
    for item in located:
        w, s, e, n = item["bbox"][:4]
        x, y = view.screen_xy((w + e) / 2, (s + n) / 2)
        box = view.page.locator("#map").bounding_box()
        assert box["x"] <= x <= box["x"] + box["width"], item["id"]
        assert box["y"] <= y <= box["y"] + box["height"], item["id"]

    shot = tmp_path / "map.png"
    view.page.screenshot(path=str(shot))
    with Image.open(shot) as img:
        assert img.format == "PNG"
        assert img.size == (VIEWPORT["width"], VIEWPORT["height"])
        pixels = np.asarray(img.convert("RGB"), dtype=np.float64)
    assert pixels.var() > 0
    # the map itself is not blank either: footprints and grid lines differ from its background
    box = view.page.locator("#map").bounding_box()
    inner = pixels[int(box["y"]):int(box["y"] + box["height"]), int(box["x"]):int(box["x"] + box["width"])]
    assert len(np.unique(inner.reshape(-1, 3), axis=0)) > 10
    if os.environ.get("CUBELAKE_TEST_ARTEFACTS"):
        dst = Path(os.environ["CUBELAKE_TEST_ARTEFACTS"])
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, dst / "map-view.png")


def test_box_time_and_wavelength_search(view: Page, server: str, everything: list[dict[str, Any]],
                                        real_ingest: RealLake) -> None:
    enmap = sorted(real_ingest.ids["enmap"])
    tiles = [i for i in everything if i["id"] in enmap]
    w, s, e, n = union_bbox(tiles)
    view.open()
    view.fit(w - 0.05, s - 0.05, e + 0.05, n + 0.05)

    # 1. the "Draw a box" button, then a drag with real mouse events, a margin around the Potsdam tiles
    box = (w - 0.01, s - 0.005, e + 0.01, n + 0.005)
    searches = view.state("searches")
    view.page.click("#draw")
    view.drag(view.screen_xy(box[0], box[3]), view.screen_xy(box[2], box[1]))
    view.search_done(searches)
    sent = view.state("lastSearch")
    assert set(sent) == {"bbox"}
    assert np.allclose(sent["bbox"], box, atol=5e-4), (sent["bbox"], box)  # a pixel is ~1e-4 degrees here
    want = ids_of(api_search(server, {"bbox": list(box)}))
    assert want == enmap
    assert sorted(view.state("results")) == want
    assert sorted(view.listed()) == want
    assert view.page.locator("#count").inner_text() == f"({len(want)})"
    # the results are highlighted: drawn opaque, the footprints outside the box faded
    opacity = dict(view.page.locator(".leaflet-overlay-pane path").evaluate_all(
        "els => els.map(e => [e.dataset.id, +e.getAttribute('stroke-opacity')])"))
    assert set(opacity) == {i["id"] for i in everything if i.get("geometry")}
    assert {opacity[i] for i in want} == {0.95}
    assert {o for i, o in opacity.items() if i not in want} == {0.35}
    assert view.page.locator("#draw").get_attribute("aria-pressed") == "false"  # one box per press

    # 2. shift-drag without the button: a box over the western half of the tiles
    mid = (w + e) / 2
    half = (w - 0.01, s - 0.005, mid - 0.001, n + 0.005)
    searches = view.state("searches")
    view.drag(view.screen_xy(half[0], half[3]), view.screen_xy(half[2], half[1]), shift=True)
    view.search_done(searches)
    want_half = ids_of(api_search(server, {"bbox": list(half)}))
    assert 0 < len(want_half) < len(enmap)
    assert sorted(view.listed()) == want_half

    # 3. a time range that excludes the tiles' acquisition day (2022-07-24), then one that includes it
    searches = view.state("searches")
    view.page.click("#clear-box")
    view.search_done(searches)
    assert sorted(view.listed()) == ids_of(everything)
    for start, end in (("2022-07-25", ""), ("2022-07-01", "2022-07-31")):
        view.page.fill("#dt-start", start)
        view.page.fill("#dt-end", end)
        searches = view.state("searches")
        view.page.click("#run-search")
        view.search_done(searches)
        dt = f"{start}T00:00:00Z/{end + 'T23:59:59Z' if end else '..'}"
        assert view.state("lastSearch") == {"datetime": dt}
        want = ids_of(api_search(server, {"datetime": dt}))
        assert sorted(view.listed()) == want
        assert (set(enmap) <= set(want)) == bool(end), (start, end, want)

    # 4. a wavelength range only the imaging spectrometers cover: the single-band Landsat scenes drop out
    view.page.fill("#dt-start", "")
    view.page.fill("#dt-end", "")
    view.page.fill("#wl-min", "450")
    view.page.fill("#wl-max", "1300")
    searches = view.state("searches")
    view.page.click("#run-search")
    view.search_done(searches)
    flt = {"filter-lang": "cql2-json", "filter": {"op": "cubelake:covers_wavelength", "args": [450, 1300]}}
    want = ids_of(api_search(server, flt))
    assert set(enmap) <= set(want)
    assert not set(real_ingest.ids["landsat"]) & set(want)
    assert len(want) < len(everything)
    assert sorted(view.listed()) == want
    assert view.page.locator("#count").inner_text() == f"({len(want)})"
    # the footprints stay drawn (the others dimmed): the count of paths does not change
    assert footprint_paths(view) == sum(1 for i in everything if i.get("geometry"))


def _cog_bands(item: dict[str, Any]) -> list[dict[str, Any]]:
    for asset in item["assets"].values():
        if "cloud-optimized" in asset.get("roles", []):
            bands: list[dict[str, Any]] = asset.get("bands", [])
            return bands
    raise AssertionError(f"{item['id']} has no COG asset")


def test_click_footprint_shows_properties_and_spectra(view: Page, everything: list[dict[str, Any]],
                                                      real_ingest: RealLake) -> None:
    tile_id = sorted(real_ingest.ids["enmap"])[0]
    item = next(i for i in everything if i["id"] == tile_id)
    with_mean = [b for b in _cog_bands(item) if isinstance((b.get("statistics") or {}).get("mean"), float)]
    assert len(with_mean) > 100
    w, s, e, n = item["bbox"][:4]
    view.open()
    view.fit(w - 0.01, s - 0.01, e + 0.01, n + 0.01)
    lon, lat = w + 0.4 * (e - w), s + 0.5 * (n - s)
    view.page.mouse.click(*view.screen_xy(lon, lat))
    view.page.wait_for_function(f"window.cubelake.selected === {tile_id!r}", timeout=10_000)

    panel = view.page.locator("#panel")
    assert panel.is_visible()
    assert view.page.locator("#p-id").inner_text() == tile_id
    assert view.page.locator("#p-collection").inner_text() == item["collection"]
    props = dict(zip(view.page.locator("#p-props dt").all_inner_texts(),
                     view.page.locator("#p-props dd").all_inner_texts(), strict=True))
    assert props["datetime"] == item["properties"]["datetime"]
    assert props["platform"] == item["properties"]["platform"]
    assert props["proj:code"] == item["properties"]["proj:code"]
    assert props["bands"] == str(len(_cog_bands(item)))
    assert props["gsd"] == f"{item['properties']['gsd']:g} m"

    # the scene mean: one vertex per band with statistics, x the wavelength in nm
    mean = view.page.locator("#p-plot svg path.series.mean")
    assert mean.count() == 1
    vertices = re.findall(r"[ML]\s*[-\d.]+,[-\d.]+", mean.get_attribute("d") or "")
    assert len(vertices) == len(with_mean)
    assert "wavelength (nm)" in (view.page.locator("#p-plot svg").text_content() or "")

    # the thumbnail, when the item has one (and it loads), else no image
    thumb = item["assets"].get("thumbnail") or next(
        (a for a in item["assets"].values() if "thumbnail" in a.get("roles", [])), None)
    if thumb is not None:
        view.page.wait_for_function("document.querySelector('#p-thumb img').complete")
        assert view.page.locator("#p-thumb img").get_attribute("src") == thumb["href"]
        assert view.page.evaluate("document.querySelector('#p-thumb img').naturalWidth") > 0
        assert view.page.locator("#p-thumb").is_visible()
    else:
        assert not view.page.locator("#p-thumb").is_visible()

    # the click also asked for that pixel's spectrum, at the clicked point, and marked it on the map
    view.page.wait_for_function("window.cubelake.spectrum.pixel && !window.cubelake.spectrum.pixel.loading",
                                timeout=15_000)
    asked = [u for u in view.requests if f"/items/{tile_id}/spectrum?" in u]
    assert len(asked) == 1, asked
    q = parse_qs(urlsplit(asked[0]).query)
    assert float(q["lon"][0]) == pytest.approx(lon, abs=5e-4)
    assert float(q["lat"][0]) == pytest.approx(lat, abs=5e-4)
    assert view.page.locator(".leaflet-pixel-pane path").count() == 1
    # and plotted it: one vertex per valid value the endpoint returns
    assert view.page.evaluate("window.cubelake.spectrum.pixel.error") is None
    d = view.page.locator("#p-plot svg path.series.pixel").get_attribute("d") or ""
    valid = sum(v is not None for v in httpx.get(asked[0]).json()["values"])
    assert valid > 100
    assert len(re.findall(r"[ML]\s*[-\d.]+,[-\d.]+", d)) == valid

    # a scene without a footprint is still listed, and selecting it from the list opens its panel
    samson = real_ingest.ids["samson"][0]
    view.page.locator(f'#results li[data-id="{samson}"]').click()
    view.page.wait_for_function(f"window.cubelake.selected === {samson!r}")
    assert view.page.locator("#p-id").inner_text() == samson
    props = dict(zip(view.page.locator("#p-props dt").all_inner_texts(),
                     view.page.locator("#p-props dd").all_inner_texts(), strict=True))
    assert props["footprint"] == "none"


def test_docs_screenshot(view: Page, everything: list[dict[str, Any]], real_ingest: RealLake) -> None:
    """The README's picture (written only with CUBELAKE_UPDATE_DOCS=1): a box search over Potsdam."""
    enmap = sorted(real_ingest.ids["enmap"])
    tiles = [i for i in everything if i["id"] in enmap]
    w, s, e, n = union_bbox(tiles)
    view.open()
    view.fit(w - 0.03, s - 0.02, e + 0.03, n + 0.02)
    searches = view.state("searches")
    view.page.fill("#wl-min", "450")
    view.page.fill("#wl-max", "1300")
    view.drag(view.screen_xy(w - 0.005, n + 0.003), view.screen_xy(e + 0.005, s - 0.003), shift=True)
    view.search_done(searches)
    assert sorted(view.listed()) == enmap
    view.page.locator(f'#results li[data-id="{enmap[0]}"]').click()
    assert view.page.locator("#p-plot svg path.series.mean").count() == 1
    view.fit(w - 0.012, s - 0.004, e + 0.012, n + 0.004)  # the panel took the map's right side
    view.page.mouse.move(0, 0)  # no tooltip in the picture
    if os.environ.get("CUBELAKE_UPDATE_DOCS") == "1":
        DOCS_SHOT.parent.mkdir(exist_ok=True)
        view.page.screenshot(path=str(DOCS_SHOT))
        assert DOCS_SHOT.stat().st_size < 300_000
