"""Synthetic STAC 1.1 items and queries for the catalog benchmark, and its stac-geoparquet baseline.

Everything here is seeded and lazy: ``synthetic_items(n, seed)`` yields the same items in the same
order on every call, generated block by block (``BLOCK`` items per block, each block from its own
``numpy`` generator seeded with ``(seed, block)``), so two consumers (the index, the parquet
writer) can each re-generate the stream instead of holding a million dicts.

Items (STAC 1.1, eo v2 and projection v2, as cubelake writes them):

* six sensor collections (``COLLECTIONS``), with footprints of the sensor's size (EnMAP, PRISMA
  and DESIS 30x30 km tiles, AVIRIS-NG 5x40 km flight strips at any heading, Landsat 185x180 km,
  Sentinel-2 110x110 km), slightly rotated (orbit heading), as a closed 5-point polygon in WGS84;
* centres uniform in degrees over latitudes -60..75 and all longitudes, plus ``P_ANTIMERIDIAN``
  of the items centred on the antimeridian: a footprint that crosses it has ``bbox`` west > east
  and a MultiPolygon split at +-180;
* datetimes uniform over 2015-01-01..2024-12-31 UTC, whole seconds; by default in time order
  (stratified: item i falls in the i-th of n equal slices, as an archive grows), so a
  stac-geoparquet file written in item order has row groups that prune on datetime;
* ``properties.bands`` with ``eo:center_wavelength`` / ``eo:full_width_half_max`` in um: the real
  OLI (7) and MSI (12, L2A) bands, and hyperspectral band sets built like the instruments'
  (EnMAP 224, PRISMA 239, DESIS 235 VNIR-only, AVIRIS-NG 425), in a few calibration versions
  (centres shifted by up to 1.5 nm), with the water-vapour windows (1.35-1.45, 1.80-1.96 um)
  removed in half of the items and a VNIR-only product (centres <= 1.0 um) in 10 %. Items share
  band lists (one per collection and variant): treat items as read-only.

The baseline (``geoparquet_search``) and the wavelength semantics (``covers``: cubelake's rule,
band intervals merged across gaps up to ``GAP_FRACTION`` of the narrower band) live here too, so
the benchmark compares cubelake's index with a reader that any stac-geoparquet user could write.

Query sizing (``make_queries``): with centres uniform per square degree, the expected number of
hits of a square box of side s is a quadratic in s (``box_side_for``: the Minkowski sum of box
and footprint, per sensor, times the datetime fraction and the exact share of band sets that
cover the range), solved per query for ``target_hits`` at ``n_items``; box area thus scales as
~1/n (sides ~5-13 deg at 1M items, ~40-100 deg at 20k).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import shapely
import shapely.affinity
from shapely.geometry import box as shapely_box
from shapely.geometry.polygon import orient

BLOCK = 4096
KM_PER_DEG = 111.32
LAT_MIN, LAT_MAX = -60.0, 75.0
T0 = datetime(2015, 1, 1, tzinfo=UTC)
T1 = datetime(2025, 1, 1, tzinfo=UTC)  # exclusive: the last item is at most 2024-12-31T23:59:59Z
SPAN_S = int((T1 - T0).total_seconds())
P_ANTIMERIDIAN = 0.03  # items centred on the antimeridian (every one of them crosses it)
WATER_VAPOUR_UM = ((1.35, 1.45), (1.80, 1.96))
EXTENSIONS = [
    "https://stac-extensions.github.io/eo/v2.0.0/schema.json",
    "https://stac-extensions.github.io/projection/v2.0.0/schema.json",
]
COG_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"


# -- sensors and their bands --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sensor:
    """One collection: share of the items, footprint (km) and heading spread, band layout."""

    collection: str
    share: float
    across_km: float
    along_km: float
    heading_deg: tuple[float, float]  # uniform range of the footprint's rotation (degrees)
    #: hyperspectral: (first centre um, last centre um, band count, FWHM / spacing) per detector;
    #: empty for the multispectral sensors, whose bands are in ``fixed``
    detectors: tuple[tuple[float, float, int, float], ...] = ()
    fixed: tuple[tuple[str, float, float], ...] = ()  # (name, centre um, FWHM um)
    vnir_only: bool = False  # the instrument itself is VNIR-only (no variants)


# Landsat 8 OLI bands 1-7 and Sentinel-2A MSI (L2A: no B10): centre and FWHM in um
OLI = (("coastal", 0.4430, 0.0160), ("blue", 0.4820, 0.0600), ("green", 0.5613, 0.0570),
       ("red", 0.6546, 0.0370), ("nir08", 0.8646, 0.0280), ("swir16", 1.6090, 0.0850),
       ("swir22", 2.2010, 0.1870))
MSI = (("B01", 0.4427, 0.0210), ("B02", 0.4924, 0.0660), ("B03", 0.5598, 0.0360),
       ("B04", 0.6646, 0.0310), ("B05", 0.7041, 0.0150), ("B06", 0.7405, 0.0150),
       ("B07", 0.7828, 0.0200), ("B08", 0.8328, 0.1060), ("B8A", 0.8647, 0.0210),
       ("B09", 0.9451, 0.0200), ("B11", 1.6137, 0.0910), ("B12", 2.2024, 0.1750))

SENSORS: tuple[Sensor, ...] = (
    Sensor("sentinel-2-l2a", 0.30, 110, 110, (-12, 12), fixed=MSI),
    Sensor("landsat-c2-l2", 0.20, 185, 180, (-15, 15), fixed=OLI),
    Sensor("enmap-l2a", 0.20, 30, 30, (-15, 15),
           detectors=((0.4200, 1.0000, 91, 1.25), (0.9000, 2.4500, 133, 1.20))),
    Sensor("prisma-l2d", 0.12, 30, 30, (-15, 15),
           detectors=((0.4000, 1.0100, 66, 1.20), (0.9200, 2.5050, 173, 1.20))),
    Sensor("desis-l2a", 0.10, 30, 30, (-15, 15),
           detectors=((0.4020, 0.9990, 235, 1.40),), vnir_only=True),
    Sensor("aviris-ng-l2", 0.08, 5, 40, (0, 180),
           detectors=((0.3800, 2.5100, 425, 1.15),)),
)
COLLECTIONS = tuple(s.collection for s in SENSORS)
SHARES = np.array([s.share for s in SENSORS])
N_CALIBRATIONS = 4  # calibration versions per hyperspectral sensor (centre shifts)
#: hyperspectral product variants: (name, probability); VNIR-only sensors always use "full"
VARIANTS = (("full", 0.45), ("no_water_vapour", 0.45), ("vnir", 0.10))


def _band(name: str, centre_um: float, fwhm_um: float) -> dict[str, Any]:
    return {"name": name, "eo:center_wavelength": centre_um, "eo:full_width_half_max": fwhm_um}


def _hyperspectral_bands(sensor: Sensor, shift_um: float, variant: str) -> list[dict[str, Any]]:
    """Band objects of one product variant; centres and FWHMs rounded to 0.1 nm."""
    bands: list[tuple[float, float]] = []
    for first, last, count, ratio in sensor.detectors:
        spacing = (last - first) / (count - 1)
        # FWHM > spacing (ratio >= 1.15), so a detector's bands overlap by >= 0.15 spacing and
        # the 0.1 nm rounding can never open a gap or make two edges touch exactly
        bands += [(round(first + i * spacing + shift_um, 4), round(ratio * spacing, 4)) for i in range(count)]
    if variant == "no_water_vapour":
        bands = [b for b in bands if not any(lo <= b[0] <= hi for lo, hi in WATER_VAPOUR_UM)]
    elif variant == "vnir":
        bands = [b for b in bands if b[0] <= 1.0]
    return [_band(f"b{i + 1:03d}", c, w) for i, (c, w) in enumerate(bands)]


def band_pool() -> list[list[tuple[str, float, list[dict[str, Any]]]]]:
    """Per sensor: ``[(variant, probability, bands), ...]``; probabilities sum to 1 per sensor."""
    pool = []
    for s in SENSORS:
        if s.fixed:
            pool.append([("full", 1.0, [_band(*b) for b in s.fixed])])
            continue
        variants = [("full", 1.0)] if s.vnir_only else list(VARIANTS)
        shifts = np.linspace(-0.0015, 0.0015, N_CALIBRATIONS)
        pool.append([(f"{v}@{k}", p / N_CALIBRATIONS, _hyperspectral_bands(s, float(sh), v))
                     for v, p in variants for k, sh in enumerate(shifts)])
    return pool


_POOL = band_pool()
_CUM_P = [np.cumsum([v[1] for v in variants]) for variants in _POOL]


# -- wavelength coverage ------------------------------------------------------------------------
#: cubelake's merge rule (``cubelake.catalog.coverage.merge_intervals``): neighbouring band
#: intervals merge when they overlap, touch, or leave a gap of at most this fraction of the
#: narrower one's width (the band reaching the merged interval's end so far, and the new band)
GAP_FRACTION = 0.5


def covers_rows(centres_um: np.ndarray, fwhms_um: np.ndarray, offsets: np.ndarray,
                lo_um: float, hi_um: float, gap_fraction: float = GAP_FRACTION) -> np.ndarray:
    """Per row (bands ``offsets[r]:offsets[r+1]``): does ONE merged band interval hold [lo, hi]?

    Band i covers ``[c_i - w_i/2, c_i + w_i/2]``, computed in nm from the um values (x 1000, as
    cubelake's index does, so the floats are the same); intervals sorted by (start, end) merge as
    in ``merge_intervals``; ``[lo, hi]`` must lie inside one merged interval. Exact float
    comparisons, vectorised over rows (padded to a 2-D array, never offset by a constant).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    n_rows = len(offsets) - 1
    if n_rows <= 0:
        return np.zeros(0, dtype=bool)
    lengths = np.diff(offsets)
    width = max(int(lengths.max()), 1)
    c_nm = np.asarray(centres_um, dtype=np.float64)[offsets[0]:offsets[-1]] * 1000.0
    w_nm = np.asarray(fwhms_um, dtype=np.float64)[offsets[0]:offsets[-1]] * 1000.0
    starts = np.full((n_rows, width), np.inf)
    ends = np.full((n_rows, width), -np.inf)
    row = np.repeat(np.arange(n_rows), lengths)
    col = np.arange(len(row)) - np.repeat(offsets[:-1] - offsets[0], lengths)
    starts[row, col] = c_nm - w_nm / 2
    ends[row, col] = c_nm + w_nm / 2
    # sort each row by (start, end): by end first, then stably by start
    by_end = np.argsort(ends, axis=1, kind="stable")
    order = np.take_along_axis(by_end, np.argsort(np.take_along_axis(starts, by_end, axis=1), axis=1,
                                                  kind="stable"), axis=1)
    starts = np.take_along_axis(starts, order, axis=1)
    ends = np.take_along_axis(ends, order, axis=1)
    widths = ends - starts  # -inf in the padding
    # running end: earlier merged intervals all end before the current one starts, so it is the
    # end so far of the merged interval that position k belongs to
    run_end = np.maximum.accumulate(ends, axis=1)
    # the band that reaches the running end (the latest one, as merge_intervals updates on >=)
    reach = np.maximum.accumulate(np.where(ends == run_end, np.arange(width)[None, :], 0), axis=1)
    reach_width = np.take_along_axis(widths, reach, axis=1)
    new = np.ones_like(starts, dtype=bool)
    new[:, 1:] = starts[:, 1:] > run_end[:, :-1] + gap_fraction * np.minimum(widths[:, 1:], reach_width[:, :-1])
    seg_start = np.maximum.accumulate(np.where(new, starts, -np.inf), axis=1)
    return ((seg_start <= lo_um * 1000.0) & (run_end >= hi_um * 1000.0)).any(axis=1)


def covers(centres_um: Sequence[float] | np.ndarray, fwhms_um: Sequence[float] | np.ndarray,
           lo_um: float, hi_um: float, gap_fraction: float = GAP_FRACTION) -> bool:
    """Whether [lo_um, hi_um] lies inside ONE merged interval of the bands' [c - w/2, c + w/2]."""
    c = np.asarray(centres_um, dtype=np.float64)
    return bool(covers_rows(c, np.asarray(fwhms_um, dtype=np.float64), np.array([0, len(c)]),
                            lo_um, hi_um, gap_fraction)[0])


def merged_intervals_nm(centres_um: Sequence[float], fwhms_um: Sequence[float],
                        gap_fraction: float = GAP_FRACTION) -> list[tuple[float, float]]:
    """The merged (start, end) intervals in nm, one band at a time (the reference for messages)."""
    out: list[tuple[float, float]] = []
    last_width = 0.0
    for lo, hi in sorted((c * 1000.0 - w * 1000.0 / 2, c * 1000.0 + w * 1000.0 / 2)
                         for c, w in zip(centres_um, fwhms_um, strict=True)):
        if out and lo <= out[-1][1] + gap_fraction * min(hi - lo, last_width):
            if hi >= out[-1][1]:
                out[-1], last_width = (out[-1][0], hi), hi - lo
        else:
            out.append((lo, hi))
            last_width = hi - lo
    return out


# -- items --------------------------------------------------------------------------------------
def _split_antimeridian(ring: np.ndarray) -> tuple[dict[str, Any], list[float]]:
    """A footprint ring whose longitudes pass +-180: a MultiPolygon split there, and its bbox."""
    poly = shapely.Polygon(ring)
    if ring[:, 0].max() > 180:
        east = poly.intersection(shapely_box(-180, -90, 180, 90))
        west = shapely.affinity.translate(poly.intersection(shapely_box(180, -90, 540, 90)), -360)
    else:
        east = shapely.affinity.translate(poly.intersection(shapely_box(-540, -90, -180, 90)), 360)
        west = poly.intersection(shapely_box(-180, -90, 180, 90))
    parts = []
    for part in (east, west):
        xy = np.round(np.asarray(orient(part, 1.0).exterior.coords), 6)
        parts.append([xy.tolist()])
    e_xy, w_xy = np.asarray(parts[0][0]), np.asarray(parts[1][0])
    bbox = [float(e_xy[:, 0].min()), float(min(e_xy[:, 1].min(), w_xy[:, 1].min())),
            float(w_xy[:, 0].max()), float(max(e_xy[:, 1].max(), w_xy[:, 1].max()))]
    return {"type": "MultiPolygon", "coordinates": parts}, bbox


def _block(first: int, count: int, n: int, seed: int, time_ordered: bool) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng([seed, first // BLOCK])
    sensor = rng.choice(len(SENSORS), size=count, p=SHARES)
    variant_u = rng.random(count)
    lat = rng.uniform(LAT_MIN, LAT_MAX, count)
    lon = rng.uniform(-180, 180, count)
    theta = np.empty(count)
    across = np.empty(count)
    along = np.empty(count)
    for k, s in enumerate(SENSORS):
        m = sensor == k
        theta[m] = np.radians(rng.uniform(*s.heading_deg, int(m.sum())))
        across[m], along[m] = s.across_km, s.along_km
    # corners (counter-clockwise) of the rotated rectangle, in km from the centre
    cx = np.array([-0.5, 0.5, 0.5, -0.5])[None, :] * across[:, None]
    cy = np.array([-0.5, -0.5, 0.5, 0.5])[None, :] * along[:, None]
    dx = cx * np.cos(theta)[:, None] - cy * np.sin(theta)[:, None]
    dy = cx * np.sin(theta)[:, None] + cy * np.cos(theta)[:, None]
    coslat = np.cos(np.radians(lat))
    # items centred on the antimeridian: within the footprint's half width of it, so they cross
    am = rng.random(count) < P_ANTIMERIDIAN
    half_w = np.abs(dx).max(axis=1) / (KM_PER_DEG * coslat)
    lon = np.where(am, np.where(rng.random(count) < 0.5, 180.0, -180.0)
                   + rng.uniform(-0.9, 0.9, count) * half_w, lon)
    lon = np.where(lon >= 180, lon - 360, lon)
    lon = np.where(lon < -180, lon + 360, lon)
    xs = np.round(lon[:, None] + dx / (KM_PER_DEG * coslat[:, None]), 6)
    ys = np.round(lat[:, None] + dy / KM_PER_DEG, 6)
    idx = np.arange(first, first + count)
    if time_ordered:
        t = ((idx + rng.random(count)) * (SPAN_S / n)).astype(np.int64)
    else:
        t = rng.integers(0, SPAN_S, count)
    t = np.minimum(t, SPAN_S - 1)
    stamps = np.datetime_as_string(np.datetime64("2015-01-01T00:00:00") + t.astype("timedelta64[s]"), unit="s")
    cloud = np.round(rng.beta(0.6, 1.5, count) * 100, 2).tolist()
    quality = np.round(rng.beta(5, 2, count), 4).tolist()
    # the product variant: the first whose cumulative probability exceeds variant_u
    choice_arr = np.zeros(count, dtype=np.int64)
    for k, cum in enumerate(_CUM_P):
        m = sensor == k
        choice_arr[m] = np.minimum(np.searchsorted(cum, variant_u[m], side="right"), len(cum) - 1)
    choice = choice_arr.tolist()
    crosses = ((xs.max(axis=1) > 180) | (xs.min(axis=1) < -180)).tolist()
    bboxes = np.stack([xs.min(axis=1), ys.min(axis=1), xs.max(axis=1), ys.max(axis=1)], axis=1).tolist()
    xl, yl = xs.tolist(), ys.tolist()
    zones = np.minimum((lon + 180) // 6 + 1, 60).astype(int)
    codes = (np.where(lat >= 0, 32600, 32700) + zones).tolist()
    for j, (i, k) in enumerate(zip(idx.tolist(), sensor.tolist(), strict=True)):
        item_id = f"synth-{i:09d}"
        bands = _POOL[k][choice[j]][2]
        x, y = xl[j], yl[j]
        if crosses[j]:
            geometry, bbox = _split_antimeridian(np.array([x + x[:1], y + y[:1]]).T)
        else:
            geometry = {"type": "Polygon", "coordinates": [[[x[0], y[0]], [x[1], y[1]], [x[2], y[2]],
                                                            [x[3], y[3]], [x[0], y[0]]]]}
            bbox = bboxes[j]
        yield {
            "type": "Feature",
            "stac_version": "1.1.0",
            "stac_extensions": list(EXTENSIONS),
            "id": item_id,
            "collection": COLLECTIONS[k],
            "bbox": bbox,
            "geometry": geometry,
            "properties": {
                "datetime": f"{stamps[j]}Z",
                "eo:cloud_cover": cloud[j],
                "cubelake:quality": quality[j],
                "cubelake:band_count": len(bands),
                "proj:code": f"EPSG:{codes[j]}",
                "bands": bands,
            },
            "links": [],
            "assets": {"cog": {"href": f"scenes/{item_id}/{item_id}.tif", "type": COG_TYPE, "roles": ["data"]}},
        }


def synthetic_items(n: int, seed: int = 0, *, time_ordered: bool = True) -> Iterator[dict[str, Any]]:
    """``n`` STAC 1.1 item dicts, lazily, identical for the same ``(n, seed, time_ordered)``.

    time_ordered: datetimes increase with the item index (stratified uniform); else i.i.d. uniform.
    """
    for first in range(0, n, BLOCK):
        yield from _block(first, min(BLOCK, n - first), n, seed, time_ordered)


# -- stac-geoparquet ----------------------------------------------------------------------------
def write_geoparquet(items: Iterable[dict[str, Any]], path: str | Path, *, chunk_size: int = 5000) -> None:
    """Write items as stac-geoparquet, ``chunk_size`` items per record batch (= per row group).

    The Arrow schema comes from the first batch ("FirstBatch"); stac-geoparquet raises if a later
    batch differs, which cannot happen here (every item has the same fields and types).
    """
    from stac_geoparquet.arrow import parse_stac_items_to_arrow, to_parquet

    reader = parse_stac_items_to_arrow(items, chunk_size=chunk_size, schema="FirstBatch")
    to_parquet(reader, path)


def open_geoparquet(path: str | Path) -> pads.Dataset:
    """The file as a pyarrow dataset whose ``bands`` struct holds only the two numeric fields.

    The search never needs band names, and the reader then skips their column (string decoding
    is most of the cost of reading ``bands``): the projection a careful pyarrow user would make.
    """
    ds = pads.dataset(str(path), format="parquet")
    i = ds.schema.get_field_index("bands")
    slim = pa.list_(pa.struct([pa.field("eo:center_wavelength", pa.float64()),
                               pa.field("eo:full_width_half_max", pa.float64())]))
    return pads.dataset(str(path), format="parquet", schema=ds.schema.set(i, pa.field("bands", slim)))


# -- queries ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BenchQuery:
    """One search: bbox (w, s, e, n; w > e crosses the antimeridian), inclusive datetimes, um range."""

    bbox: tuple[float, float, float, float]
    start: str  # ISO 8601 with Z
    end: str
    wl_lo_um: float
    wl_hi_um: float
    kind: str  # the wavelength template
    expected_hits: float  # model estimate (see make_queries)

    def to_dict(self) -> dict[str, Any]:
        return {"bbox": list(self.bbox), "start": self.start, "end": self.end, "wl_lo_um": self.wl_lo_um,
                "wl_hi_um": self.wl_hi_um, "kind": self.kind, "expected_hits": self.expected_hits}


#: wavelength templates (lo um, hi um, weight among the queries); bounds get +-3 nm of jitter
WL_TEMPLATES: dict[str, tuple[float, float, float]] = {
    "vnir": (0.45, 0.90, 0.35),    # hyperspectral, VNIR-only products included
    "full": (0.45, 2.40, 0.25),    # full-range hyperspectral without the water-vapour gaps
    "swir": (1.50, 1.70, 0.20),    # SWIR hyperspectral
    "nir": (0.86, 0.87, 0.20),     # inside one multispectral band too (OLI B5, MSI B08/B8A)
}


def _match_fraction(lo_um: float, hi_um: float) -> np.ndarray:
    """Per sensor: the share of its items whose bands cover [lo, hi] (exact, from the pool)."""
    return np.array([sum(p for _, p, bands in variants
                         if covers([b["eo:center_wavelength"] for b in bands],
                                   [b["eo:full_width_half_max"] for b in bands], lo_um, hi_um))
                     for variants in _POOL])


def _mean_extents_deg(lat: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sensor at latitude ``lat``: mean footprint width (lon deg), height (lat deg), area (deg^2)."""
    coslat = math.cos(math.radians(lat))
    wx, wy, area = [], [], []
    for s in SENSORS:
        th = np.radians(np.linspace(*s.heading_deg, 181))
        c, si = np.abs(np.cos(th)).mean(), np.abs(np.sin(th)).mean()
        wx.append((s.across_km * c + s.along_km * si) / (KM_PER_DEG * coslat))
        wy.append((s.across_km * si + s.along_km * c) / KM_PER_DEG)
        area.append(s.across_km * s.along_km / (KM_PER_DEG**2 * coslat))
    return np.array(wx), np.array(wy), np.array(area)


def box_side_for(target: float, n_items: int, lat: float, time_fraction: float, match: np.ndarray,
                 *, on_antimeridian: bool = False) -> tuple[float, float]:
    """Side (deg) of a square lat/lon box expected to hit ``target`` items, and that expectation.

    Centres are uniform per square degree over 360 x 135 deg, so for a box of side s and a
    (convex) footprint of mean extents wx, wy and area a, the centre of an intersecting footprint
    lies in the Minkowski sum, of area s^2 + s (wx + wy) + a. Summed over sensors (share x the
    fraction whose bands cover the range) and times the datetime fraction, that is a quadratic
    in s; solve it for ``target``. The box area needed thus scales ~ 1/n. A box that contains
    the antimeridian also meets the ``P_ANTIMERIDIAN`` items centred on it whose latitude span
    (s + wy) overlaps: a term linear in s.
    """
    wx, wy, area = _mean_extents_deg(lat)
    k = (1 - P_ANTIMERIDIAN) * n_items * time_fraction / (360.0 * (LAT_MAX - LAT_MIN))
    weight = k * SHARES * match
    a, b, c = weight.sum(), (weight * (wx + wy)).sum(), (weight * area).sum()
    if on_antimeridian:
        am = P_ANTIMERIDIAN * n_items * time_fraction / (LAT_MAX - LAT_MIN) * SHARES * match
        b, c = b + am.sum(), c + (am * wy).sum()
    if a <= 0:
        return 1.0, 0.0
    side = max(float((-b + math.sqrt(b * b + 4 * a * max(target - c, 0.0))) / (2 * a)), 0.01)
    return side, float(a * side * side + b * side + c)


def make_queries(n_queries: int, seed: int = 0, *, n_items: int = 1_000_000, target_hits: float = 100.0,
                 p_antimeridian: float = 0.05) -> list[BenchQuery]:
    """``n_queries`` searches expected to return ~``target_hits`` items each out of ``n_items``.

    Datetime intervals are 1-2 years (whole days, inclusive), wavelength ranges one of
    ``WL_TEMPLATES`` with jitter (so no bound coincides with a band edge, which lie on a 0.05 nm
    grid), and the square box's side is solved for by ``box_side_for`` at the box's latitude.
    ``p_antimeridian`` of the boxes are centred on the antimeridian (west > east).
    """
    rng = np.random.default_rng([seed, 0xC0FFEE])
    names = list(WL_TEMPLATES)
    weights = np.array([WL_TEMPLATES[k][2] for k in names])
    out = []
    span_days = SPAN_S // 86400
    for _ in range(n_queries):
        kind = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        lo_t, hi_t, _w = WL_TEMPLATES[kind]
        lo, hi = lo_t + rng.uniform(-0.003, 0.003), hi_t + rng.uniform(-0.003, 0.003)
        days = int(rng.integers(365, 731))
        start_day = int(rng.integers(0, span_days - days + 1))
        start = np.datetime64("2015-01-01T00:00:00") + np.timedelta64(start_day, "D")
        end = start + np.timedelta64(days, "D") - np.timedelta64(1, "s")
        lat = float(rng.uniform(LAT_MIN + 2, LAT_MAX - 2))
        on_am = bool(rng.random() < p_antimeridian)
        side, expected = box_side_for(target_hits, n_items, lat, days / span_days, _match_fraction(lo, hi),
                                      on_antimeridian=on_am)
        half = side / 2
        lat = min(max(lat, -89.0 + half), 89.0 - half)
        lon = 180.0 + rng.uniform(-0.8, 0.8) * min(half, 90) if on_am else float(rng.uniform(-180, 180))
        half_lon = min(half, 179.0)
        w, e = (lon - half_lon + 180) % 360 - 180, (lon + half_lon + 180) % 360 - 180
        out.append(BenchQuery((round(float(w), 6), round(lat - half, 6), round(float(e), 6), round(lat + half, 6)),
                              f"{np.datetime_as_string(start, unit='s')}Z", f"{np.datetime_as_string(end, unit='s')}Z",
                              float(lo), float(hi), kind, round(expected, 1)))
    return out


# -- the baseline: stac-geoparquet through pyarrow ----------------------------------------------
def lon_ranges(w: float, e: float) -> list[tuple[float, float]]:
    """A bbox's longitude span as plain [a, b] ranges: two when it crosses the antimeridian."""
    return [(w, e)] if w <= e else [(w, 180.0), (-180.0, e)]


def query_geometry(bbox: Sequence[float]) -> shapely.Geometry:
    w, s, e, n = bbox
    boxes = [shapely_box(a, s, b, n) for a, b in lon_ranges(w, e)]
    return boxes[0] if len(boxes) == 1 else shapely.MultiPolygon(boxes)


def bbox_filter(bbox: Sequence[float]) -> pc.Expression:
    """Rows whose ``bbox`` struct can intersect ``bbox``; items with xmin > xmax cross +-180."""
    w, s, e, n = bbox
    xmin, xmax = pc.field("bbox", "xmin"), pc.field("bbox", "xmax")
    parts = []
    for a, b in lon_ranges(w, e):
        plain = (xmin <= xmax) & (xmin <= b) & (xmax >= a)
        # a crossing item spans [xmin, 180] and [-180, xmax]
        crossing = (xmin > xmax) & ((xmin <= b) | (xmax >= a))
        parts.append(plain | crossing)
    lon = functools.reduce(operator.or_, parts)
    return (pc.field("bbox", "ymin") <= n) & (pc.field("bbox", "ymax") >= s) & lon


def _timestamp(value: str | datetime) -> pa.Scalar:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return pa.scalar(value, type=pa.timestamp("us", tz="UTC"))


def geoparquet_search(path_or_dataset: str | Path | pads.Dataset, bbox: Sequence[float],
                      start: str | datetime, end: str | datetime, wl_lo_um: float, wl_hi_um: float) -> list[str]:
    """Ids of items whose geometry intersects ``bbox``, datetime in [start, end] and bands cover [lo, hi] um.

    bbox and datetime filters go to the parquet reader (row groups pruned on their statistics,
    rows filtered while scanning); then the wavelength check (``covers_rows``) on those rows; then
    shapely's exact intersection on the survivors.
    """
    ds = path_or_dataset if isinstance(path_or_dataset, pads.Dataset) else open_geoparquet(path_or_dataset)
    flt = (bbox_filter(bbox) & (pc.field("datetime") >= _timestamp(start))
           & (pc.field("datetime") <= _timestamp(end)))
    tbl = ds.to_table(columns=["id", "geometry", "bands"], filter=flt)
    if tbl.num_rows == 0:
        return []
    bands = tbl.column("bands")
    flat = pc.list_flatten(bands)  # (list_flatten and struct_field respect slice offsets)
    offsets = np.concatenate([[0], np.cumsum(pc.list_value_length(bands).fill_null(0).to_numpy())])
    ok = covers_rows(pc.struct_field(flat, "eo:center_wavelength").to_numpy(),
                     pc.struct_field(flat, "eo:full_width_half_max").to_numpy(), offsets, wl_lo_um, wl_hi_um)
    if not ok.any():
        return []
    keep = np.flatnonzero(ok)
    geoms = shapely.from_wkb(tbl.column("geometry").take(keep).to_numpy(zero_copy_only=False))
    hit = shapely.intersects(geoms, query_geometry(bbox))
    return tbl.column("id").take(keep[hit]).to_pylist()
