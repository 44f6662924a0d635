"""Catalog fixtures: a lake of real scenes ingested once per session, synthetic STAC items for the
index alone, and an independent geohash decoder to check the catalog's covers against."""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from shapely.geometry import mapping, shape

from cubelake.catalog import geohash
from cubelake.ingest import IngestOptions, Outcome, ingest

from ..conftest import REAL

#: The official STAC extension schemas shared with the project (found like the real data: ../shared next
#: to the checkout); tests that need them fail, not skip, when they are missing.
SHARED_SCHEMAS = REAL.parent.parent / "schemas" / "stac-extensions"

#: The real scenes of the session lake, by kind (paths relative to the real-data folder).
REAL_SCENES: dict[str, tuple[str, ...]] = {
    # four 32x32 EnMAP L2A tiles over Potsdam, georeferenced, start_time tag 2022-07-24T10:45:26
    "enmap": tuple(f"hsi_enmap_potsdam/enmap_potsdam_tile_{t}.tif" for t in ("96_0", "96_32", "128_0", "128_32")),
    # two Landsat 8 scenes (one band each) with CLOUD_COVER in their MTL files
    "landsat": ("landsat8_rio_toa/LC81060712016134LGN00_MTL.txt", "landsat8_rio_toa/LC81390452014295LGN00_MTL.json"),
    # AVIRIS-NG radiance: time only in the file name; one georeferenced, one pixel grid
    "aviris": ("hsi_aviris_ng_isofit/topoflux/ang20160910t185702_2rdn_img.hdr",
               "hsi_aviris_ng_isofit/small_chunk/ang20170323t202244_rdn_7000-7010.hdr"),
    # a MATLAB cube: no georeferencing, no wavelengths, no time
    "samson": ("hsi_samson/samson_1.mat",),
}
PRODUCTS = ("cog", "zarr", "refs")


@dataclass(frozen=True)
class RealLake:
    """The session lake: its folder, scene ids by kind (as ingest named them) and the ingest time."""

    root: Path
    ids: dict[str, tuple[str, ...]]
    sources: dict[str, Path]  # scene id -> source path
    seconds: float

    @property
    def all_ids(self) -> list[str]:
        return sorted(i for ids in self.ids.values() for i in ids)


@pytest.fixture(scope="session")
def real_ingest(tmp_path_factory: pytest.TempPathFactory) -> RealLake:
    assert (REAL / "SOURCES.md").is_file(), f"real test data not found at {REAL}; set CUBELAKE_REAL_DATA"
    root = tmp_path_factory.mktemp("catalog") / "lake"
    paths = [REAL / p for kind in REAL_SCENES for p in REAL_SCENES[kind]]
    t0 = time.perf_counter()
    results = ingest(paths, root, IngestOptions(products=PRODUCTS, workers=2))
    seconds = time.perf_counter() - t0
    by_path = {Path(r.path).resolve(): r for r in results}
    assert len(results) == len(paths), [r.path for r in results]
    ids: dict[str, tuple[str, ...]] = {}
    sources: dict[str, Path] = {}
    for kind, rel in REAL_SCENES.items():
        got = []
        for p in rel:
            r = by_path[(REAL / p).resolve()]
            assert r.outcome is Outcome.INGESTED, f"{p}: {r.outcome} {r.message}"
            assert r.scene_id is not None
            got.append(r.scene_id)
            sources[r.scene_id] = REAL / p
        ids[kind] = tuple(got)
    return RealLake(root, ids, sources, seconds)


@pytest.fixture(scope="session")
def shared_schemas() -> Path:
    assert (SHARED_SCHEMAS / "eo.json").is_file(), f"official STAC extension schemas not found at {SHARED_SCHEMAS}"
    return SHARED_SCHEMAS


@pytest.fixture(scope="session")
def real_lake(real_ingest: RealLake) -> Path:
    """The folder of a lake holding the real scenes of ``REAL_SCENES`` (cog, zarr, refs). Read only."""
    return real_ingest.root


@pytest.fixture
def lake_copy(real_lake: Path, tmp_path: Path) -> Path:
    """A private copy of the real lake, for tests that change it (reindex, corrupt items)."""
    dst = tmp_path / "lake"
    shutil.copytree(real_lake, dst, symlinks=True)
    return dst


# -- synthetic items ---------------------------------------------------------------------------
UNKNOWN = "unknown"


