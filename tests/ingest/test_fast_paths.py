"""The pixel pass's fast paths give the bytes the plain paths give.

Pixel-interleaved reads (``GdalSource.read_pixels``), statistics over pixel-major blocks, COG tiles
from pixel-major blocks, and Zarr chunks the sink encodes and writes itself (with their BLAKE3 kept
for the tree hash) are each compared with the plain path on the same data: values, files and hashes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import zarr
from rasterio.transform import from_origin
from zarr.codecs import BloscCodec

from cubelake.cube import CFEncoder
from cubelake.grid import ChunkGrid, Window
from cubelake.hashing import file_blake3, tree_blake3
from cubelake.ingest.cog_writer import CogSettings, CogSink
from cubelake.ingest.sources import BandInfo, SourceOptions, discover, open_source
from cubelake.ingest.stats import ScanStats
from cubelake.ingest.zarr_writer import ZarrSink, to_band_major


def _cube(bands: int, height: int, width: int, dtype: str = "int16", seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-3000, 3000, (bands, height, width)).astype(dtype)


def _geotiff(path: Path, data: np.ndarray, interleave: str) -> Path:
    bands, height, width = data.shape
    with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=bands, dtype=str(data.dtype),
                       tiled=True, blockxsize=64, blockysize=64, interleave=interleave, crs="EPSG:32633",
                       transform=from_origin(500000, 5800000, 30, 30), nodata=-32768) as ds:
        ds.write(data)
    return path


@pytest.mark.parametrize("window", [Window(0, 0, 64, 64), Window(64, 128, 64, 72), Window(150, 10, 50, 190)])
def test_read_pixels_matches_band_read(tmp_path: Path, window: Window) -> None:
    data = _cube(6, 200, 200)
    source = open_source(discover([_geotiff(tmp_path / "pix.tif", data, "pixel")])[0], SourceOptions())
    assert source.pixel_interleaved
    pixels = source.read_pixels(window)
    assert pixels.flags.c_contiguous
    assert pixels.shape == (window.height, window.width, 6)
    np.testing.assert_array_equal(pixels.transpose(2, 0, 1), source.read(window))
    np.testing.assert_array_equal(source.read(window), data[:, window.row_off : window.row_end,
                                                          window.col_off : window.col_end])
    source.close()


def test_band_interleaved_file_is_not_read_by_pixels(tmp_path: Path) -> None:
    source = open_source(discover([_geotiff(tmp_path / "band.tif", _cube(3, 64, 64), "band")])[0], SourceOptions())
    assert not source.pixel_interleaved
    source.close()


@pytest.mark.parametrize(("dtype", "nodata"), [("int16", -32768.0), ("int16", -9999.0), ("uint16", 0.0),
                                                ("uint8", 255.0), ("int16", None)])
def test_stats_of_pixel_views_equal_band_major(dtype: str, nodata: float | None) -> None:
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    pixels = rng.integers(info.min, int(info.max) + 1, (70, 90, 9)).astype(dtype)
    if nodata is not None:
        pixels[rng.random(pixels.shape) < 0.3] = nodata
        pixels[:, :, 2] = nodata  # a band with no valid value
    view = pixels.transpose(2, 0, 1)
    fast, plain = ScanStats(9, nodata), ScanStats(9, nodata)
    fast.update(view)
    fast.update(view[:, 5:40, 7:60])  # not a whole pixel-major array: the copying path
    plain.update(np.ascontiguousarray(view))
    plain.update(np.ascontiguousarray(view[:, 5:40, 7:60]))
    assert fast.raw_dict() == plain.raw_dict()
    for name in ("pixels", "valid", "min", "max", "sum", "sumsq"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(plain, name))


def test_to_band_major_is_a_transpose() -> None:
    pixels = _cube(40, 33, 70).transpose(1, 2, 0).copy()
    out = np.empty((40, 33, 70), dtype="int16")
    np.testing.assert_array_equal(to_band_major(pixels, out, pixel_step=100, band_step=16), pixels.transpose(2, 0, 1))


def _zarr_array(path: Path, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str, fill: float) -> zarr.Array:
    return zarr.create_array(str(path), name="data", shape=shape, chunks=chunks, dtype=dtype, fill_value=fill,
                             compressors=[BloscCodec(cname="zstd", clevel=3, shuffle="shuffle", blocksize=1 << 20)])


def _write_units(sink: ZarrSink | zarr.Array, grid: ChunkGrid, data: np.ndarray, pixel_major: bool) -> None:
    for c in grid.chunks():
        w = grid.chunk_window(c)
        block = data[..., w.row_off : w.row_end, w.col_off : w.col_end]
        if pixel_major and block.ndim == 3:
            block = np.ascontiguousarray(block.transpose(1, 2, 0)).transpose(2, 0, 1)
        if isinstance(sink, ZarrSink):
            sink.write(w, block)
        else:
            sink[..., w.row_off : w.row_end, w.col_off : w.col_end] = block


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("dtype", "fill", "pixel_major", "ndim"), [
    ("int16", -32768, False, 3), ("int16", -32768, True, 3), ("float32", float("nan"), False, 3),
    ("float32", 0.0, True, 3), ("uint8", 0, False, 2)])
def test_zarr_sink_writes_zarr_pythons_bytes(tmp_path: Path, dtype: str, fill: float, pixel_major: bool,
                                             ndim: int) -> None:
    data = _cube(5, 150, 170, dtype)
    data[:, :64, 64:128] = fill  # one chunk of nothing but the fill value: left out by both
    if ndim == 2:
        data = data[0]
    shape, chunks = data.shape, ((5, 64, 64) if ndim == 3 else (64, 64))
    grid = ChunkGrid.square(150, 170, 64)
    _zarr_array(tmp_path / "zarr.zarr", shape, chunks, dtype, fill)
    _write_units(zarr.open_array(str(tmp_path / "zarr.zarr"), path="data", mode="r+"), grid, data, pixel_major)
    _zarr_array(tmp_path / "sink.zarr", shape, chunks, dtype, fill)
    sink = ZarrSink(tmp_path / "sink.zarr")
    _write_units(sink, grid, data, pixel_major)

    assert _files(tmp_path / "sink.zarr") == _files(tmp_path / "zarr.zarr")
    written = {f"data/c/{'0/' if ndim == 3 else ''}{c.iy}/{c.ix}" for c in grid.chunks()} - {
        f"data/c/{'0/' if ndim == 3 else ''}0/1"}
    assert set(sink.hashes) == written
    for rel, (size, digest) in sink.hashes.items():
        path = tmp_path / "sink.zarr" / rel
        assert (path.stat().st_size, file_blake3(path)) == (size, digest)
    assert tree_blake3(tmp_path / "sink.zarr", sink.hashes) == tree_blake3(tmp_path / "zarr.zarr")
    read = zarr.open_array(str(tmp_path / "sink.zarr"), path="data", mode="r")[...]
    np.testing.assert_array_equal(read, data)


def test_zarr_sink_rewrites_a_chunk_that_became_fill(tmp_path: Path) -> None:
    _zarr_array(tmp_path / "s.zarr", (2, 64, 64), (2, 64, 64), "int16", -1)
    sink = ZarrSink(tmp_path / "s.zarr")
    sink.write(Window(0, 0, 64, 64), np.ones((2, 64, 64), dtype="int16"))
    assert (tmp_path / "s.zarr/data/c/0/0/0").is_file()
    sink.write(Window(0, 0, 64, 64), np.full((2, 64, 64), -1, dtype="int16"))
    assert not (tmp_path / "s.zarr/data/c/0/0/0").exists()
    assert sink.hashes == {}


def test_zarr_sink_falls_back_to_zarr_for_shards(tmp_path: Path) -> None:
    zarr.create_array(str(tmp_path / "sh.zarr"), name="data", shape=(3, 128, 128), chunks=(3, 32, 32),
                      shards=(3, 64, 64), dtype="int16", fill_value=0)
    sink = ZarrSink(tmp_path / "sh.zarr")
    data = _cube(3, 128, 128)
    for r in (0, 64):
        for c in (0, 64):
            sink.write(Window(r, c, 64, 64), data[:, r : r + 64, c : c + 64])
    assert sink.hashes == {}
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "sh.zarr"), path="data")[...], data)


def test_cog_tiles_from_pixel_major_blocks_are_the_same_file(tmp_path: Path) -> None:
    data = _cube(7, 150, 170)

    def write(target: Path, pixel_major: bool) -> bytes:
        sink = CogSink(target, shape=(7, 150, 170), encoding=CFEncoder("int16", fill_value=-32768),
                       transform=(30.0, 0.0, 500000.0, 0.0, -30.0, 5800000.0), crs_wkt=None,
                       bands=[BandInfo(i, f"b{i}") for i in range(1, 8)], tags={"A": "1"},
                       settings=CogSettings(chunk=64, level=3))
        grid = ChunkGrid.square(150, 170, 64)
        for c in grid.chunks():
            w = grid.chunk_window(c)
            block = data[:, w.row_off : w.row_end, w.col_off : w.col_end]
            if pixel_major:
                block = np.ascontiguousarray(block.transpose(1, 2, 0)).transpose(2, 0, 1)
            sink.write(w, block)
        sink.finish()
        return target.read_bytes()

    assert write(tmp_path / "pix.tif", True) == write(tmp_path / "band.tif", False)
    with rasterio.open(tmp_path / "pix.tif") as ds:
        np.testing.assert_array_equal(ds.read(), data)
