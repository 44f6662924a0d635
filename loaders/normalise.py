"""Per-band normalisation statistics of the loader's scenes: recorded at ingest, or computed from a few chunks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .metrics import LoaderMetrics
from .products._base import nodata_mask
from .reader import ChunkReader, ReaderConfig
from .sources import ChunkSource, ProductError
from .spectral import band_stats

__all__ = ["normalisation", "scene_stats"]

log = logging.getLogger(__name__)

Stats = tuple[np.ndarray, np.ndarray]


def normalisation(sources: Sequence[ChunkSource], bands: Sequence[np.ndarray | None], mode: str,
                  reader: ReaderConfig, stats_chunks: int) -> list[Stats | None]:
    """Per scene ``(mean, std)`` of the selected bands (float32) for ``mode`` ``"scene"`` or ``"global"``
    (pooled over scenes, weighted by pixels); ``None`` each for ``"none"``. Missing statistics are computed
    from ``stats_chunks`` chunks and kept on the source."""
    if mode == "none":
        return [None] * len(sources)
    stats = []
    for s, b in zip(sources, bands, strict=True):
        st = s.stats
        if st is None or not np.isfinite(st["mean"]).all() or not np.isfinite(st["std"]).all():
            st = scene_stats(s, reader, stats_chunks)
            s.stats = st
        m, sd = (st["mean"], st["std"]) if b is None else (st["mean"][b], st["std"][b])
        stats.append((np.nan_to_num(m), np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)))
    if mode == "global":
        n = np.array([s.grid.height * s.grid.width for s in sources], float)[:, None]
        means = np.stack([m for m, _ in stats])
        var = np.stack([sd**2 for _, sd in stats])
        gm = (n * means).sum(0) / n.sum()
        gv = (n * (var + (means - gm) ** 2)).sum(0) / n.sum()
        stats = [(gm, np.sqrt(np.where(gv > 0, gv, 1.0)))] * len(sources)
    return [(m.astype(np.float32), sd.astype(np.float32)) for m, sd in stats]


def scene_stats(src: ChunkSource, config: ReaderConfig, n_chunks: int) -> dict[str, np.ndarray]:
    """Per-band physical mean/std from up to ``n_chunks`` stored chunks spread over the scene."""
    valid = src.valid_chunks()
    ids = np.flatnonzero(valid.ravel()) if valid is not None else np.arange(src.grid.n_chunks)
    if ids.size == 0:
        raise ProductError(f"{src.url}: no stored chunk to compute band statistics from (the scene is all nodata)")
    pick = ids[np.linspace(0, ids.size - 1, min(n_chunks, ids.size)).round().astype(int)]
    reader = ChunkReader([src], replace(config, strict=True), LoaderMetrics())
    try:
        reader.request([(0, int(k)) for k in pick])
        vals = []
        for k in pick:
            a = reader.get((0, int(k)))
            assert a is not None  # strict mode raises instead
            vals.append(a.reshape(a.shape[0], -1))
    finally:
        reader.close()
    raw = np.concatenate(vals, axis=1)
    ok = ~nodata_mask(raw, src.fill_value)
    phys = raw.astype(np.float64) * src.scale + src.add_offset
    log.info("%s: band statistics computed from %d chunks (none recorded at ingest)", src.url, len(pick))
    return band_stats(phys, ok & np.isfinite(phys))
