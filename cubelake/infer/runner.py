"""Running a model over one scene, tile by tile: windows read through the chunk-aware reader, preprocessed
as the training loader does, cut into model inputs, run in batches, and stitched (:mod:`.tiling`).

* :class:`WindowReader` reads a window of the scene from its chunks (:class:`~cubelake.loaders.reader.ChunkReader`:
  concurrent fetches, each chunk fetched and decoded once while it is resident; its budget is sized to
  hold the tile rows a window reaches), then applies the training loader's band steps in the same
  order: CF scale/offset, band selection, normalisation, nodata and out-of-raster pixels set to the
  fill, projection (PCA).
* :func:`run_tile_row` turns one tile row into model outputs: per-pixel models get one
  ``patch`` x ``patch`` neighbourhood per valid core pixel (the scene padded with the fill at its
  edges, as training's ``edge="pad"`` windows are), dense models get the window itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from cubelake.loaders.metrics import LoaderMetrics
from cubelake.loaders.normalise import normalisation
from cubelake.loaders.products import ChunkSource
from cubelake.loaders.products._base import nodata_mask
from cubelake.loaders.reader import ChunkReader, ReaderConfig
from cubelake.loaders.spectral import select_bands

from .errors import InferError, ModelError
from .model import LoadedModel
from .spec import Preprocessing
from .tiling import Box, Tile, TilePlan

__all__ = ["TileOutput", "WindowReader", "run_tile_row"]

log = logging.getLogger(__name__)


class WindowReader:
    """Preprocessed windows ``(channels, h, w)`` float32 of one scene, and which pixels are nodata."""

    def __init__(self, src: ChunkSource, pre: Preprocessing, plan: TilePlan, config: ReaderConfig | None = None,
                 stats_chunks: int = 4) -> None:
        self.src, self.pre, self.plan = src, pre, plan
        self.metrics = LoaderMetrics()
        cfg = config or ReaderConfig()
        rows = 2 * plan.lag + 3  # tile rows a window reaches, plus the next row being prefetched
        need = src.chunk_nbytes * plan.n_chunk_cols * plan.tile_chunks * rows
        cfg = replace(cfg, strict=True, cache_bytes=max(cfg.cache_bytes, need))
        self.bands = select_bands(src.wavelengths_nm, pre.wavelength_ranges_nm, src.url)
        self.n_selected = src.n_bands if self.bands is None else int(self.bands.size)
        self.gain, self.offset = self._affine(cfg, stats_chunks)
        self.projection = pre.matrix()
        if self.projection is not None and self.projection.matrix.shape[1] != self.n_selected:
            raise InferError(f"{src.url}: the model's projection takes {self.projection.matrix.shape[1]} bands, "
                             f"the scene gives {self.n_selected} after band selection")
        self.channels = self.n_selected if self.projection is None else int(self.projection.matrix.shape[0])
        self.reader = ChunkReader([src], cfg, self.metrics)

    def _affine(self, cfg: ReaderConfig, stats_chunks: int) -> tuple[np.ndarray, np.ndarray]:
        """Per selected band: ``gain``, ``offset`` taking stored values to model inputs (scale, offset, norm)."""
        src, pre, n = self.src, self.pre, self.n_selected
        g = np.full(n, src.scale, np.float64)
        o = np.full(n, src.add_offset, np.float64)
        if pre.normalize == "scene":
            mean, std = normalisation([src], [self.bands], "scene", cfg, stats_chunks)[0] or (0.0, 1.0)
        elif pre.normalize == "fixed":
            assert pre.mean is not None
            assert pre.std is not None
            if len(pre.mean) != n:
                raise InferError(f"{src.url}: the model's normalisation has {len(pre.mean)} band means, the scene "
                                 f"gives {n} bands after selection; select the bands the model was trained on")
            mean, std = np.asarray(pre.mean), np.asarray(pre.std)
        else:
            return g.astype(np.float32), o.astype(np.float32)
        return (g / std).astype(np.float32), ((o - mean) / std).astype(np.float32)

    def close(self) -> None:
        self.reader.close()

    def _key(self, cy: int, cx: int) -> tuple[int, int]:
        return (0, cy * self.src.grid.n_cols + cx)

    def prefetch(self, box: Box) -> None:
        self.reader.request([self._key(cy, cx) for cy, cx in self.plan.chunks_of(box)])

    def read(self, box: Box) -> tuple[np.ndarray, np.ndarray]:
        """``(x (channels, h, w) float32, nodata (h, w) bool)``: a pixel is nodata when all its bands are."""
        y0, y1, x0, x1 = box
        g = self.src.grid
        x = np.empty((self.n_selected, y1 - y0, x1 - x0), np.float32)
        for cy, cx in self.plan.chunks_of(box):
            arr = self.reader.get(self._key(cy, cx))
            assert arr is not None  # strict: a failed chunk raises ChunkReadError
            oy, ox = cy * g.chunk_y, cx * g.chunk_x
            a, b, c, d = max(y0, oy), min(y1, oy + g.chunk_y), max(x0, ox), min(x1, ox + g.chunk_x)
            part = arr[:, a - oy:b - oy, c - ox:d - ox]
            x[:, a - y0:b - y0, c - x0:d - x0] = part if self.bands is None else part[self.bands]
        bad = nodata_mask(x, self.src.fill_value)
        x *= self.gain[:, None, None]
        x += self.offset[:, None, None]
        x[bad] = self.pre.fill
        if self.projection is not None:
            x = self.projection.apply(x[None])[0]
        return x, np.asarray(bad.all(axis=0))


@dataclass(frozen=True)
class TileOutput:
    tile: Tile
    probs: np.ndarray  # (classes, window_h, window_w) float32
    nodata: np.ndarray  # (window_h, window_w) bool


def _to_device(x: np.ndarray, model: LoadedModel) -> torch.Tensor:
    t = torch.from_numpy(x)
    if model.device.startswith("cuda"):
        return t.pin_memory().to(model.device, dtype=model.dtype, non_blocking=True)
    return t.to(dtype=model.dtype)


def _forward(model: LoadedModel, x: np.ndarray) -> np.ndarray:
    """Probabilities ``(batch, classes, ...)`` float32 of a batch of inputs."""
    try:
        out = model(_to_device(x, model)).float()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise InferError(f"{model.path}: {model.device} ran out of memory on a batch of shape {tuple(x.shape)}; "
                         "give a smaller --batch (per-pixel models) or --tile-batch / --tile-chunks (dense "
                         "models); 'cubelake sweep --find-oom' finds the largest batch that fits") from None
    except RuntimeError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
        why = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"  # TorchScript puts the cause last
        hint = (" (a dense model that needs sizes divisible by N declares pad_to: N in its spec)"
                if model.spec.kind == "dense" and model.spec.pad_to == 1 else "")
        raise ModelError(f"{model.path}: the model failed on an input of shape {tuple(x.shape)}: {why[:600]}{hint}") from None
    k = model.spec.classes
    if out.ndim < 2 or out.shape[0] != x.shape[0] or out.shape[1] != k:
        raise ModelError(f"{model.path}: for input {tuple(x.shape)} the model gave {tuple(out.shape)}, expected "
                         f"(batch, {k}, ...) as its spec says ({k} classes)")
    if model.spec.output == "logits":
        out = torch.softmax(out, dim=1)
    return out.cpu().numpy()


def _layout(patches: np.ndarray, layout: str) -> np.ndarray:
    """``(batch, channels, p, p)`` patches in the model's input layout."""
    if layout == "BC":
        return np.ascontiguousarray(patches[:, :, 0, 0])
    if layout == "B1C":
        return np.ascontiguousarray(patches[:, None, :, 0, 0])
    return np.ascontiguousarray(patches[:, None] if layout == "B1CHW" else patches)


