"""Chunk-aware PyTorch loading of hyperspectral products.

>>> from torch.utils.data import DataLoader
>>> from cubelake.loaders import CubeDataset, Sampling
>>> ds = CubeDataset(["lake/scenes/a", "lake/scenes/b"], sampling=Sampling(size=32, stride=16))
>>> for batch in DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, pin_memory=True): ...

Import order: ``geo`` <- ``plan``, ``capacity`` (pure) <- ``samplers`` (pure strategies, areas, curriculum) <-
``epoch`` (the epoch's table, pure) <- ``cache`` <- ``products`` (zarr, refs, cog) <- ``sources`` <- ``metrics``,
``spectral`` <- ``reader`` <- ``batch`` <- ``dataset`` (wiring); ``planner`` measures a dataset and probes its
link for ``capacity``.
torch is imported by ``dataset`` only.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401  (checked here so a missing torch is one clear message, not a bare traceback)
except ModuleNotFoundError as _exc:  # pragma: no cover - exercised in a subprocess without torch
    raise ModuleNotFoundError(
        "cubelake.loaders needs PyTorch, which is not installed: pip install 'cubelake[torch]' "
        "(or install the torch build for your platform first, e.g. pip install torch)", name="torch") from _exc

from cubelake.grid import ChunkGrid

from .cache import DiskCache, coalesce
from .capacity import Link, Prediction, Workload, predict
from .dataset import CubeDataset, Sampling
from .epoch import EpochTable, RegionBalance
from .geo import Georef
from .metrics import LoaderMetrics
from .plan import EpochPlan, PlanSpec, Randomness, SampleTable, plan_epoch, randomness, shard_report
from .planner import plan_capacity, probe_link
from .reader import ChunkReader, ChunkReadError, ReaderConfig
from .samplers import Curriculum, LabelSampler, RandomSampler, Sampler, SceneView, SlidingSampler
from .sources import ChunkSource, ProductError, open_source, open_sources
from .spectral import Projection, Spectral, fit_pca, select_bands

__all__ = [
    "ChunkGrid",
    "ChunkReadError",
    "ChunkReader",
    "ChunkSource",
    "CubeDataset",
    "Curriculum",
    "DiskCache",
    "EpochPlan",
    "EpochTable",
    "Georef",
    "LabelSampler",
    "Link",
    "LoaderMetrics",
    "PlanSpec",
    "Prediction",
    "ProductError",
    "Projection",
    "RandomSampler",
    "Randomness",
    "ReaderConfig",
    "RegionBalance",
    "SampleTable",
    "Sampler",
    "Sampling",
    "SceneView",
    "SlidingSampler",
    "Spectral",
    "Workload",
    "coalesce",
    "fit_pca",
    "open_source",
    "open_sources",
    "plan_capacity",
    "plan_epoch",
    "predict",
    "probe_link",
    "randomness",
    "select_bands",
    "shard_report",
]
