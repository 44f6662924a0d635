"""The core geohash module: the vectorised encoder against the scalar one, and the catalog's re-export."""

from __future__ import annotations

import numpy as np
import pytest

import cubelake.catalog.geohash as catalog_geohash
from cubelake import geohash
from cubelake.geohash import BASE32, cell_bounds, encode, encode_many


def _edge_points(precision: int) -> tuple[np.ndarray, np.ndarray]:
    """The world's corners, exact cell edges at ``precision`` and the floats just below and above them."""
    bits = 5 * precision
    lon_edges = -180.0 + 360.0 * np.arange(0, 2 ** ((bits + 1) // 2) + 1, max(1, 2 ** ((bits + 1) // 2) // 64)) / 2 ** ((bits + 1) // 2)
    lat_edges = -90.0 + 180.0 * np.arange(0, 2 ** (bits // 2) + 1, max(1, 2 ** (bits // 2) // 64)) / 2 ** (bits // 2)
    lon = np.concatenate([lon_edges, np.nextafter(lon_edges, -np.inf), np.nextafter(lon_edges, np.inf)])
    lat = np.concatenate([lat_edges, np.nextafter(lat_edges, np.inf), np.nextafter(lat_edges, -np.inf)])
    k = max(lon.size, lat.size)
    lon, lat = np.resize(lon, k), np.resize(lat[::-1], k)
    corners = np.array([[180, 90], [-180, -90], [180, -90], [-180, 90], [0, 0], [-1e-300, -1e-300], [1e-300, 1e-300],
                        [179.99999999999997, 89.99999999999999], [-0.000001, -0.000001]])
    return np.concatenate([lon, corners[:, 0]]), np.concatenate([lat, corners[:, 1]])


@pytest.mark.parametrize("precision", range(1, 13))
def test_encode_many_equals_encode_on_random_and_edge_points(precision: int) -> None:
    rng = np.random.default_rng(precision)
    lon = np.concatenate([rng.uniform(-180, 180, 3000), _edge_points(precision)[0]])
    lat = np.concatenate([rng.uniform(-90, 90, 3000), _edge_points(precision)[1]])
    got = encode_many(lon, lat, precision)
    assert got.dtype == np.dtype(f"<U{precision}")
    want = [encode(float(x), float(y), precision) for x, y in zip(lon, lat, strict=True)]
    assert got.tolist() == want
    # and every point lies in its cell (edges belong to the cell above/right, the world's top/right edge inside)
    for x, y, c in zip(lon[:200], lat[:200], got[:200], strict=True):
        w, s, e, n = cell_bounds(str(c))
        assert w <= x <= e
        assert s <= y <= n


def test_encode_many_keeps_shape_and_clamps_out_of_range_like_encode() -> None:
    lon = np.array([[10.40744, -0.1278], [200.0, -500.0]])  # Jutland and London (known cells), beyond the world
    lat = np.array([[57.64911, 51.5074], [95.0, -91.0]])
    got = encode_many(lon, lat)
    assert got.shape == (2, 2)
    assert got.tolist() == [["u4pruy", "gcpvj0"], ["zzzzzz", "000000"]]
    assert got.tolist() == [[encode(float(x), float(y)) for x, y in zip(r, q, strict=True)] for r, q in zip(lon, lat, strict=True)]
    assert encode_many(np.array([np.inf]), np.array([-np.inf]), 3).tolist() == [encode(np.inf, -np.inf, 3)]
    assert encode_many(np.zeros(0), np.zeros(0)).shape == (0,)
    assert set("".join(encode_many(np.linspace(-180, 180, 999), np.linspace(-90, 90, 999), 4).tolist())) <= set(BASE32)


@pytest.mark.parametrize(("lon", "lat", "precision", "match"), [
    (np.zeros(3), np.zeros(3), 0, "integer from 1 to 12"),
    (np.zeros(3), np.zeros(3), 13, "integer from 1 to 12"),
    (np.zeros(3), np.zeros(3), True, "integer from 1 to 12"),
    (np.zeros(3), np.zeros(2), 6, "same shape"),
    (np.array([0.0, np.nan]), np.zeros(2), 6, "1 lon/lat values are NaN"),
])
def test_encode_many_refuses_bad_input(lon: np.ndarray, lat: np.ndarray, precision: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_many(lon, lat, precision)


def test_catalog_geohash_is_the_core_module_re_exported() -> None:
    for name in [*catalog_geohash.__all__, "MAX_CELLS", "intersects_cells"]:
        assert getattr(catalog_geohash, name) is getattr(geohash, name)
    assert catalog_geohash.__all__ == ["BASE32", "cell_bounds", "cover", "encode", "expand", "parse_prefix"]


def test_cover_is_a_true_cover_of_the_footprint_and_empty_for_nothing() -> None:
    import shapely
    from shapely.geometry import box

    from cubelake.geohash import cover

    foot = box(13.001, 52.001, 13.029, 52.018)
    cells = cover(foot, 6)
    assert cells == sorted(cells)
    assert cells
    union = shapely.union_all([box(*cell_bounds(c)) for c in cells])
    assert union.covers(foot)
    assert all(box(*cell_bounds(c)).intersects(foot) for c in cells)
    assert cover(shapely.Polygon(), 6) == []


def test_prefixes_are_lower_cased_and_checked() -> None:
    from cubelake.geohash import parse_prefix

    assert parse_prefix(" U33d ") == "u33d"
    for bad, match in [("", "is not valid"), ("u3a", r"\(not 'a'\)"), ("u" * 13, "longer than 12")]:
        with pytest.raises(ValueError, match=match):
            parse_prefix(bad)


def test_expand_names_every_cell_of_the_precision_under_a_prefix() -> None:
    from cubelake.geohash import expand

    cells = expand(["u3", "u4b"], 3)
    assert cells == sorted([f"u3{ch}" for ch in BASE32] + ["u4b"])
    assert expand(["u3q"], 3) == ["u3q"]


def test_the_first_quantisation_estimate_is_never_one_low() -> None:
    """Backs the justification in mutation/equivalent.toml: at, one ulp either side of, and between the dyadic
    edges of every precision on both axes, floor((v - lo) / step) never needs the upward correction."""
    rng = np.random.default_rng(1)
    for lo, span in ((-180.0, 360.0), (-90.0, 90.0 * 2)):
        for nbits in range(1, 31):
            step = span / (1 << nbits)
            edges = lo + rng.integers(0, 1 << nbits, 20_000) * step
            for v in (edges, np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf), rng.uniform(lo, lo + span, 20_000)):
                q = np.floor((v - lo) / step)
                assert not (v >= lo + (q + 1) * step).any(), (lo, nbits)


@pytest.mark.parametrize("cell", ["", "u", "u3", "u33", "s0000", "zzzzz", "7zzzzzzzzzz", "0"])
def test_the_children_cut_from_their_parent_have_exactly_cell_bounds(cell: str) -> None:
    """The cover's descent cuts a cell's 32 children from its bounds (8 x 4 or 4 x 8 by the parity of the bits
    so far); each must be bit for bit the child's own cell_bounds, in BASE32 order."""
    got = [tuple(b.bounds) for b in geohash._child_boxes(cell)]
    assert got == [cell_bounds(cell + ch) for ch in BASE32]