def _pixel_tile(model: LoadedModel, reader: WindowReader, tile: Tile, batch: int) -> TileOutput:
    """Each valid core pixel classified from its patch (the scene padded with the fill beyond its edges)."""
    p = model.spec.patch
    r = p // 2
    y0, y1, x0, x1 = tile.core
    box = (max(y0 - r, 0), min(y1 + r, reader.plan.height), max(x0 - r, 0), min(x1 + r, reader.plan.width))
    x, nodata = reader.read(box)
    padded = np.full((x.shape[0], y1 - y0 + 2 * r, x1 - x0 + 2 * r), reader.pre.fill, np.float32)
    oy, ox = box[0] - (y0 - r), box[2] - (x0 - r)
    padded[:, oy:oy + x.shape[1], ox:ox + x.shape[2]] = x
    core_nodata = nodata[y0 - box[0]:y1 - box[0], x0 - box[2]:x1 - box[2]]
    # (h, w, C, p, p) views, no copy: indexing them by pixel copies each batch's patches once, contiguous
    views = np.moveaxis(np.lib.stride_tricks.sliding_window_view(padded, (p, p), axis=(1, 2)), 0, 2)
    ys, xs = np.nonzero(~core_nodata)
    probs = np.full((model.spec.classes, y1 - y0, x1 - x0), np.nan, np.float32)
    for i in range(0, ys.size, batch):
        yy, xx = ys[i:i + batch], xs[i:i + batch]
        patches = views[yy, xx]  # (b, C, p, p)
        probs[:, yy, xx] = _forward(model, _layout(patches, model.spec.layout)).T
    return TileOutput(Tile(tile.row, tile.col, tile.core, tile.core), probs, core_nodata)


