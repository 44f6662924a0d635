"""Auxiliary rasters (a DSM, another sensor's bands, a class map) on other grids, warped onto the scene's grid.

An :class:`AuxSpec` names a raster file, a folder or a glob pattern of candidates. Per scene the
candidates are probed (header only: georeferencing, size, footprint, acquisition time), one is
chosen (:func:`plan_aux`), and it is warped by GDAL through a ``WarpedVRT`` onto the scene's grid,
one chunk row at a time, into ``aux_<name>`` in the scene's Zarr and ``<id>.aux_<name>.tif``
beside the cube (:func:`write_aux`). The warp uses exact coordinate transformations (not GDAL's
default 1/8-pixel approximation), so every pixel is what ``gdalwarp -et 0`` gives for it, however
the grid is split into windows.

A layer that cannot be aligned (no overlap, not georeferenced, no candidate in time, unreadable,
too large) is a warning of the scene, which is published without it; nothing of it is left behind.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np
import rasterio
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.errors import RasterioIOError
from rasterio.transform import Affine
from rasterio.vrt import WarpedVRT
from rasterio.windows import Window as RioWindow

from cubelake.grid import ChunkGrid, Window
from cubelake.products import aux_array_name, aux_cog_name
from cubelake.record import AUX_NAME_RE, AUX_RESERVED_NAMES, AuxCandidate, AuxLayer

from ._aux_candidates import (
    AuxError,
    AuxSource,
    Probed,
    TimeSpan,
    aux_candidates,
    days_text,
    is_pattern,
    overlap_fraction,
    probe_aux,
    raster_time,
    scene_span,
    select_candidate,
)
from .acqtime import AcquisitionTime
from .cog_writer import CogSink, layer_sink
from .report import Code, Issue, warning
from .sources import SceneMetadata
from .validate import Limits
from .zarr_writer import ZarrCodecSpec, ZarrSink, add_layer, remove_layer, update_layer_attrs

__all__ = [
    "AuxError", "AuxOutcome", "AuxPlan", "AuxSource", "AuxSpec", "LayerTarget", "TimeSpan", "aligned",
    "aux_candidates", "aux_name_problem", "not_aligned", "output_encoding", "parse_aux_arg", "parse_time_delta",
    "plan_aux", "plan_layer", "raster_time", "select_candidate", "warp_windows", "write_aux",
]

log = logging.getLogger(__name__)

Kind = Literal["continuous", "categorical"]
Method = Literal["nearest", "bilinear", "cubic"]
KINDS: tuple[str, ...] = ("continuous", "categorical")
METHODS: tuple[str, ...] = ("nearest", "bilinear", "cubic")
#: WarpedVRT refuses 0 (GDAL's "exact" transformer); this tolerance makes GDAL transform every point exactly.
_EXACT_TOLERANCE_PX = 1e-12
#: Memory of one warped window (all bands), bytes: a chunk row, split into column spans when wider.
_WINDOW_BYTES = 64 * 1024**2
_MAX_CLASSES = 256


# -- the user's request -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AuxSpec:
    """An auxiliary layer to align with every scene.

    ``name``: ``[a-z0-9_]{1,32}``, stored as ``aux_<name>``. ``path``: a raster file, a folder of
    rasters or a glob pattern (then each scene takes the candidate nearest its acquisition time).
    ``resampling``: ``None`` = ``nearest`` for categorical, ``bilinear`` for continuous layers.
    ``max_time_delta``: the largest time between scene and aux acquisition accepted (``None``: any).
    """

    name: str
    path: str | Path
    resampling: Method | None = None
    kind: Kind = "continuous"
    max_time_delta: timedelta | None = None

    def __post_init__(self) -> None:
        problem = aux_name_problem(self.name)
        if problem:
            raise ValueError(problem)
        if self.kind not in KINDS:
            raise ValueError(f"aux '{self.name}': kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.resampling is not None and self.resampling not in METHODS:
            raise ValueError(f"aux '{self.name}': resampling {self.resampling!r} is not one of {', '.join(METHODS)}")
        if self.kind == "categorical" and self.resampling not in (None, "nearest"):
            raise ValueError(f"aux '{self.name}': a categorical layer is resampled with nearest (interpolating "
                             f"class values invents classes), not {self.resampling}")
        if self.max_time_delta is not None and self.max_time_delta < timedelta(0):
            raise ValueError(f"aux '{self.name}': max_time_delta {self.max_time_delta} is negative")
        if not str(self.path):
            raise ValueError(f"aux '{self.name}': empty path")

    @property
    def method(self) -> Method:
        """The resampling used."""
        if self.resampling is not None:
            return self.resampling
        return "nearest" if self.kind == "categorical" else "bilinear"

    @property
    def several(self) -> bool:
        """Whether ``path`` names candidates to choose from (a folder or a glob pattern)."""
        return is_pattern(self.path) or Path(self.path).is_dir()

    def settings(self) -> dict[str, Any]:
        """What of the spec shapes the products (goes into the config hash)."""
        return {"name": self.name, "path": str(self.path), "kind": self.kind, "resampling": self.method,
                "max_time_delta_s": None if self.max_time_delta is None else self.max_time_delta.total_seconds()}


def aux_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an aux layer, or ``None``."""
    if not isinstance(name, str) or not AUX_NAME_RE.fullmatch(name):
        return f"aux name {name!r}: use 1-32 characters of a-z, 0-9 and _"
    if name in AUX_RESERVED_NAMES:
        return f"aux name {name!r} is reserved (the cube's own arrays); choose another"
    return None


