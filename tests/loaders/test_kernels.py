"""The compiled cut against numpy: windows of a chunk, cast, scaled and filled, for every stored type."""

from __future__ import annotations

import numpy as np
import pytest

from cubelake.loaders.kernels import cut_chunk, stored_fill


def _oracle(chunk: np.ndarray, bands: np.ndarray, shape: tuple[int, ...], pieces: np.ndarray, gain: np.ndarray,
            offset: np.ndarray, fill_value: float | None, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """What the cut must produce, written plainly: one numpy slice per piece."""
    out = np.full(shape, -7.0, np.float32)
    bad = np.zeros(shape[0], np.int64)
    for i, sy0, sy1, sx0, sx1, dy0, dx0 in pieces:
        part = chunk[bands][:, sy0:sy1, sx0:sx1]
        v = part.astype(np.float32) * gain[:, None, None] + offset[:, None, None]
        nod = np.isnan(part.astype(np.float64))
        if fill_value is not None:
            nod |= part == np.asarray(fill_value).astype(chunk.dtype)
        v[nod] = fill
        bad[i] += int(nod.sum())
        out[i, :, dy0:dy0 + sy1 - sy0, dx0:dx0 + sx1 - sx0] = v
    return out, bad


def _pieces(rng: np.random.Generator, n: int, chunk_hw: int, win: int) -> np.ndarray:
    """Random pieces: each sample's window clipped to a random sub-rectangle of the chunk."""
    rows = []
    for i in range(n):
        h, w = rng.integers(1, win + 1, 2)
        sy0, sx0 = rng.integers(0, chunk_hw - h + 1), rng.integers(0, chunk_hw - w + 1)
        dy0, dx0 = rng.integers(0, win - h + 1), rng.integers(0, win - w + 1)
        rows.append((i, sy0, sy0 + h, sx0, sx0 + w, dy0, dx0))
    return np.array(rows, np.int64)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16", "int32", "uint32", "float32", "float64"])
def test_cut_equals_numpy_for_every_stored_type(dtype: str) -> None:
    rng = np.random.default_rng(7)
    chunk = (rng.normal(0, 40, (9, 40, 40)) + 60).astype(dtype)
    fill_value = 0.0 if np.dtype(dtype).kind in "iu" else -9999.0
    chunk[2, 5:9, 5:30] = fill_value
    if np.dtype(dtype).kind == "f":
        chunk[4, 10:12, :] = np.nan
    bands = np.array([0, 2, 4, 8], np.int64)
    gain = np.array([1.0, 0.5, 2e-4, -3.0], np.float32)
    offset = np.array([0.0, -1.5, 0.1, 7.0], np.float32)
    pieces = _pieces(rng, 12, 40, 16)
    shape = (12, 4, 16, 16)
    out = np.full(shape, -7.0, np.float32)
    bad = np.zeros(12, np.int64)
    cut_chunk(chunk, bands, out, pieces, gain, offset, fill_value, np.nan, bad)
    want, want_bad = _oracle(chunk, bands, shape, pieces, gain, offset, fill_value, np.nan)
    assert want_bad.sum() > 0  # the pieces do reach nodata pixels
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(bad, want_bad)
    # no fill value: only NaN (float chunks) is nodata; every integer value is data
    out = np.full(shape, -7.0, np.float32)
    bad = np.zeros(12, np.int64)
    cut_chunk(chunk, bands, out, pieces, gain, offset, None, np.nan, bad)
    want, want_bad = _oracle(chunk, bands, shape, pieces, gain, offset, None, np.nan)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(bad, want_bad)
    assert (want_bad.sum() > 0) == (np.dtype(dtype).kind == "f")


def test_fill_values_a_stored_type_cannot_hold_never_match() -> None:
    assert np.isnan(stored_fill(-9999, np.dtype("uint16")))  # wrapped, it would hit real pixels (55537)
    assert np.isnan(stored_fill(0.5, np.dtype("int16")))
    assert np.isnan(stored_fill(None, np.dtype("int16")))
    assert stored_fill(-32768, np.dtype("int16")) == -32768.0
    assert stored_fill(0.1, np.dtype("float32")) == float(np.float32(0.1))  # as the stored type rounds it
    chunk = np.full((1, 4, 4), 55537, np.uint16)
    out, bad = np.zeros((1, 1, 4, 4), np.float32), np.zeros(1, np.int64)
    cut_chunk(chunk, np.zeros(1, np.int64), out, np.array([[0, 0, 4, 0, 4, 0, 0]], np.int64), np.ones(1, np.float32),
              np.zeros(1, np.float32), -9999, np.nan, bad)
    assert bad[0] == 0
    assert (out == 55537).all()