def _padded(xs: list[np.ndarray], multiple: int, fill: float) -> np.ndarray:
    """The windows stacked, each padded at its bottom/right with ``fill`` up to a multiple of ``multiple``."""
    c, h, w = xs[0].shape
    ph, pw = -(-h // multiple) * multiple, -(-w // multiple) * multiple
    if (ph, pw) == (h, w):
        return np.stack(xs)
    out = np.full((len(xs), c, ph, pw), fill, np.float32)
    for i, x in enumerate(xs):
        out[i, :, :h, :w] = x
    return out


def _dense_group(model: LoadedModel, xs: list[np.ndarray], fill: float) -> list[np.ndarray]:
    """Probabilities ``(classes, h, w)`` of equal-shaped windows run as one batch (padded to ``pad_to``, cropped)."""
    h, w = xs[0].shape[1:]
    batch = _padded(xs, model.spec.pad_to, fill)
    if model.spec.layout == "B1CHW":
        batch = batch[:, None]
    out = _forward(model, batch)
    if tuple(out.shape[2:]) != tuple(batch.shape[-2:]):
        raise ModelError(f"{model.path}: a dense model must give one output per input pixel; for a "
                         f"{batch.shape[-2]}x{batch.shape[-1]} window it gave {tuple(out.shape[2:])} (a model "
                         "that needs sizes divisible by N declares pad_to: N in its spec)")
    return list(out[:, :, :h, :w])


def run_tile_row(model: LoadedModel, reader: WindowReader, row: list[Tile], *, batch: int,
                 tile_batch: int) -> Iterator[TileOutput]:
    """The outputs of one tile row: per pixel model, ``batch`` patches per forward; dense, up to ``tile_batch``
    windows of equal shape per forward."""
    if model.spec.kind == "pixel":
        for tile in row:
            yield _pixel_tile(model, reader, tile, batch)
        return
    pending: list[tuple[Tile, np.ndarray, np.ndarray]] = []

    def flush() -> Iterator[TileOutput]:
        if pending:
            outs = _dense_group(model, [x for _, x, _ in pending], reader.pre.fill)
            for (t, _, nd), probs in zip(pending, outs, strict=True):
                probs[:, nd] = np.nan
                yield TileOutput(t, probs, nd)
            pending.clear()

    for tile in row:
        x, nodata = reader.read(tile.window)
        if pending and (pending[0][1].shape != x.shape or len(pending) >= tile_batch):
            yield from flush()
        pending.append((tile, x, nodata))
    yield from flush()