def parse_aux_arg(text: str, max_time_delta: timedelta | None = None) -> AuxSpec:
    """``NAME=PATH[:RESAMPLING][:KIND]`` (``--aux``) as a spec; ``ValueError`` saying what is wrong."""
    name, sep, rest = text.partition("=")
    if not sep or not rest:
        raise ValueError(f"{text!r}: expected NAME=PATH[:RESAMPLING][:KIND], e.g. dsm=/data/dsm.tif:bilinear")
    words: dict[str, str] = {}
    while ":" in rest:  # trailing keywords only: a ':' inside a path stays part of it
        head, _, tail = rest.rpartition(":")
        slot = "resampling" if tail in METHODS else "kind" if tail in KINDS else None
        if slot is None or slot in words or not head:
            break
        words[slot], rest = tail, head
    return AuxSpec(name=name, path=rest, resampling=words.get("resampling"),  # type: ignore[arg-type]
                   kind=words.get("kind", "continuous"), max_time_delta=max_time_delta)  # type: ignore[arg-type]


_DURATION = re.compile(r"(\d+(?:\.\d*)?)\s*(w|d|h|m|s)", re.IGNORECASE)
_UNITS_S = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_time_delta(text: str) -> timedelta:
    """``3d``, ``12h``, ``1d12h``, ``90m``, ``30s``, ``2w`` (or bare seconds) as a timedelta."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d*)?", t):
        return timedelta(seconds=float(t))
    parts = _DURATION.findall(t)
    if not parts or _DURATION.sub("", t).strip():
        raise ValueError(f"{text!r}: give a duration such as 3d, 12h, 1d12h, 90m or 30s")
    return timedelta(seconds=sum(float(n) * _UNITS_S[u.lower()] for n, u in parts))


# -- planning a scene's layers -------------------------------------------------------------------
_WIDER = {"uint8": "uint16", "int8": "int16", "uint16": "uint32", "int16": "int32", "uint32": "int64",
          "int32": "int64", "int64": "int64", "uint64": "int64"}


def output_encoding(kind: str, dtype: str, nodata: float | None) -> tuple[str, float]:
    """``(dtype, fill)`` of a warped layer. Continuous: float (NaN fill). Categorical: the source's integer type
    and nodata; without a nodata, one type wider with a fill no source value can take (never a silent 0)."""
    dt = np.dtype(dtype)
    if kind == "continuous" or dt.kind == "f":
        return ("float64" if dt == np.float64 else "float32"), math.nan
    if nodata is not None and math.isfinite(nodata) and float(nodata).is_integer():
        info = np.iinfo(dt)
        if info.min <= nodata <= info.max:
            return dt.name, float(nodata)
    wide = np.dtype(_WIDER.get(dt.name, "int64"))
    info = np.iinfo(wide)
    return wide.name, float(info.max if wide.kind == "u" else info.min)


@dataclass(frozen=True, slots=True)
class AuxPlan:
    """One aux layer of one scene: the spec, the raster chosen, and how the warped layer is stored."""

    spec: AuxSpec
    source: AuxSource
    time_delta_s: float | None
    rejected: tuple[AuxCandidate, ...]
    dtype: str
    fill: float

    def settings(self) -> dict[str, Any]:
        """The spec and the file chosen (its size and mtime: a changed raster rebuilds the scene)."""
        return {**self.spec.settings(), "source": self.source.path, "size": self.source.size,
                "mtime_ns": self.source.mtime_ns}


@dataclass(frozen=True, slots=True)
class AuxOutcome:
    """What became of one aux layer of one scene (for the ingest result and the CLI)."""

    name: str
    aligned: bool
    message: str
    source: str | None = None
    code: Code | None = None
    time_delta_s: float | None = None
    valid_fraction: float | None = None
    rejected: tuple[AuxCandidate, ...] = ()

    def issue(self) -> Issue | None:
        """The scene's warning for a layer that was not aligned."""
        if self.aligned or self.code is None:
            return None
        return warning(self.code, self.message, where=f"aux {self.name}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "aligned": self.aligned, "message": self.message, "source": self.source,
                "code": None if self.code is None else str(self.code), "time_delta_s": self.time_delta_s,
                "valid_fraction": self.valid_fraction,
                "rejected": [c.model_dump(mode="json") for c in self.rejected]}


