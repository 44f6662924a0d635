"""Ingest: validate, calibrate and convert hyperspectral scenes into lake products.

>>> from cubelake.ingest import ingest, IngestOptions, load_profile
>>> results = ingest(["scene.tif"], "lake", IngestOptions(profile=load_profile("enmap-l2a")))
"""

from __future__ import annotations

from cubelake.cube import CFEncoder

from .align import AuxSpec
from .calibrate import BandSelection, CalibrationPlan, LinearCoder
from .pipeline import (
    PRODUCTS,
    IngestOptions,
    IngestResult,
    Outcome,
    ProgressEvent,
    ingest,
    ingest_one,
    ingest_scene,
    iter_ingest,
    iter_validate,
    prepare_lake,
    validate,
    validate_scene,
)
from .profile import SensorProfile, builtin_profiles, load_profile, match_profile
from .report import Code, Issue, Severity, ValidationReport
from .sources import SceneInput, SourceOptions, discover, open_source
from .thumbnail import ThumbnailSpec
from .validate import Limits
from .zarr_writer import ZarrCodecSpec

__all__ = [
    "PRODUCTS",
    "AuxSpec",
    "BandSelection",
    "CFEncoder",
    "CalibrationPlan",
    "Code",
    "IngestOptions",
    "IngestResult",
    "Issue",
    "Limits",
    "LinearCoder",
    "Outcome",
    "ProgressEvent",
    "SceneInput",
    "SensorProfile",
    "Severity",
    "SourceOptions",
    "ThumbnailSpec",
    "ValidationReport",
    "ZarrCodecSpec",
    "builtin_profiles",
    "discover",
    "ingest",
    "ingest_one",
    "ingest_scene",
    "iter_ingest",
    "iter_validate",
    "load_profile",
    "match_profile",
    "open_source",
    "prepare_lake",
    "validate",
    "validate_scene",
]
