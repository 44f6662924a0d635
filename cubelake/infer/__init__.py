"""Inference tools: whole-scene tiled prediction into the lake, and the batch-size sweep.

>>> from cubelake.infer import load_model, predict_scene
"""

from __future__ import annotations

from .errors import InferError, ModelError
from .model import LoadedModel, load_model, measure_receptive_field, model_hash, save_model
from .spec import ModelSpec, Preprocessing

__all__ = ["InferError", "LoadedModel", "ModelError", "ModelSpec", "Preprocessing", "load_model",
           "measure_receptive_field", "model_hash", "save_model"]

# the batch-size sweep (helper A)
from .batch_sweep import run_sweep
from .measure import SweepSettings, Trial, measure_batch, run_trial
from .report import SweepReport, plot_sweep, write_report
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

__all__ += ["MemoryModel", "OomSearch", "Plateau", "SweepReport", "SweepSettings", "SweepSettingsError", "Trial",
            "elasticities", "find_plateau", "fit_memory", "measure_batch", "oom_search", "parse_batches",
            "plot_sweep", "run_sweep", "run_trial", "write_report"]