def not_aligned(spec: AuxSpec, exc: AuxError) -> AuxOutcome:
    """The outcome (and warning) of a layer the scene is published without."""
    where = "" if str(spec.path) in str(exc) else f" ({spec.path})"
    return AuxOutcome(spec.name, False, f"aux '{spec.name}'{where} not aligned: {exc}; the scene is published "
                                        "without it", code=exc.code, rejected=exc.rejected)


def _probe_for(path: Path, meta: SceneMetadata, limits: Limits) -> Probed:
    try:
        src = probe_aux(path, limits)
    except AuxError as exc:
        return Probed(str(path), None, exc)
    return Probed(src.path, src, None, overlap_fraction(meta, src))


def plan_layer(spec: AuxSpec, meta: SceneMetadata, acq: AcquisitionTime | None, limits: Limits) -> AuxPlan:
    """The raster ``spec`` contributes to this scene; :class:`AuxError` when none can be aligned."""
    if meta.transform is None or meta.crs_wkt is None:
        raise AuxError(Code.AUX_NOT_GEOREFERENCED,
                       f"the scene has no {'geotransform' if meta.transform is None else 'CRS'}; aux rasters are "
                       "aligned by their coordinates, so the scene must be georeferenced too")
    several = spec.several
    probed = [_probe_for(p, meta, limits) for p in aux_candidates(spec.path)]
    choice = select_candidate(probed, scene_span(acq), spec.max_time_delta, several)
    if choice.chosen is None or choice.chosen.source is None:  # a single file's reason is the message itself
        raise AuxError(choice.code or Code.AUX_UNREADABLE, choice.reason or "no candidate",
                       choice.rejected if several else ())
    src = choice.chosen.source
    dtype, fill = output_encoding(spec.kind, src.dtype, src.nodata)
    nbytes = src.count * meta.height * meta.width * np.dtype(dtype).itemsize
    if nbytes > limits.max_bytes:
        raise AuxError(Code.AUX_TOO_LARGE, f"{src.path}: {src.count} band(s) on the scene's grid make {nbytes} bytes, "
                                           f"more than --max-bytes ({limits.max_bytes})", choice.rejected)
    return AuxPlan(spec, src, choice.time_delta_s, choice.rejected, dtype, fill)


def plan_aux(specs: Sequence[AuxSpec], meta: SceneMetadata, acq: AcquisitionTime | None,
             limits: Limits) -> tuple[list[AuxPlan], list[AuxOutcome]]:
    """The layers to warp for one scene, and the outcomes of those that cannot be aligned."""
    plans: list[AuxPlan] = []
    failed: list[AuxOutcome] = []
    for spec in specs:
        try:
            plans.append(plan_layer(spec, meta, acq, limits))
        except AuxError as exc:
            failed.append(not_aligned(spec, exc))
    return plans, failed


