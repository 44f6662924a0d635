"""Inference tools: whole-scene tiled prediction into the lake, and the batch-size sweep.

>>> from cubelake.infer import PredictSettings, load_model, predict_scene, run_sweep, SweepSettings
>>> res = predict_scene("lake", "enmap_potsdam_tile_96_0", "hsi3d.pt", PredictSettings(device="cuda", dtype="bf16"))
>>> report = run_sweep("hsi3d.pt", SweepSettings(batches=(64, 128, 256, 512, 1024), device="cuda", find_oom=True))

Modules: :mod:`.spec` (what a model takes, and the training preprocessing, saved with it), :mod:`.model`
(TorchScript / ``torch.export`` files, the receptive field), :mod:`.tiling` (tiles, halos, blends: pure),
:mod:`.runner` (windows through the chunk reader, model inputs, batches), :mod:`.blocks` (a scene's
prediction as finished chunks), :mod:`.product` / :mod:`.item` (the Zarr + COG product and its STAC item),
:mod:`.predict` (into the lake, atomic and idempotent); :mod:`.sweep` (elasticity, plateau, OOM search,
memory model: pure), :mod:`.measure` / :mod:`._fresh` (one trial, in this or a fresh process),
:mod:`.batch_sweep` (the driver), :mod:`.report` (JSON + PNG). The package sits above the loaders, the
catalog and the core; nothing below imports it.
"""

from __future__ import annotations

from .batch_sweep import run_sweep
from .blocks import PredictSettings, PredictStats, predict_blocks
from .errors import InferError, ModelError
from .measure import SweepSettings, Trial, measure_batch, run_trial
from .model import LoadedModel, load_model, measure_receptive_field, model_hash, save_model
from .predict import PredictResult, predict_scene, predict_scenes
from .report import SweepReport, plot_sweep, write_report
from .spec import ModelSpec, Preprocessing
from .sweep import (
    MemoryModel,
    OomSearch,
    Plateau,
    SweepSettingsError,
    elasticities,
    find_plateau,
    fit_memory,
    oom_search,
    parse_batches,
)

__all__ = [
    "InferError", "LoadedModel", "MemoryModel", "ModelError", "ModelSpec", "OomSearch", "Plateau", "PredictResult",
    "PredictSettings", "PredictStats", "Preprocessing", "SweepReport", "SweepSettings", "SweepSettingsError", "Trial",
    "elasticities", "find_plateau", "fit_memory", "load_model", "measure_batch", "measure_receptive_field",
    "model_hash", "oom_search", "parse_batches", "plot_sweep", "predict_blocks", "predict_scene", "predict_scenes",
    "run_sweep", "run_trial", "save_model", "write_report",
]
