"""One scene's prediction as a stream of finished chunks: settings, halo check, tiles -> model -> stitching.

:func:`predict_blocks` is the whole-scene pass without the lake: it yields every chunk of the
scene's grid once, row-major, as ``(cy, cx, classes, probabilities)`` with nodata set, holding at
most a few tile rows in memory. :mod:`.predict` writes them into a product.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from cubelake.loaders.products import ChunkSource
from cubelake.loaders.reader import ReaderConfig

from .errors import InferError
from .model import LoadedModel, measure_receptive_field
from .runner import WindowReader, run_tile_row
from .spec import ModelSpec, Preprocessing
from .tiling import BLENDS, Blend, Stitcher, TilePlan, blend_weights, plan_tiles

__all__ = ["DTYPES", "OUTPUTS", "Block", "PredictSettings", "PredictStats", "predict_blocks", "resolve_halo"]

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
OUTPUTS = ("classes", "probabilities")


@dataclass(frozen=True)
class PredictSettings:
    """How a scene is predicted.

    ``halo``: context pixels read around each tile (``None``: the model's receptive-field radius,
    declared in its spec or measured; per-pixel models always use ``patch // 2``). ``blend``: how
    overlapping tile outputs combine (:mod:`.tiling`). ``tile_chunks``: chunks per tile side.
    ``batch``: patches per forward pass (per-pixel models); ``tile_batch``: windows per forward pass
    (dense models). ``dtype``: compute precision; ``outputs``: ``classes`` and/or ``probabilities``;
    ``prob_dtype``: stored probabilities. ``strict_halo``: refuse (rather than warn about) a halo
    below the receptive field. ``preprocessing``: overrides the one saved with the model.
    """

    halo: int | None = None
    blend: Blend = "center"
    tile_chunks: int = 1
    batch: int = 1024
    tile_batch: int = 4
    device: str = "cpu"
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    outputs: tuple[str, ...] = OUTPUTS
    prob_dtype: Literal["float32", "float16"] = "float32"
    strict_halo: bool = False
    preprocessing: Preprocessing | None = field(default=None)

    def __post_init__(self) -> None:
        if self.blend not in BLENDS:
            raise InferError(f"blend {self.blend!r}: one of {', '.join(BLENDS)}")
        if self.dtype not in DTYPES:
            raise InferError(f"dtype {self.dtype!r}: one of {', '.join(DTYPES)}")
        if not self.outputs or set(self.outputs) - set(OUTPUTS):
            raise InferError(f"outputs {self.outputs!r}: one or both of {', '.join(OUTPUTS)}")
        if self.prob_dtype not in ("float32", "float16"):
            raise InferError(f"prob_dtype {self.prob_dtype!r}: float32 or float16")
        for what, v in (("tile_chunks", self.tile_chunks), ("batch", self.batch), ("tile_batch", self.tile_batch)):
            if v < 1:
                raise InferError(f"{what}={v}: must be >= 1")
        if self.halo is not None and not 0 <= self.halo <= 4096:
            raise InferError(f"halo={self.halo}: pixels, 0..4096")

    def identity(self, halo: int, kind: str) -> dict[str, Any]:
        """What determines the product's values (not where or how fast it ran): part of its inputs hash.
        Per-pixel models are blended by nothing and tiled to no effect: recorded as what ran."""
        d = {k: v for k, v in asdict(self).items() if k not in ("device", "batch", "tile_batch", "strict_halo",
                                                                  "preprocessing")}
        d.update(halo=halo, outputs=list(self.outputs))
        if kind == "pixel":
            d.update(blend="center", tile_chunks=None)
        return d

    def effective_preprocessing(self, spec: ModelSpec) -> Preprocessing:
        """The band steps this run applies: the settings' override, the model's own, or none."""
        return self.preprocessing or spec.preprocessing or Preprocessing()


@dataclass
class PredictStats:
    tiles: int = 0
    pixels: int = 0
    nodata_pixels: int = 0
    forward_s: float = 0.0
    wall_s: float = 0.0
    chunks_decoded: int = 0
    redecodes: int = 0
    halo: int = 0
    receptive_field: int | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Block:
    cy: int
    cx: int
    classes: np.ndarray | None  # (h, w); nodata = NODATA_CLASS of its dtype
    probs: np.ndarray | None  # (classes, h, w) float32; NaN nodata


def resolve_halo(model: LoadedModel, settings: PredictSettings, stats: PredictStats) -> int:
    """The halo to use, checked against the model's receptive field (warned about, or refused when strict)."""
    spec = model.spec
    if spec.kind == "pixel":
        need = spec.patch // 2
        if settings.halo is not None and settings.halo < need:
            raise InferError(f"halo {settings.halo} is below the {spec.patch}x{spec.patch} patch's radius {need}: "
                             f"a per-pixel model needs halo >= {need} (leave --halo out to use it)")
        stats.receptive_field = need
        return need
    rf = spec.receptive_field if spec.receptive_field is not None else measure_receptive_field(model)
    stats.receptive_field = rf
    halo = rf if settings.halo is None else settings.halo
    if halo < rf:
        msg = (f"halo {halo} px is below the model's receptive field ({rf} px"
               f"{' declared' if spec.receptive_field is not None else ' measured'}): tile edges will differ from a "
               f"whole-scene prediction (seams); use --halo {rf} or more")
        if settings.strict_halo:
            raise InferError(msg)
        log.warning("%s: %s", model.path, msg)
        stats.warnings.append(msg)
    return halo


def _blocks_of_row(plan: TilePlan, row: int, probs: np.ndarray, wsum: np.ndarray, nodata: np.ndarray,
                   settings: PredictSettings, classes_dtype: np.dtype[Any]) -> Iterator[Block]:
    """The chunks of one finished tile row."""
    y0 = plan.tiles[row][0].core[0]
    bad = (wsum <= 0) | nodata
    probs[:, bad] = np.nan
    cls = None
    if "classes" in settings.outputs:
        cls = np.argmax(np.nan_to_num(probs, nan=-1.0), axis=0).astype(classes_dtype)
        cls[bad] = np.iinfo(classes_dtype).max
    h = probs.shape[1]
    for cy in range(y0 // plan.chunk_y, (y0 + h - 1) // plan.chunk_y + 1):
        a, b = cy * plan.chunk_y - y0, min((cy + 1) * plan.chunk_y - y0, h)
        for cx in range(plan.n_chunk_cols):
            c, d = cx * plan.chunk_x, min((cx + 1) * plan.chunk_x, plan.width)
            yield Block(cy, cx, None if cls is None else cls[a:b, c:d],
                        probs[:, a:b, c:d] if "probabilities" in settings.outputs else None)


def predict_blocks(model: LoadedModel, src: ChunkSource, settings: PredictSettings, *, halo: int | None = None,
                   reader: ReaderConfig | None = None, stats: PredictStats | None = None) -> Iterator[Block]:
    """Predict the whole scene ``src`` and yield its chunks, row-major (see the module docstring).

    ``halo``: as :func:`resolve_halo` gave it (``None``: resolved here)."""
    stats = stats if stats is not None else PredictStats()
    t0 = time.perf_counter()
    if (model.device, model.dtype) != (settings.device, DTYPES[settings.dtype]):
        model.to(settings.device, DTYPES[settings.dtype])
    pre = settings.effective_preprocessing(model.spec)
    halo = stats.halo = resolve_halo(model, settings, stats) if halo is None else halo
    g = src.grid
    plan = plan_tiles(g.height, g.width, g.chunk_y, g.chunk_x, 0 if model.spec.kind == "pixel" else halo,
                      settings.tile_chunks)
    wr = WindowReader(src, pre, plan, reader)
    if wr.channels != model.spec.bands:
        wr.close()
        raise InferError(f"{src.url}: after preprocessing the scene gives {wr.channels} bands, the model "
                         f"{model.path.name} takes {model.spec.bands}; give the preprocessing it was trained with")
    classes_dtype = np.dtype(np.uint8 if model.spec.classes <= 255 else np.uint16)
    stitch = Stitcher(plan, model.spec.classes)
    nodata_rows: dict[int, np.ndarray] = {}
    blend: Blend = "center" if model.spec.kind == "pixel" else settings.blend
    try:
        for r, row in enumerate(plan.tiles):
            y0, y1 = row[0].core[:2]
            nodata_rows[r] = np.zeros((y1 - y0, g.width), bool)
            if r + 1 < len(plan.tiles):  # the next row's chunks load while this row runs
                nxt = plan.tiles[r + 1]
                wr.prefetch((nxt[0].window[0], nxt[0].window[1], 0, g.width))
            tf = time.perf_counter()
            for out in run_tile_row(model, wr, row, batch=settings.batch, tile_batch=settings.tile_batch):
                stitch.add(out.tile, out.probs, blend_weights(plan, out.tile, blend))
                _mark_nodata(nodata_rows[r], out, y0)
                stats.tiles += 1
            stats.forward_s += time.perf_counter() - tf
            for done, probs, wsum in stitch.finished(r):
                nd = nodata_rows.pop(done)
                stats.pixels += nd.size
                stats.nodata_pixels += int(nd.sum())
                yield from _blocks_of_row(plan, done, probs, wsum, nd, settings, classes_dtype)
    finally:
        stats.chunks_decoded, stats.redecodes = wr.metrics.chunks_decoded, wr.metrics.redecodes
        wr.close()
        stats.wall_s = time.perf_counter() - t0


def _mark_nodata(rows: np.ndarray, out: Any, y0: int) -> None:
    """Copy the core part of a tile's nodata mask into its tile row's mask."""
    ty0, ty1, tx0, tx1 = out.tile.core
    wy0, _, wx0, _ = out.tile.window
    rows[ty0 - y0:ty1 - y0, tx0:tx1] = out.nodata[ty0 - wy0:ty1 - wy0, tx0 - wx0:tx1 - wx0]
