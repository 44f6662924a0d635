"""Cutting a batch: windows copied out of resident chunks, scaled, filled and converted to tensors.

The plan says which samples a batch holds and which chunks they need; :class:`BatchCutter` copies each
window's pixels out of its chunks in the stored type (cast to float32 on the way), folds CF scale/offset
and normalisation into one multiply-add, sets nodata/outside pixels to the fill and drops samples below
``Sampling.min_valid``, then hands out torch tensors. Arrays are reused through :class:`BufferPool`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .epoch import EpochTable
from .metrics import LoaderMetrics
from .plan import COL, ROW, SCENE, EpochPlan, SampleTable
from .products._base import nodata_mask
from .reader import ChunkReader
from .sources import ChunkSource
from .spectral import Spectral

if TYPE_CHECKING:
    from .dataset import Sampling

__all__ = ["BatchCutter", "BufferPool"]


class BufferPool:
    """Batch-sized arrays reused once nothing else refers to them.

    A fresh 32 MiB array per batch is a fresh ``mmap`` from the allocator, and faulting its pages
    in took about as long as cutting the batch. An array handed out in a tensor comes back when
    the consumer drops the tensor (its reference count falls back to the pool's own).
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._free: list[np.ndarray] = []

    def get(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        for a in self._free:
            # 3 = the pool's list, the loop variable and getrefcount's argument: nobody else holds it
            if a.shape == shape and a.dtype == dtype and sys.getrefcount(a) <= 3:
                return a
        a = np.empty(shape, dtype)
        self._free.append(a)
        if len(self._free) > self.size:
            self._free.pop(0)
        return a

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.size, self._free = state["size"], []



class BatchCutter:
    """Cuts batches for one dataset: its sources, selected bands, stored-to-output affine and labels."""

    def __init__(self, sources: Sequence[ChunkSource], bands: Sequence[np.ndarray | None], n_bands: int,
                 norm: Sequence[tuple[np.ndarray, np.ndarray] | None], sampling: Sampling,
                 labels: Sequence[np.ndarray | None], aux: Sequence[str] = (),
                 aux_sources: Sequence[ChunkSource] = ()) -> None:
        self.sources, self._bands, self.n_bands = list(sources), list(bands), n_bands
        self.sampling, self._labels = sampling, list(labels)
        self.aux, self.aux_sources = tuple(aux), list(aux_sources)  # scene i's layer k: aux_sources[i * len(aux) + k]
        bands_of = {name: {src.n_bands for src in self.aux_sources[k::len(aux)]} for k, name in enumerate(aux)}
        for name, nb in bands_of.items():
            if len(nb) > 1:
                raise ValueError(f"aux layer {name!r} has different band counts in different scenes ({sorted(nb)}); "
                                 "a batch needs one")
        self._aux_bands = [next(iter(bands_of[name])) for name in aux]
        self._buffers = BufferPool()
        self._affine_params = self._affine(norm)

    def _affine(self, norm_params: Sequence[tuple[np.ndarray, np.ndarray] | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per scene: ``gain (scene, band)``, ``offset (scene, band)`` and ``fill (scene,)`` taking stored values
        to the output (CF scale/offset and normalisation folded into one multiply-add); fill NaN = none."""
        gains, offs, fills = [], [], []
        for i, src in enumerate(self.sources):
            n = self.n_bands
            g = np.full(n, src.scale, np.float64)
            o = np.full(n, src.add_offset, np.float64)
            norm = norm_params[i]
            if norm is not None:  # (x * scale + offset - mean) / std
                g, o = g / norm[1], (o - norm[0]) / norm[1]
            gains.append(g)
            offs.append(o)
            fills.append(np.nan if src.fill_value is None else src.fill_value)
        return (np.stack(gains).astype(np.float32), np.stack(offs).astype(np.float32), np.array(fills, np.float64))

    def cut(self, plan: EpochPlan, et: EpochTable, lo: int, hi: int, chunks: list[tuple[int, int]],
            reader: ChunkReader, metrics: LoaderMetrics, spectral: Spectral) -> dict[str, Any]:
        """Cut the batch's windows from their chunks in the stored type, then convert all at once in torch."""
        table = et.table
        h, w = table.size
        idx = plan.order[lo:hi]
        rows = table.rows[idx]
        n = idx.size
        # windows are cast to float32 as they are copied out of the chunks: one pass, not two
        x = self._buffers.get((n, self.n_bands, h, w), np.dtype(np.float32))
        outside: np.ndarray | None = None  # (n, h, w): pixels beyond the raster (padded windows)
        aux_out = {name: np.full((n, nb, h, w), np.nan, np.float32) for name, nb in zip(self.aux, self._aux_bands, strict=True)}
        sel = np.arange(n)  # the cut samples that end up in the batch
        keep = np.ones(n, bool)
        masked = np.zeros(n, bool)  # samples touching a chunk with nodata
        used = 0
        t_wait = metrics.chunk_wait_s
        t0 = time.perf_counter()
        for i in range(n):
            s, r, c = (int(v) for v in rows[i])
            src = self.sources[s]
            g = src.grid
            bands = self._bands[s]
            if r < 0 or c < 0 or r + h > g.height or c + w > g.width:
                if outside is None:
                    outside = np.zeros((n, h, w), bool)
                outside[i] = True
                outside[i, max(r, 0) - r:min(r + h, g.height) - r, max(c, 0) - c:min(c + w, g.width) - c] = False
                x[i] = 0
                masked[i] = True
            for cpos in plan.chunks_of(lo + i):
                key = chunks[int(cpos)]
                arr = reader.get(key)
                if arr is None:
                    keep[i] = False
                    break
                masked[i] |= reader.has_fill(key)
                cy, cx = divmod(key[1], g.n_cols)
                y0, x0 = cy * g.chunk_y, cx * g.chunk_x
                ry0, ry1 = max(r, y0, 0), min(r + h, y0 + g.chunk_y, g.height)
                rx0, rx1 = max(c, x0, 0), min(c + w, x0 + g.chunk_x, g.width)
                if ry0 >= ry1 or rx0 >= rx1:
                    continue
                part = arr[:, ry0 - y0:ry1 - y0, rx0 - x0:rx1 - x0]
                dst = x[i, :, ry0 - r:ry1 - r, rx0 - c:rx1 - c]
                dst[...] = part if bands is None else part[bands]
                used += part.nbytes if bands is None else part.nbytes // part.shape[0] * bands.size
                if aux_out:
                    self._cut_aux(aux_out, i, s, key[1], reader, (ry0 - y0, ry1 - y0, rx0 - x0, rx1 - x0),
                                  (ry0 - r, ry1 - r, rx0 - c, rx1 - c))
        if not keep.all():
            x, idx, rows, masked, sel = x[keep], idx[keep], rows[keep], masked[keep], sel[keep]
            outside = outside[keep] if outside is not None else None
        scenes = rows[:, SCENE]
        ok = self._fill_and_scale(x, scenes, masked, outside, spectral.fill)
        invalid = int((~ok).sum()) if ok is not None else 0
        if invalid:
            x, idx, rows, scenes, sel = x[ok], idx[ok], rows[ok], scenes[ok], sel[ok]
        proj = spectral.projection
        if proj is not None:
            x = proj.apply(x)
        if x.dtype != np.dtype(spectral.dtype):
            x = x.astype(spectral.dtype)
        image = torch.from_numpy(x)
        label = self._batch_labels(table, idx, rows)
        metrics.add(samples=int(idx.size), bytes_used=used, dropped_samples=int((~keep).sum()), invalid_samples=invalid,
                    assemble_s=time.perf_counter() - t0 - (metrics.chunk_wait_s - t_wait))
        window = np.column_stack([rows[:, ROW], rows[:, COL], np.full(idx.size, h), np.full(idx.size, w)])
        out = {"image": image, "label": label, "scene": [self.sources[int(s)].scene_id for s in scenes],
               "window": torch.from_numpy(window.astype(np.int64)), "weight": torch.from_numpy(et.weight[idx])}
        if aux_out:
            out["aux"] = {name: torch.from_numpy(a if sel.size == n else a[sel]) for name, a in aux_out.items()}
        return out

    def _cut_aux(self, out: dict[str, np.ndarray], i: int, scene: int, chunk: int, reader: ChunkReader,
                 src: tuple[int, int, int, int], dst: tuple[int, int, int, int]) -> None:
        """Copy the part ``src`` (rows, cols in the chunk) of every aux layer's chunk into sample ``i``'s ``dst``,
        in physical units (CF scale/offset applied), nodata as NaN. A layer chunk that failed stays NaN."""
        na, n_main = len(self.aux), len(self.sources)
        for k, name in enumerate(self.aux):
            j = scene * na + k
            arr = reader.get((n_main + j, chunk))
            if arr is None:
                continue
            layer = self.aux_sources[j]
            stored = arr[:, src[0]:src[1], src[2]:src[3]]
            part = stored.astype(np.float32)
            part[nodata_mask(stored, layer.fill_value)] = np.nan
            if layer.scale != 1.0 or layer.add_offset != 0.0:
                part = part * np.float32(layer.scale) + np.float32(layer.add_offset)
            out[name][i, :, dst[0]:dst[1], dst[2]:dst[3]] = part

    def _fill_and_scale(self, x: np.ndarray, scenes: np.ndarray, masked: np.ndarray, outside: np.ndarray | None,
                        fill: float) -> np.ndarray | None:
        """Scale ``x`` in place and set its nodata, NaN and outside pixels to the fill; the samples valid
        enough to keep (``None``: no ``min_valid`` check was needed)."""
        gain, off, fillv = (v[scenes] for v in self._affine_params)
        mi = np.flatnonzero(masked)
        bad: np.ndarray | None = None
        if mi.size:  # nodata, NaN and outside pixels of the samples that can have them (before scaling)
            sub = x[mi]
            bad = np.isnan(sub)
            fills = fillv[mi]
            has = np.isfinite(fills)
            if has.any():  # stored values are exact in float32 for the integer types cubelake writes
                bad |= (sub == np.where(has, fills, np.nan).astype(np.float32)[:, None, None, None])
            if outside is not None:
                bad |= outside[mi][:, None]
        if not (np.all(gain == 1.0) and np.all(off == 0.0)):
            x *= gain[:, :, None, None]
            x += off[:, :, None, None]
        if bad is None:
            return None
        sub = x[mi]
        sub[bad] = fill
        x[mi] = sub
        if self.sampling.min_valid <= 0:
            return None
        frac = np.ones(x.shape[0])
        frac[mi] = 1.0 - bad.mean(axis=(1, 2, 3))
        return frac >= self.sampling.min_valid

    def _batch_labels(self, table: SampleTable, idx: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        if self.sampling.labels != "dense":
            return torch.from_numpy(table.labels[idx].astype(np.int64))
        h, w = table.size
        out = np.full((idx.size, h, w), -1, np.int64)
        for i in range(idx.size):
            s, r, c = (int(v) for v in rows[i])
            lab = self._labels[s]
            if lab is None:
                continue
            y0, y1 = max(r, 0), min(r + h, lab.shape[0])
            x0, x1 = max(c, 0), min(c + w, lab.shape[1])
            if y0 < y1 and x0 < x1:
                out[i, y0 - r:y1 - r, x0 - c:x1 - c] = lab[y0:y1, x0:x1]
        return torch.from_numpy(out)
