// The map view of `cubelake catalog serve`: the catalog's footprints on a map, a search by box, time and
// wavelength range (POST /search), and an item's properties, thumbnail and spectra on click.
// Plain Leaflet (vendored, catalog/web/vendor.py) and plain SVG: no other library, no network beyond this API.
// State for tests and scripts: window.cubelake; document.body.dataset.ready = "1" once the catalog is drawn.
(function () {
  "use strict";

  const ROOT = new URL("./", window.location.href);  // the API's root, whether the page is "/" or "/map"
  const PAGE = 500;          // items per /search page
  const MAX_ITEMS = 5000;    // footprints drawn at most (the rest are counted, not drawn)
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                   "#bcbd22", "#7f7f7f"];
  const $ = (id) => document.getElementById(id);

  const state = window.cubelake = {
    loaded: false, error: null, footprints: 0, items: 0, truncated: false, collections: [],
    lastSearch: null, results: null, searching: false, searches: 0, selected: null, spectrum: null, map: null,
  };
  const items = new Map();     // id -> STAC item
  const layers = new Map();    // id -> Leaflet layer of its footprint
  const colours = new Map();   // collection id -> colour
  let box = null;              // the drawn search box: L.Rectangle
  let pixelMarker = null;

  // -- the API ------------------------------------------------------------------------------------------
  async function api(path, options) {
    const res = await fetch(new URL(path, ROOT), options);
    let body = null;
    try { body = await res.json(); } catch (e) { body = null; }
    if (!res.ok) {
      const why = body && body.description ? body.description : res.statusText;
      const err = new Error(`${res.status} ${why}`);
      err.status = res.status;
      throw err;
    }
    return body;
  }

  // every item of a POST /search, following its "next" links, up to `max` items
  async function searchAll(body, max) {
    const out = [];
    let req = { href: "search", body: Object.assign({ limit: PAGE }, body) };
    let more = false;
    while (req) {
      const page = await api(req.href, {
        method: "POST", headers: { "Content-Type": "application/json", Accept: "application/geo+json" },
        body: JSON.stringify(req.body),
      });
      out.push(...(page.features || []));
      const next = (page.links || []).find((l) => l.rel === "next");
      more = !!next;
      if (!next || out.length >= max) break;
      req = { href: next.href, body: next.body || Object.assign({}, req.body, { token: next.token }) };
    }
    return { features: out.slice(0, max), truncated: more || out.length > max };
  }

  function setStatus(text, isError) {
    $("status").textContent = text;
    $("status").classList.toggle("error", !!isError);
  }

  // -- the map ------------------------------------------------------------------------------------------
  const map = state.map = L.map("map", { boxZoom: false, worldCopyJump: false, zoomSnap: 0.25, minZoom: 1 })
    .setView([20, 0], 2);
  // panes of their own, so that `.leaflet-overlay-pane path` are the footprints and nothing else
  for (const [name, z] of [["grid", 250], ["gridlabels", 260], ["dots", 420], ["box", 450], ["pixel", 460]]) {
    map.createPane(name).style.zIndex = z;
  }
  map.getPane("grid").style.pointerEvents = "none";
  map.getPane("gridlabels").style.pointerEvents = "none";
  map.getPane("box").style.pointerEvents = "none";
  const gridRenderer = L.svg({ pane: "grid" });
  const boxRenderer = L.svg({ pane: "box" });
  const dotRenderer = L.svg({ pane: "dots" });
  L.control.scale({ imperial: false, position: "bottomleft" }).addTo(map);
  map.attributionControl.setPrefix('<a href="https://leafletjs.com">Leaflet</a>');
  map.attributionControl.addAttribution("no base map: footprints on a lat/lon grid");

  // a lat/lon graticule instead of a base map (there are no tiles offline)
  const grid = L.layerGroup().addTo(map);
  function niceStep(span) {
    const steps = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 45, 90];
    return steps.find((s) => span / s <= 8) || 90;
  }
  function fmt(v, step, pos, neg) {
    const d = Math.max(0, Math.ceil(-Math.log10(step)));
    return `${Math.abs(v).toFixed(d)}°${v > 0 ? pos : v < 0 ? neg : ""}`;
  }
  function drawGrid() {
    grid.clearLayers();
    const b = map.getBounds();
    const s = Math.max(b.getSouth(), -85), n = Math.min(b.getNorth(), 85);
    const w = Math.max(b.getWest(), -180), e = Math.min(b.getEast(), 180);
    if (!(n > s && e > w)) return;
    const step = niceStep(Math.max(n - s, (e - w) / 2));
    const style = { renderer: gridRenderer, pane: "grid", color: "#b9c6d2", weight: 1, interactive: false };
    for (let lon = Math.ceil(w / step) * step; lon <= e; lon += step) {
      grid.addLayer(L.polyline([[s, lon], [n, lon]], style));
      grid.addLayer(L.marker([n, lon], { pane: "gridlabels", interactive: false, keyboard: false,
        icon: L.divIcon({ className: "grid-label", html: fmt(lon, step, "E", "W"), iconSize: null, iconAnchor: [-3, -4] }) }));
    }
    for (let lat = Math.ceil(s / step) * step; lat <= n; lat += step) {
      grid.addLayer(L.polyline([[lat, w], [lat, e]], style));
      grid.addLayer(L.marker([lat, w], { pane: "gridlabels", interactive: false, keyboard: false,
        icon: L.divIcon({ className: "grid-label", html: fmt(lat, step, "N", "S"), iconSize: null, iconAnchor: [-4, 13] }) }));
    }
  }
  map.on("moveend zoomend resize", drawGrid);
  drawGrid();

  // -- footprints ---------------------------------------------------------------------------------------
  const footprints = L.featureGroup().addTo(map);

  function colourOf(collection) {
    if (!colours.has(collection)) colours.set(collection, PALETTE[colours.size % PALETTE.length]);
    return colours.get(collection);
  }

  function styleOf(id) {
    const item = items.get(id);
    const c = colourOf(item.collection);
    const hit = state.results === null || state.results.includes(id);
    const sel = state.selected === id;
    return { color: sel ? "#111" : c, weight: sel ? 3 : hit ? 1.6 : 0.8, opacity: hit ? 0.95 : 0.35,
             fillColor: c, fillOpacity: sel ? 0.35 : hit ? (state.results === null ? 0.18 : 0.4) : 0.04,
             dashArray: hit || sel ? null : "3 3" };
  }

  function restyle() {
    for (const [id, layer] of layers) layer.setStyle(styleOf(id));
    drawDots();
  }

  function addFootprint(item) {
    if (!item.geometry) return;
    const layer = L.geoJSON(item, {
      style: () => styleOf(item.id),
      pointToLayer: (f, latlng) => L.circleMarker(latlng, { radius: 6 }),
    });
    layer.on("click", (e) => {
      L.DomEvent.stop(e);
      select(item.id, e.latlng);
    });
    layer.bindTooltip(() => `${escapeHtml(item.id)}<br><span class="muted">${escapeHtml(item.collection || "")}</span>`,
                      { sticky: true, direction: "top", offset: [0, -6] });
    footprints.addLayer(layer);
    layers.set(item.id, layer);
    layer.eachLayer((l) => { if (l.getElement) { const e = l.getElement(); if (e) e.dataset.id = item.id; } });
  }

  // a footprint a few pixels wide is also drawn as a dot at its centre, in a pane of its own
  const dots = L.layerGroup().addTo(map);
  function drawDots() {
    dots.clearLayers();
    for (const [id, layer] of layers) {
      const b = layer.getBounds();
      const a = map.latLngToLayerPoint(b.getSouthWest()), c = map.latLngToLayerPoint(b.getNorthEast());
      if (Math.abs(c.x - a.x) > 10 || Math.abs(c.y - a.y) > 10) continue;
      const st = styleOf(id);
      const dot = L.circleMarker(b.getCenter(), { renderer: dotRenderer, pane: "dots", radius: 5, color: st.color,
        weight: st.weight, opacity: st.opacity, fillColor: st.fillColor, fillOpacity: Math.max(st.fillOpacity, 0.5) });
      dot.bindTooltip(escapeHtml(id), { direction: "top", offset: [0, -6] });
      dot.on("click", (e) => {
        L.DomEvent.stop(e);
        select(id, null);
      });
      dots.addLayer(dot);
    }
  }
  map.on("zoomend", drawDots);

  const legend = L.control({ position: "bottomright" });
  legend.onAdd = () => L.DomUtil.create("div", "legend");
  legend.addTo(map);
  function drawLegend() {
    const counts = new Map(), drawn = new Map();
    for (const item of items.values()) {
      counts.set(item.collection, (counts.get(item.collection) || 0) + 1);
      if (item.geometry) drawn.set(item.collection, (drawn.get(item.collection) || 0) + 1);
    }
    const rows = [...colours.keys()].filter((c) => counts.has(c)).map((c) =>
      `<div><i style="background:${colourOf(c)}"></i>${escapeHtml(c)} <span class="muted">${drawn.get(c) || 0}/${counts.get(c)}</span></div>`);
    const nogeo = state.items - state.footprints;
    if (nogeo) rows.push(`<div class="muted">${nogeo} item(s) without a footprint</div>`);
    if (state.truncated) rows.push(`<div class="muted">the first ${MAX_ITEMS} items only</div>`);
    legend.getContainer().innerHTML = rows.join("") || '<span class="muted">an empty catalog</span>';
  }

  // -- drawing a search box: the "Draw a box" toggle, or shift-drag at any time ---------------------------
  // Pointer events caught on the map's container in the capture phase, before Leaflet's dragging and the
  // footprints' click handlers see them.
  const container = map.getContainer();
  let drawMode = false, drag = null;

  function setDrawMode(on) {
    drawMode = on;
    $("draw").setAttribute("aria-pressed", String(on));
    container.classList.toggle("drawing", on);
  }

  function onDown(e) {
    if (e.button !== 0 || !(drawMode || e.shiftKey) || drag) return;
    if (e.target.closest && e.target.closest(".leaflet-control")) return;
    e.preventDefault();
    e.stopPropagation();
    const start = map.mouseEventToLatLng(e);
    drag = { start, rect: L.rectangle(L.latLngBounds(start, start), {
      renderer: boxRenderer, pane: "box", color: "#2b6cb0", weight: 2, dashArray: "6 4", fillOpacity: 0.08,
      interactive: false }) };
    if (box) { box.remove(); box = null; }
    drag.rect.addTo(map);
    document.addEventListener("mousemove", onMove, true);
    document.addEventListener("mouseup", onUp, true);
  }
  function onMove(e) {
    if (!drag) return;
    e.preventDefault();
    drag.rect.setBounds(L.latLngBounds(drag.start, map.mouseEventToLatLng(e)));
  }
  function onUp(e) {
    if (!drag) return;
    e.preventDefault();
    e.stopPropagation();
    document.removeEventListener("mousemove", onMove, true);
    document.removeEventListener("mouseup", onUp, true);
    const bounds = L.latLngBounds(drag.start, map.mouseEventToLatLng(e));
    const rect = drag.rect;
    drag = null;
    // the click that ends the drag is not a click on a footprint
    const swallow = (ev) => { ev.stopPropagation(); ev.preventDefault(); };
    container.addEventListener("click", swallow, { capture: true, once: true });
    setTimeout(() => container.removeEventListener("click", swallow, { capture: true }), 0);
    setDrawMode(false);
    const p0 = map.latLngToContainerPoint(bounds.getSouthWest()), p1 = map.latLngToContainerPoint(bounds.getNorthEast());
    if (Math.abs(p1.x - p0.x) < 4 || Math.abs(p1.y - p0.y) < 4) { rect.remove(); return; }  // a click, not a box
    box = rect;
    showBox();
    runSearch();
  }
  container.addEventListener("mousedown", onDown, true);
  // Leaflet listens to pointer/touch events as well: keep them from starting a pan while drawing
  for (const type of ["pointerdown", "touchstart"]) {
    container.addEventListener(type, (e) => {
      if ((drawMode || e.shiftKey) && !(e.target.closest && e.target.closest(".leaflet-control"))) e.stopPropagation();
    }, true);
  }

  function boxBbox() {
    if (!box) return null;
    const b = box.getBounds();
    const r = (v) => Math.round(v * 1e6) / 1e6;
    return [r(Math.max(b.getWest(), -180)), r(Math.max(b.getSouth(), -90)),
            r(Math.min(b.getEast(), 180)), r(Math.min(b.getNorth(), 90))];
  }
  function showBox() {
    const bb = boxBbox();
    $("bbox").textContent = bb ? bb.map((v) => v.toFixed(4)).join(", ") : "anywhere";
    $("clear-box").disabled = !bb;
  }

  $("draw").addEventListener("click", () => setDrawMode(!drawMode));
  $("clear-box").addEventListener("click", () => {
    if (box) { box.remove(); box = null; }
    showBox();
    runSearch();
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") setDrawMode(false); });

  // -- search -------------------------------------------------------------------------------------------
  function searchBody() {
    const body = {};
    const bbox = boxBbox();
    if (bbox) body.bbox = bbox;
    const start = $("dt-start").value, end = $("dt-end").value;
    if (start || end) {
      body.datetime = `${start ? start + "T00:00:00Z" : ".."}/${end ? end + "T23:59:59Z" : ".."}`;
    }
    const lo = parseFloat($("wl-min").value), hi = parseFloat($("wl-max").value);
    if (Number.isFinite(lo) || Number.isFinite(hi)) {
      const a = Number.isFinite(lo) ? lo : hi, b = Number.isFinite(hi) ? hi : lo;
      body["filter-lang"] = "cql2-json";
      body.filter = { op: "cubelake:covers_wavelength", args: [Math.min(a, b), Math.max(a, b)] };
    }
    return body;
  }

  let searchSeq = 0;
  async function runSearch() {
    const body = searchBody();
    const seq = ++searchSeq;
    state.searching = true;
    state.lastSearch = body;
    setStatus("searching…");
    try {
      const { features, truncated } = await searchAll(body, MAX_ITEMS);
      if (seq !== searchSeq) return;  // a newer search has started
      for (const f of features) if (!items.has(f.id)) { items.set(f.id, f); addFootprint(f); }
      state.results = Object.keys(body).length ? features.map((f) => f.id) : null;
      showResults(features, truncated);
      restyle();
      setStatus(`${features.length}${truncated ? "+" : ""} item(s) found`);
    } catch (err) {
      if (seq !== searchSeq) return;
      state.error = String(err.message || err);
      setStatus(`search failed: ${state.error}`, true);
    } finally {
      if (seq === searchSeq) { state.searching = false; state.searches += 1; }
    }
  }

  function showResults(features, truncated) {
    const ol = $("results");
    ol.textContent = "";
    $("count").textContent = `(${features.length}${truncated ? "+" : ""})`;
    for (const f of features) {
      const li = document.createElement("li");
      li.dataset.id = f.id;
      li.style.setProperty("--c", colourOf(f.collection));
      if (!f.geometry) li.classList.add("nogeo");
      if (f.id === state.selected) li.classList.add("selected");
      li.title = f.id;
      const name = document.createElement("span");
      name.className = "id";
      name.textContent = f.id;
      const coll = document.createElement("span");
      coll.className = "coll";
      coll.textContent = ` ${f.collection || ""}`;
      li.append(name, coll);
      li.addEventListener("click", () => {
        select(f.id, null);
      });
      ol.appendChild(li);
    }
  }

  $("search").addEventListener("submit", (e) => { e.preventDefault(); runSearch(); });
  $("search").addEventListener("reset", () => {
    setTimeout(() => { if (box) { box.remove(); box = null; } showBox(); runSearch(); }, 0);
  });

  // -- the detail panel ---------------------------------------------------------------------------------
  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  // the item's COG: a data asset in image/tiff that is not the source file nor auxiliary
  function cogAsset(item) {
    const assets = item.assets || {};
    const entries = Object.entries(assets);
    const isTiff = (a) => String(a.type || "").startsWith("image/tiff");
    const found = entries.find(([, a]) => (a.roles || []).includes("cloud-optimized") && (a.roles || []).includes("data"))
      || entries.find(([, a]) => isTiff(a) && (a.roles || []).includes("data") &&
                                 !(a.roles || []).some((r) => r === "source" || r === "auxiliary"));
    return found ? found[1] : null;
  }

  function thumbnailAsset(item) {
    const assets = item.assets || {};
    if (assets.thumbnail && assets.thumbnail.href) return assets.thumbnail;
    return Object.values(assets).find((a) => (a.roles || []).includes("thumbnail") && a.href) || null;
  }

  function bandsOf(item) {
    const cog = cogAsset(item);
    if (cog && Array.isArray(cog.bands)) return { bands: cog.bands, asset: cog };
    return { bands: Array.isArray(item.properties && item.properties.bands) ? item.properties.bands : [], asset: cog };
  }

  function whenOf(p) {
    if (p.datetime) return p.datetime;
    if (p["cubelake:datetime_source"] === "unknown") return "unknown";
    if (p.start_datetime || p.end_datetime) return `${p.start_datetime || ".."} – ${p.end_datetime || ".."}`;
    return "unknown";
  }

  function select(id, latlng) {
    const item = items.get(id);
    if (!item) return;
    state.selected = id;
    restyle();
    for (const li of $("results").children) li.classList.toggle("selected", li.dataset.id === id);
    const p = item.properties || {};
    const { bands } = bandsOf(item);
    if ($("panel").hidden) {
      $("panel").hidden = false;
      map.invalidateSize({ pan: false });  // the map narrows; what is under the pointer stays there
    }
    const layer = layers.get(id);
    if (layer && !latlng && !map.getBounds().contains(layer.getBounds())) {
      map.fitBounds(layer.getBounds(), { maxZoom: 13, padding: [40, 40] });
    }
    $("p-id").textContent = item.id;
    $("p-collection").textContent = item.collection || "";
    const props = [
      ["datetime", whenOf(p)],
      ["platform", p.platform],
      ["instruments", Array.isArray(p.instruments) ? p.instruments.join(", ") : p.instruments],
      ["gsd", p.gsd !== undefined && p.gsd !== null ? `${+(+p.gsd).toFixed(2)} m` : undefined],
      ["cloud cover", p["eo:cloud_cover"] !== undefined && p["eo:cloud_cover"] !== null ? `${p["eo:cloud_cover"]} %` : undefined],
      ["bands", p["cubelake:band_count"] !== undefined ? p["cubelake:band_count"] : bands.length],
      ["proj:code", p["proj:code"]],
      ["footprint", item.geometry ? (item.bbox || []).map((v) => (+v).toFixed(4)).join(", ") : "none"],
    ];
    const dl = $("p-props");
    dl.textContent = "";
    for (const [k, v] of props) {
      const dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = k;
      dd.textContent = v === undefined || v === null || v === "" ? "–" : String(v);
      dd.dataset.key = k;
      dl.append(dt, dd);
    }
    const thumb = thumbnailAsset(item);
    const fig = $("p-thumb");
    const img = fig.querySelector("img");
    if (thumb) {
      fig.hidden = false;
      img.onerror = () => { fig.hidden = true; };
      img.src = thumb.href;
    } else {
      fig.hidden = true;
      img.removeAttribute("src");
    }
    const links = $("p-links");
    links.textContent = "";
    const self = (item.links || []).find((l) => l.rel === "self");
    if (self) {
      const a = document.createElement("a");
      a.href = self.href; a.textContent = "item JSON"; a.target = "_blank";
      links.append(a);
    }
    const cog = cogAsset(item);
    if (cog && cog.href) {
      const a = document.createElement("a");
      a.href = cog.href; a.textContent = "COG"; a.download = "";
      links.append(a);
    }
    state.spectrum = { item: id, mean: meanSpectrum(item), pixel: null };
    if (pixelMarker) { pixelMarker.remove(); pixelMarker = null; }
    drawSpectrum();
    if (latlng) pixelSpectrum(item, latlng);
  }

  $("panel-close").addEventListener("click", () => {
    $("panel").hidden = true;
    map.invalidateSize({ pan: false });
    state.selected = null;
    if (pixelMarker) { pixelMarker.remove(); pixelMarker = null; }
    restyle();
  });

  // -- spectra ------------------------------------------------------------------------------------------
  // x in nm when every band has a centre wavelength, else the band number
  function meanSpectrum(item) {
    const { bands } = bandsOf(item);
    const pts = [];
    const byWavelength = bands.length > 0 && bands.every((b) => Number.isFinite(b["eo:center_wavelength"]));
    bands.forEach((b, i) => {
      const m = b.statistics && b.statistics.mean;
      if (typeof m === "number" && Number.isFinite(m)) {
        pts.push([byWavelength ? b["eo:center_wavelength"] * 1000 : i + 1, m]);
      }
    });
    return { points: pts, byWavelength, nbands: bands.length };
  }

  async function pixelSpectrum(item, latlng) {
    const lon = L.Util.formatNum(latlng.lng, 7), lat = L.Util.formatNum(latlng.lat, 7);
    if (pixelMarker) pixelMarker.remove();
    pixelMarker = L.circleMarker(latlng, { pane: "pixel", renderer: L.svg({ pane: "pixel" }), radius: 5,
      color: "#fff", weight: 2, fillColor: "#d1495b", fillOpacity: 1, interactive: false }).addTo(map);
    const sp = state.spectrum;
    sp.pixel = { lon, lat, loading: true, points: [] };
    drawSpectrum();
    const url = `collections/${encodeURIComponent(item.collection)}/items/${encodeURIComponent(item.id)}` +
      `/spectrum?lon=${lon}&lat=${lat}`;
    try {
      const r = await api(url);
      if (state.spectrum !== sp) return;  // another item was selected meanwhile
      const { bands, asset } = bandsOf(item);
      const wl = r.wavelength_um || [];
      const byWavelength = wl.length > 0 && wl.every((w) => Number.isFinite(w));
      const pts = [];
      (r.values || []).forEach((v, i) => {
        if (typeof v !== "number" || !Number.isFinite(v)) return;
        // the endpoint returns the COG's stored values; the statistics are in physical units
        const b = bands.length === r.values.length ? bands[i] : {};
        const scale = num(b["raster:scale"], asset && asset["raster:scale"], 1);
        const offset = num(b["raster:offset"], asset && asset["raster:offset"], 0);
        pts.push([byWavelength ? wl[i] * 1000 : i + 1, v * scale + offset]);
      });
      sp.pixel = { lon, lat, row: r.row, col: r.col, points: pts, byWavelength };
    } catch (err) {
      if (state.spectrum !== sp) return;
      sp.pixel = { lon, lat, points: [], error: String(err.message || err) };
    }
    drawSpectrum();
  }

  function num(...vs) {
    for (const v of vs) if (typeof v === "number" && Number.isFinite(v)) return v;
    return undefined;
  }

  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; lo -= 1; }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => raw <= s);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  const SVGNS = "http://www.w3.org/2000/svg";
  function el(name, attrs, text) {
    const e = document.createElementNS(SVGNS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function drawSpectrum() {
    const sp = state.spectrum;
    const plot = $("p-plot");
    plot.textContent = "";
    const mean = sp.mean.points, pixel = (sp.pixel && sp.pixel.points) || [];
    const series = [];
    if (mean.length) series.push({ cls: "mean", pts: mean, label: "scene mean" });
    if (pixel.length) series.push({ cls: "pixel", pts: pixel, label: `pixel ${sp.pixel.lon}, ${sp.pixel.lat}` });
    const notes = [];
    if (!mean.length) notes.push(sp.mean.nbands ? "no band statistics: no mean spectrum" : "no bands");
    if (sp.pixel && sp.pixel.loading) notes.push("reading the pixel…");
    else if (sp.pixel && sp.pixel.error) notes.push(`no pixel spectrum: ${sp.pixel.error}`);
    else if (!sp.pixel) notes.push("click inside the footprint for a pixel's spectrum");
    $("p-plot-caption").textContent = notes.join("; ");
    if (!series.length) return;
    const byWl = series.every((s) => (s.cls === "mean" ? sp.mean.byWavelength : sp.pixel.byWavelength));
    const W = 360, H = 210, m = { l: 46, r: 8, t: 18, b: 30 };
    const all = series.flatMap((s) => s.pts);
    let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
    let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.05;
    y0 -= pad; y1 += pad;
    const X = (v) => m.l + (v - x0) / (x1 - x0) * (W - m.l - m.r);
    const Y = (v) => H - m.b - (v - y0) / (y1 - y0) * (H - m.t - m.b);
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "spectrum", role: "img",
                            "aria-label": `spectrum of ${sp.item}` });
    for (const t of niceTicks(y0, y1, 5)) {
      if (t < y0 || t > y1) continue;
      svg.append(el("line", { class: "gridline", x1: m.l, x2: W - m.r, y1: Y(t), y2: Y(t) }));
      svg.append(el("text", { class: "tick", x: m.l - 4, y: Y(t) + 3, "text-anchor": "end" }, +t.toPrecision(4)));
    }
    for (const t of niceTicks(x0, x1, 6)) {
      if (t < x0 || t > x1) continue;
      svg.append(el("line", { class: "axis", x1: X(t), x2: X(t), y1: H - m.b, y2: H - m.b + 4 }));
      svg.append(el("text", { class: "tick", x: X(t), y: H - m.b + 14, "text-anchor": "middle" }, t));
    }
    svg.append(el("line", { class: "axis", x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
    svg.append(el("line", { class: "axis", x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }));
    svg.append(el("text", { class: "tick", x: (m.l + W - m.r) / 2, y: H - 3, "text-anchor": "middle" },
                  byWl ? "wavelength (nm)" : "band"));
    series.forEach((s, k) => {
      // a gap in wavelength (bands removed: water vapour, detector seams) is a gap in the line
      const steps = s.pts.slice(1).map((p, i) => p[0] - s.pts[i][0]).filter((d) => d > 0).sort((a, b) => a - b);
      const typical = steps.length ? steps[Math.floor(steps.length / 2)] : Infinity;
      const d = s.pts.map((p, i) => {
        const jump = i === 0 || (byWl && p[0] - s.pts[i - 1][0] > 4 * typical);
        return `${jump ? "M" : "L"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
      }).join(" ");
      svg.append(el("path", { class: `series ${s.cls}`, d, "data-points": s.pts.length }));
      if (s.pts.length === 1) {
        svg.append(el("circle", { class: `series ${s.cls}`, cx: X(s.pts[0][0]), cy: Y(s.pts[0][1]), r: 3 }));
      }
      const kx = m.l + 6 + k * 150;
      svg.append(el("line", { class: `series ${s.cls}`, x1: kx, x2: kx + 16, y1: 9, y2: 9 }));
      svg.append(el("text", { class: "key", x: kx + 20, y: 12 }, s.label));
    });
    plot.append(svg);
  }

  // -- the first load -------------------------------------------------------------------------------------
  async function load() {
    try {
      const colls = await api("collections");
      state.collections = (colls.collections || []).map((c) => c.id).sort();
      state.collections.forEach(colourOf);
      const { features, truncated } = await searchAll({}, MAX_ITEMS);
      for (const f of features) items.set(f.id, f);
      // the largest footprints first, so that a smaller one on top of them can be clicked
      const area = (f) => (f.bbox && f.bbox.length >= 4 ? Math.abs((f.bbox[2] - f.bbox[0]) * (f.bbox[3] - f.bbox[1])) : 0);
      [...features].sort((a, b) => area(b) - area(a)).forEach(addFootprint);
      state.items = features.length;
      state.footprints = layers.size;
      state.truncated = truncated;
      drawLegend();
      showResults(features, truncated);
      if (layers.size) map.fitBounds(footprints.getBounds(), { padding: [30, 30], maxZoom: 12, animate: false });
      drawDots();
      setStatus(`${features.length}${truncated ? "+" : ""} item(s) in ${state.collections.length} collection(s); ` +
                `${layers.size} with a footprint`);
    } catch (err) {
      state.error = String(err.message || err);
      setStatus(`could not load the catalog: ${state.error}`, true);
    }
    state.loaded = true;
    // drawn once Leaflet has rendered the layers
    requestAnimationFrame(() => { document.body.dataset.ready = "1"; });
  }
  load();
})();