@dataclass
class Synth:
    """What a synthetic item is made of; ``to_item()`` gives the STAC dict the index takes."""

    id: str
    collection: str = "synth"
    geometry: Any = None  # a shapely geometry in lon/lat, or None (no location)
    bbox: Sequence[float] | None = None  # default: the geometry's bounds
    datetime: str | None = None
    start: str | None = None
    end: str | None = None
    bands_um: Sequence[tuple[float | None, float | None]] = ()  # (centre, fwhm) in µm
    properties: dict[str, Any] = field(default_factory=dict)

    def to_item(self) -> dict[str, Any]:
        props: dict[str, Any] = {"datetime": self.datetime}
        if self.datetime is None and self.start is None:
            props.update({"start_datetime": "1970-01-01T00:00:00Z", "end_datetime": "2026-01-01T00:00:00Z",
                          "cubelake:datetime_source": UNKNOWN})
        else:
            if self.start is not None:
                props.update({"start_datetime": self.start, "end_datetime": self.end})
            props["cubelake:datetime_source"] = "metadata"
        bands = []
        for n, (c, w) in enumerate(self.bands_um, 1):
            b: dict[str, Any] = {"name": f"b{n}", "data_type": "int16", "nodata": -32768}
            if c is not None:
                b["eo:center_wavelength"] = c
            if w is not None:
                b["eo:full_width_half_max"] = w
            bands.append(b)
        props["bands"] = bands
        props["cubelake:band_count"] = len(bands)
        props["cubelake:geohash6"] = geohash.cover(self.geometry, 6) if self.geometry is not None else []
        props.update(self.properties)
        item: dict[str, Any] = {
            "type": "Feature", "stac_version": "1.1.0", "stac_extensions": [], "id": self.id,
            "collection": self.collection, "geometry": mapping(self.geometry) if self.geometry is not None else None,
            "properties": props, "links": [], "assets": {},
        }
        if self.geometry is not None:
            item["bbox"] = list(self.bbox) if self.bbox is not None else list(self.geometry.bounds)
        return item


def bands_of(item: dict[str, Any]) -> list[dict[str, Any]]:
    """An item's bands as STAC 1.1 puts them: on its data assets (all list the same), else in its properties."""
    lists = [a["bands"] for a in item.get("assets", {}).values() if "data" in a.get("roles", []) and "bands" in a]
    for other in lists[1:]:
        assert [(b["name"], b.get("eo:center_wavelength")) for b in other] == \
            [(b["name"], b.get("eo:center_wavelength")) for b in lists[0]], item["id"]
    return lists[0] if lists else item["properties"].get("bands", [])


def synth_item(sid: str, **kw: Any) -> dict[str, Any]:
    """A small STAC item dict for index-only tests (see :class:`Synth` for the keywords)."""
    return Synth(sid, **kw).to_item()


def spectrometer_um(lo_nm: float, hi_nm: float, step_nm: float,
                    gaps_nm: Sequence[tuple[float, float]] = ()) -> list[tuple[float, float]]:
    """(centre, fwhm) µm of contiguous bands (fwhm = step) from ``lo_nm`` to ``hi_nm``, minus ``gaps_nm``."""
    out = []
    c = lo_nm
    while c <= hi_nm + 1e-9:
        if not any(a <= c <= b for a, b in gaps_nm):
            out.append((round(c / 1000, 7), round(step_nm / 1000, 7)))
        c += step_nm
    return out


# -- an independent geohash (the textbook bit interleaving), to check the catalog's ---------------
_B32 = "0123456789bcdefghjkmnpqrstuvwxyz"


@functools.cache
def gh_bounds(cell: str) -> tuple[float, float, float, float]:
    """(west, south, east, north) of a geohash cell: its parent's, halved by its 5 bits (even bits: lon)."""
    if not cell:
        return -180.0, -90.0, 180.0, 90.0
    w, s, e, n = gh_bounds(cell[:-1])
    lon, lat = [w, e], [s, n]
    first = 5 * (len(cell) - 1)
    for k, bit in enumerate(format(_B32.index(cell[-1]), "05b"), start=first):
        rng = lon if k % 2 == 0 else lat
        mid = (rng[0] + rng[1]) / 2
        if bit == "1":
            rng[0] = mid
        else:
            rng[1] = mid
    return lon[0], lat[0], lon[1], lat[1]


def gh_encode(lon: float, lat: float, precision: int) -> str:
    """The geohash cell of a point."""
    cell = ""
    while len(cell) < precision:
        for ch in _B32:
            w, s, e, n = gh_bounds(cell + ch)
            if w <= lon < e and s <= lat < n:
                cell += ch
                break
        else:  # pragma: no cover - every point lies in one child
            raise AssertionError((lon, lat, cell))
    return cell


def geometry_of(item: dict[str, Any]) -> Any:
    return shape(item["geometry"]) if item.get("geometry") else None