# -- warping and storing -------------------------------------------------------------------------
def warp_windows(grid: ChunkGrid, pixel_bytes: int, budget: int = _WINDOW_BYTES) -> Iterator[Window]:
    """Chunk-aligned windows, row-major: one chunk row high, as many chunks wide as ``budget`` bytes allow."""
    per_chunk = max(1, pixel_bytes * grid.chunk_y * grid.chunk_x)
    span = max(1, budget // per_chunk) * grid.chunk_x
    for r0 in range(0, grid.height, grid.chunk_y):
        h = min(grid.chunk_y, grid.height - r0)
        for c0 in range(0, grid.width, span):
            yield Window(r0, c0, h, min(span, grid.width - c0))


@dataclass(frozen=True, slots=True)
class LayerTarget:
    """Where a scene's aux layers are stored, and the grid (the scene's) they are warped onto."""

    staged: Path
    scene_id: str
    zarr_path: Path | None  # the staged Zarr store, or None when the scene has none
    cog: bool  # write <id>.aux_<name>.tif
    chunk: int
    height: int
    width: int
    transform: tuple[float, float, float, float, float, float]
    crs_wkt: str
    codec: ZarrCodecSpec = field(default_factory=ZarrCodecSpec)
    window_bytes: int = _WINDOW_BYTES  # memory of one warped window (all bands)


@dataclass(slots=True)
class _Tally:
    """What the warp found: valid pixels (any band), and the class values of a categorical layer."""

    valid: int = 0
    classes: set[float] | None = None

    def add(self, block: np.ndarray, fill: float) -> None:
        ok = ~np.isnan(block) if math.isnan(fill) else block != fill
        self.valid += int(ok.any(axis=0).sum())
        if self.classes is not None:
            self.classes.update(np.unique(block[ok]).tolist())
            if len(self.classes) > _MAX_CLASSES:
                self.classes = None  # not a class map of a few classes; none are recorded


def _warp_into(plan: AuxPlan, target: LayerTarget, zarr: ZarrSink | None, cog: CogSink | None) -> _Tally:
    """Warp the chosen raster onto the scene grid window by window, into the sinks."""
    grid = ChunkGrid.square(target.height, target.width, target.chunk)
    tally = _Tally(classes=set() if plan.spec.kind == "categorical" else None)
    pixel_bytes = plan.source.count * np.dtype(plan.dtype).itemsize
    with rasterio.open(plan.source.path) as src, WarpedVRT(
        src, crs=CRS.from_wkt(target.crs_wkt), transform=Affine(*target.transform), width=target.width,
        height=target.height, resampling=Resampling[plan.spec.method], nodata=plan.fill, dtype=plan.dtype,
        tolerance=_EXACT_TOLERANCE_PX,
    ) as vrt:
        for w in warp_windows(grid, pixel_bytes, target.window_bytes):
            try:
                block = vrt.read(window=RioWindow(w.col_off, w.row_off, w.width, w.height))
            except RasterioIOError as exc:
                raise AuxError(Code.AUX_UNREADABLE,
                               f"{plan.source.path}: reading it failed while warping rows {w.row_off}-{w.row_end - 1} "
                               f"({exc.__cause__ or exc}); the file is damaged or truncated, re-copy it") from exc
            tally.add(block, plan.fill)
            if zarr is not None:
                zarr.write(w, block if block.shape[0] > 1 else block[0])
            if cog is not None:
                cog.write(w, block)
    return tally


def _layer_attrs(plan: AuxPlan) -> dict[str, Any]:
    """The Zarr array's attributes (the COG carries the same as CUBELAKE_AUX_* tags)."""
    src, spec = plan.source, plan.spec
    attrs: dict[str, Any] = {
        "long_name": f"auxiliary layer {spec.name} ({spec.kind}, {spec.method} from {Path(src.path).name})",
        "grid_mapping": "spatial_ref", "cubelake:aux_name": spec.name, "cubelake:kind": spec.kind,
        "cubelake:resampling": spec.method, "cubelake:source": src.path, "cubelake:source_crs": src.crs_wkt,
    }
    if src.time is not None:
        attrs["cubelake:source_datetime"] = src.time.text()
    if plan.time_delta_s is not None:
        attrs["cubelake:time_delta_s"] = plan.time_delta_s
    if src.count > 1:
        attrs["band_names"] = list(src.band_names)
    return attrs


def _fill_record(fill: float, dtype: str) -> float | int | str:
    return "NaN" if math.isnan(fill) else int(fill) if np.dtype(dtype).kind in "iu" else fill


def write_aux(plan: AuxPlan, target: LayerTarget) -> AuxLayer:
    """Warp one layer into the staged Zarr (``aux_<name>``) and COG (``<id>.aux_<name>.tif``); its record.

    On any failure, or when no warped pixel is valid, whatever was written of the layer is removed and
    the error raised (:class:`AuxError` for the latter), so the scene can be published without it.
    """
    spec, src = plan.spec, plan.source
    array = aux_array_name(spec.name)
    cog_path = target.staged / aux_cog_name(target.scene_id, spec.name) if target.cog else None
    nb, shape2 = src.count, (target.height, target.width)
    cog: CogSink | None = None
    try:
        zarr = None
        if target.zarr_path is not None:
            dims = ("y", "x") if nb == 1 else (f"{array}_band", "y", "x")
            chunks = (target.chunk, target.chunk) if nb == 1 else (nb, target.chunk, target.chunk)
            add_layer(target.zarr_path, array, dims=dims, shape=shape2 if nb == 1 else (nb, *shape2), chunks=chunks,
                      dtype=plan.dtype, fill=plan.fill, attrs=_layer_attrs(plan), codec=target.codec)
            zarr = ZarrSink(target.zarr_path, array)
        if cog_path is not None:
            tags = {f"CUBELAKE_AUX_{k.split(':', 1)[1].upper()}": str(v) for k, v in _layer_attrs(plan).items()
                    if k.startswith("cubelake:")}
            cog = layer_sink(cog_path, shape=(nb, *shape2), dtype=plan.dtype, fill=plan.fill,
                             transform=target.transform, crs_wkt=target.crs_wkt, band_names=src.band_names,
                             tags=tags, chunk=target.chunk)
        tally = _warp_into(plan, target, zarr, cog)
        if tally.valid == 0:
            raise AuxError(Code.AUX_NO_OVERLAP, f"{src.path}: no pixel of the scene gets a valid value (the overlap "
                                                "holds only the aux raster's nodata)", plan.rejected)
        if cog is not None:
            cog.finish()
        valid = round(tally.valid / (target.height * target.width), 6)
        classes = sorted(tally.classes) if tally.classes is not None else None
        if target.zarr_path is not None:
            update_layer_attrs(target.zarr_path, array, {"cubelake:valid_fraction": valid,
                                                         **({"cubelake:classes": classes} if classes else {})})
    except BaseException:
        if cog is not None:
            cog.abort()
        _discard(target, array, cog_path)
        raise
    return AuxLayer(
        name=spec.name, kind=spec.kind, resampling=spec.method, source=src.path, source_crs=src.crs_wkt,
        source_datetime=src.time.text() if src.time else None, time_delta_s=plan.time_delta_s,
        valid_fraction=valid, dtype=plan.dtype, fill_value=_fill_record(plan.fill, plan.dtype), bands=nb,
        band_names=list(src.band_names), classes=classes,
        zarr_array=array if target.zarr_path is not None else None,
        cog=cog_path.name if cog_path is not None else None, candidates_rejected=list(plan.rejected),
    )


def _discard(target: LayerTarget, array: str, cog_path: Path | None) -> None:
    """Remove what a failed layer left in the staging folder (the rest of the scene stays)."""
    if target.zarr_path is not None:
        remove_layer(target.zarr_path, array)
    if cog_path is not None:
        with contextlib.suppress(FileNotFoundError):
            cog_path.unlink()


def aligned(plan: AuxPlan, layer: AuxLayer) -> AuxOutcome:
    """The outcome of a layer written."""
    delta = "" if layer.time_delta_s is None else f", {days_text(float(layer.time_delta_s))} from the scene"
    note = f"; {len(plan.rejected)} other candidate(s) passed over" if plan.rejected else ""
    return AuxOutcome(plan.spec.name, True,
                      f"aux '{plan.spec.name}' aligned from {plan.source.path} ({plan.spec.method}{delta}; "
                      f"{float(layer.valid_fraction or 0):.1%} of the scene has values){note}",
                      source=plan.source.path, time_delta_s=plan.time_delta_s,
                      valid_fraction=None if layer.valid_fraction is None else float(layer.valid_fraction),
                      rejected=plan.rejected)
