"""Cutting a batch: windows copied out of resident chunks, scaled, filled and converted to tensors.

The plan says which samples a batch holds and which chunks they need; :class:`BatchCutter` copies each
window's pixels out of its chunks in the stored type (cast to float32 on the way), folds CF scale/offset
and normalisation into one multiply-add, sets nodata/outside pixels to the fill and drops samples below
``Sampling.min_valid``, then hands out torch tensors. Arrays are reused through :class:`BufferPool`. The
copy itself is compiled (:mod:`.kernels`): one pass per chunk, band by band, over every window of the batch.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from .epoch import EpochTable
from .kernels import cut_chunk, warm
from .metrics import LoaderMetrics
from .plan import COL, ROW, SCENE, EpochPlan, SampleTable
from .products._base import nodata_mask
from .reader import ChunkKey, ChunkReader
from .shared import Delivery, worker_pool
from .sources import ChunkSource
from .spectral import Spectral

if TYPE_CHECKING:
    from .dataset import Sampling

__all__ = ["BatchCutter", "BufferPool"]

# a batch whose cut reads at least this many stored bytes is cut on two threads (see BatchCutter._cut_all):
# below it, handing half to the helper costs more than it saves
SPLIT_BYTES = 4 * 2**20
_HELPER: tuple[int, ThreadPoolExecutor] | None = None


def _helper() -> ThreadPoolExecutor:
    """This process's one helper thread for cutting (a forked child makes its own)."""
    global _HELPER
    if _HELPER is None or _HELPER[0] != os.getpid():
        _HELPER = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="cubelake-cut"))
    return _HELPER[1]


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
        # per scene: the chunk bands the output takes, as the compiled cut wants them
        self._band_index = [np.arange(src.n_bands, dtype=np.int64) if b is None else np.ascontiguousarray(b, np.int64)
                            for src, b in zip(self.sources, self._bands, strict=True)]
        warm(src.dtype for src in self.sources)

    def _affine(self, norm_params: Sequence[tuple[np.ndarray, np.ndarray] | None]) -> tuple[np.ndarray, np.ndarray]:
        """Per scene: ``gain (scene, band)`` and ``offset (scene, band)`` taking stored values to the output
        (CF scale/offset and normalisation folded into one multiply-add)."""
        gains, offs = [], []
        for i, src in enumerate(self.sources):
            n = self.n_bands
            g = np.full(n, src.scale, np.float64)
            o = np.full(n, src.add_offset, np.float64)
            norm = norm_params[i]
            if norm is not None:  # (x * scale + offset - mean) / std
                g, o = g / norm[1], (o - norm[0]) / norm[1]
            gains.append(g)
            offs.append(o)
        return np.stack(gains).astype(np.float32), np.stack(offs).astype(np.float32)

    def cut(self, plan: EpochPlan, et: EpochTable, lo: int, hi: int, chunks: list[tuple[int, int]],
            reader: ChunkReader, metrics: LoaderMetrics, spectral: Spectral) -> dict[str, Any]:
        """Cut the batch's windows from their chunks: cast, scaled and filled in one pass per chunk."""
        table = et.table
        h, w = table.size
        idx = plan.order[lo:hi]
        rows = table.rows[idx]
        n = idx.size
        # in a DataLoader worker the batch is cut into a reused shared-memory buffer (see .shared)
        lease = worker_pool().take((n, self.n_bands, h, w)) if get_worker_info() is not None else None
        x = lease.array if lease is not None else self._buffers.get((n, self.n_bands, h, w), np.dtype(np.float32))
        aux_out = {name: np.full((n, nb, h, w), np.nan, np.float32) for name, nb in zip(self.aux, self._aux_bands, strict=True)}
        t_wait = metrics.chunk_wait_s
        t0 = time.perf_counter()
        by_chunk, outside = self._pieces(plan, lo, rows, chunks, (h, w))
        keep, bad, used = self._copy(x, by_chunk, outside, reader, spectral.fill, aux_out)
        sel = np.arange(n)  # the cut samples that end up in the batch
        if not keep.all():
            x, idx, rows, bad, sel = x[keep], idx[keep], rows[keep], bad[keep], sel[keep]
        scenes = rows[:, SCENE]
        invalid = 0
        if self.sampling.min_valid > 0 and bad.any():
            ok = 1.0 - bad / float(self.n_bands * h * w) >= self.sampling.min_valid
            invalid = int((~ok).sum())
            if invalid:
                x, idx, rows, scenes, sel = x[ok], idx[ok], rows[ok], scenes[ok], sel[ok]
        proj = spectral.projection
        if proj is not None:
            x = proj.apply(x)
        if x.dtype != np.dtype(spectral.dtype):
            x = x.astype(spectral.dtype)
        image = torch.from_numpy(x)
        if lease is not None:
            if x is lease.array:
                image = lease.tensor
            else:  # dropped samples, a projection or another dtype made a new array: the buffer goes back
                lease.give_back()
                lease = None
        label = self._batch_labels(table, idx, rows)
        metrics.add(samples=int(idx.size), bytes_used=used, dropped_samples=int((~keep).sum()), invalid_samples=invalid,
                    assemble_s=time.perf_counter() - t0 - (metrics.chunk_wait_s - t_wait))
        window = np.column_stack([rows[:, ROW], rows[:, COL], np.full(idx.size, h), np.full(idx.size, w)])
        out = {"image": image, "label": label, "scene": [self.sources[int(s)].scene_id for s in scenes],
               "window": torch.from_numpy(window.astype(np.int64)), "weight": torch.from_numpy(et.weight[idx])}
        if aux_out:
            out["aux"] = {name: torch.from_numpy(a if sel.size == n else a[sel]) for name, a in aux_out.items()}
        return Delivery(out, lease) if lease is not None else out

    def _pieces(self, plan: EpochPlan, lo: int, rows: np.ndarray, chunks: list[tuple[int, int]],
                size: tuple[int, int]) -> tuple[dict[ChunkKey, list[tuple[int, ...]]], np.ndarray]:
        """Per chunk, the parts of the batch's windows it holds (rows of :data:`~.kernels.PIECE_FIELDS`, an
        empty part for a chunk the plan lists that the window only touches), and each window's pixel count
        beyond the raster (padded windows)."""
        h, w = size
        by_chunk: dict[ChunkKey, list[tuple[int, ...]]] = {}
        outside = np.zeros(rows.shape[0], np.int64)
        for i in range(rows.shape[0]):
            s, r, c = (int(v) for v in rows[i])
            g = self.sources[s].grid
            if r < 0 or c < 0 or r + h > g.height or c + w > g.width:
                inside = max(0, min(r + h, g.height) - max(r, 0)) * max(0, min(c + w, g.width) - max(c, 0))
                outside[i] = h * w - inside
            for cpos in plan.chunks_of(lo + i):
                key = chunks[int(cpos)]
                cy, cx = divmod(key[1], g.n_cols)
                y0, x0 = cy * g.chunk_y, cx * g.chunk_x
                ry0, ry1 = max(r, y0, 0), min(r + h, y0 + g.chunk_y, g.height)
                rx0, rx1 = max(c, x0, 0), min(c + w, x0 + g.chunk_x, g.width)
                by_chunk.setdefault(key, []).append((i, ry0 - y0, max(ry0, ry1) - y0, rx0 - x0, max(rx0, rx1) - x0,
                                                     ry0 - r, rx0 - c))
        return by_chunk, outside

    def _copy(self, x: np.ndarray, by_chunk: dict[ChunkKey, list[tuple[int, ...]]], outside: np.ndarray,
              reader: ChunkReader, fill: float, aux_out: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
        """Copy every chunk's pieces into ``x``; the samples kept (every chunk they need was read), each
        sample's count of nodata values (pixels beyond the raster count in every band), and the bytes used."""
        keep = np.ones(x.shape[0], bool)
        bad = outside * x.shape[1]
        x[np.flatnonzero(outside)] = fill
        used = 0
        cuts: list[tuple[np.ndarray, int, np.ndarray]] = []  # (chunk, scene, pieces)
        for key, plist in by_chunk.items():
            arr = reader.get(key)
            pieces = np.array(plist, np.int64)
            if arr is None:
                keep[pieces[:, 0]] = False
                continue
            cuts.append((arr, key[0], pieces))
            pixels = int(((pieces[:, 2] - pieces[:, 1]) * (pieces[:, 4] - pieces[:, 3])).sum())
            used += pixels * self._band_index[key[0]].size * arr.itemsize
            for i, sy0, sy1, sx0, sx1, dy0, dx0 in plist if aux_out else ():
                if sy1 > sy0 and sx1 > sx0:
                    self._cut_aux(aux_out, i, key[0], key[1], reader, (sy0, sy1, sx0, sx1),
                                  (dy0, dy0 + sy1 - sy0, dx0, dx0 + sx1 - sx0))
        self._cut_all(x, cuts, fill, bad, split=used >= SPLIT_BYTES and get_worker_info() is None)
        return keep, bad, used

    def _cut_all(self, x: np.ndarray, cuts: list[tuple[np.ndarray, int, np.ndarray]], fill: float, bad: np.ndarray,
                 split: bool) -> None:
        """Cut every chunk's pieces into ``x``. With ``split``, the upper half of the bands is cut on a helper
        thread meanwhile (the kernel releases the GIL): without worker processes the cutting thread is otherwise
        one thread against the decode threads, and where the cut is the slower side (short windows over
        several chunks) the decode threads idle while it runs."""
        gain, off = self._affine_params

        def run(b0: float, b1: float, counts: np.ndarray) -> None:
            for arr, s, pieces in cuts:
                nb = self._band_index[s].size
                cut_chunk(arr, self._band_index[s], x, pieces, gain[s], off[s], self.sources[s].fill_value, fill,
                          counts, (int(nb * b0), int(nb * b1)))

        if not split or self.n_bands < 2:
            run(0.0, 1.0, bad)
            return
        upper = np.zeros_like(bad)
        job = _helper().submit(run, 0.5, 1.0, upper)
        try:
            run(0.0, 0.5, bad)
        finally:
            job.result()  # the helper writes into x: never return (or raise) while it still does
        bad += upper

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
