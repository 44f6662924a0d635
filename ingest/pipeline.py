"""``ingest``: validate, calibrate and convert scenes into a lake; ``validate``: the checks alone.

Per scene: open -> header checks -> plan (profile, bands, calibration) -> unchanged? skip ->
one pixel pass that checks every block and writes calibrated units into a private staging
folder -> COG compression and validation -> records -> one atomic rename into the lake.
A rejected scene leaves its report in ``rejected/`` and nothing else; other scenes go on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import rasterio

from cubelake import __version__
from cubelake.catalog.items import ITEM_FILE, item_from_record, item_json
from cubelake.catalog.lake import LakeCatalog
from cubelake.cube import CFEncoder, CubeSpec
from cubelake.errors import (
    CatalogError,
    ContentMismatchError,
    CubelakeError,
    LakeError,
    LakeFullError,
    NoCubeError,
    SceneNotFoundError,
    UnsupportedFormatError,
)
from cubelake.grid import ChunkGrid
from cubelake.hashing import file_blake3, tree_blake3
from cubelake.lake import AnyLake, Lake, atomic_write_text, is_disk_full, open_lake
from cubelake.record import (
    SCENE_RECORD_FILE,
    SCENE_RECORD_VERSION,
    Acquisition,
    AuxLayer,
    Band,
    BuildSettings,
    Calibration,
    Encoding,
    Footprint,
    Grid,
    Labels,
    ProductInfo,
    ProfileInfo,
    RecordIssue,
    SceneRecord,
    SourceFile,
    SourceInfo,
    Thumbnail,
    ValidationSummary,
    json_safe,
)
from cubelake.storage import join_url, url_of_gdal_path

from .acqtime import AcquisitionTime, acquisition_time
from .align import (
    AuxError,
    AuxOutcome,
    AuxPlan,
    AuxSpec,
    LayerTarget,
    aligned,
    not_aligned,
    plan_aux,
    write_aux,
)
from .cog_writer import CogSettings, CogSink, dataset_tags
from .footprint import ValidMask, footprint_from_mask
from .identity import (
    FileFingerprint,
    config_hash,
    content_hash,
    fingerprint_files,
    scene_id_for,
)
from .labels import LabelPlan, plan_labels, write_labels
from .plan import ScenePlan, build_plan
from .profile import SensorProfile, match_profile, near_profiles
from .report import Code, Issue, ValidationReport, error, warning
from .scan import ScanResult, scan
from .sources import (
    RasterSource,
    SceneInput,
    SceneKind,
    SceneMetadata,
    SourceOptions,
    discover,
    display_name,
    open_source,
)
from .sources.remote import remote_input
from .thumbnail import ThumbnailSpec, candidate_bands, choose_accumulated
from .thumbnail_writer import THUMBNAIL_FILE, ThumbnailSink, write_thumbnail
from .validate import Limits, check_dimensions, check_georeferencing, inspect_tiff, stats_issues
from .zarr_writer import ZarrCodecSpec, ZarrSink, create_zarr, finish_zarr

if TYPE_CHECKING:  # cubelake.refs (and zarr with it) is imported when references are built
    from cubelake.refs.layout import TiffLayout

__all__ = [
    "PRODUCTS",
    "IngestOptions",
    "IngestResult",
    "Outcome",
    "ProgressEvent",
    "ingest",
    "ingest_scene",
    "iter_ingest",
    "iter_validate",
    "validate",
    "validate_scene",
]

log = logging.getLogger(__name__)

PRODUCTS = ("cog", "zarr", "refs")
DEFAULT_PRODUCTS = ("cog", "zarr")
# Errors after which reading pixels is pointless or unsafe (bombs, missing data).
_NO_PIXEL_PASS = {
    Code.NOT_FOUND, Code.UNREADABLE, Code.NOT_A_RASTER, Code.CONTENT_MISMATCH, Code.DATA_FILE_MISSING,
    Code.TOO_LARGE, Code.BAD_DIMENSIONS, Code.UNSUPPORTED_DTYPE, Code.NO_CUBE, Code.NO_VALID_DATA,
    Code.BAD_METADATA,
}


class Outcome(StrEnum):
    INGESTED = "ingested"
    UNCHANGED = "unchanged"
    REJECTED = "rejected"
    FAILED = "failed"  # not the input's fault: an I/O or internal error while building


@dataclass(frozen=True, slots=True)
class IngestOptions:
    """What to build and how. ``profile=None`` picks a bundled profile by its match rules, else generic."""

    products: tuple[str, ...] = DEFAULT_PRODUCTS
    profile: SensorProfile | None = None
    chunk: int | None = None
    shard: int | None = None
    workers: int = max(1, os.cpu_count() or 1)
    limits: Limits = field(default_factory=Limits)
    source: SourceOptions = field(default_factory=SourceOptions)
    zarr_codec: ZarrCodecSpec = field(default_factory=ZarrCodecSpec)
    gdal_cache_bytes: int = 256 * 1024**2
    force: bool = False
    refs_format: Literal["auto", "json", "parquet"] = "auto"
    aux: tuple[AuxSpec, ...] = ()  # rasters on other grids, warped onto each scene's grid (cubelake.ingest.align)
    # the preview PNG (None: none). Not part of the config hash: a preview does not make the products differ,
    # so changing it alone re-renders nothing until the scene is built again (--force)
    thumbnail: ThumbnailSpec | None = field(default_factory=ThumbnailSpec)

    def __post_init__(self) -> None:
        unknown = [p for p in self.products if p not in PRODUCTS]
        if unknown or not self.products:
            raise ValueError(f"products must be a non-empty subset of {PRODUCTS}, got {list(self.products)}")
        object.__setattr__(self, "aux", tuple(self.aux))  # a list is accepted
        names = [a.name for a in self.aux]
        if len(set(names)) != len(names):
            raise ValueError(f"aux layer names must be unique, got {names}")


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """Progress of one scene: ``stage`` is 'open', 'scan', 'cog', 'refs', 'aux', 'thumbnail', 'publish' or 'done'."""

    path: str
    stage: str
    done: int = 0
    total: int = 0


@dataclass(slots=True)
class IngestResult:
    path: str
    scene_id: str | None
    outcome: Outcome
    report: ValidationReport
    message: str
    products: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    aux: list[AuxOutcome] = field(default_factory=list)  # each aux layer: aligned, or why not

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "scene_id": self.scene_id,
            "outcome": str(self.outcome),
            "message": self.message,
            "products": self.products,
            "seconds": round(self.seconds, 3),
            "errors": [i.to_dict() for i in self.report.errors],
            "warnings": [i.to_dict() for i in self.report.warnings],
            **({"aux": [a.to_dict() for a in self.aux]} if self.aux else {}),
        }


ProgressCallback = Callable[[ProgressEvent], None]


def _open_error(path: str, exc: Exception) -> Issue:
    if isinstance(exc, SceneNotFoundError):
        return error(Code.NOT_FOUND, str(exc))
    if isinstance(exc, ContentMismatchError):
        return error(Code.CONTENT_MISMATCH, str(exc))
    if isinstance(exc, UnsupportedFormatError):
        return error(Code.NOT_A_RASTER, str(exc))
    if isinstance(exc, NoCubeError):
        return error(Code.NO_CUBE, str(exc))
    return error(Code.UNREADABLE, str(exc) if path in str(exc) else f"{path}: {exc}")


_KIND_NAMES = {
    SceneKind.GDAL: "raster GDAL reads", SceneKind.ENVI: "valid ENVI header + data file",
    SceneKind.MAT: "MATLAB v5/v7.3 file", SceneKind.LANDSAT: "Landsat MTL with its band files",
    SceneKind.DLR: "EnMAP/DESIS METADATA.XML with its SPECTRAL_IMAGE",
    SceneKind.MISSING: "file", SceneKind.SPECIAL: "regular file",
}


@dataclass(slots=True)
class _Opened:
    source: RasterSource | None
    report: ValidationReport
    plan: ScenePlan | None = None
    labels: LabelPlan | None = None
    aux: list[AuxPlan] = field(default_factory=list)  # the aux layers to warp
    aux_failed: list[AuxOutcome] = field(default_factory=list)  # those that cannot be aligned (warned)


def _open_and_check(inp: SceneInput, options: IngestOptions) -> _Opened:
    """Open a scene and run every check that needs no pixel pass."""
    report = ValidationReport(path=inp.name)
    try:
        source = open_source(inp, _source_options(options))
    except CubelakeError as exc:
        report.extend([_open_error(inp.name, exc)])
        return _Opened(None, report)
    except MemoryError as exc:  # a hostile header can make a reader over-allocate
        report.extend([error(Code.TOO_LARGE, f"{inp.name}: reading the header ran out of memory ({exc})")])
        return _Opened(None, report)
    except Exception as exc:  # third-party parsers (GDAL, h5py, scipy) raise almost anything on damaged files
        log.debug("opening %s failed", inp.name, exc_info=True)
        report.extend([error(Code.UNREADABLE, f"{inp.name}: the {inp.kind.value} reader cannot read this file "
                                              f"({type(exc).__name__}: {exc}); it is damaged or not a "
                                              f"{_KIND_NAMES[inp.kind]}. Re-copy it, or check it opens in its own tools")])
        return _Opened(None, report)
    meta = source.meta
    report.format, report.shape, report.dtype = meta.format, meta.shape, meta.dtype
    report.extend(meta.issues)
    if inp.kind is SceneKind.ENVI and inp.data is None:
        report.extend([error(Code.DATA_FILE_MISSING,
                             f"{inp.name}: the ENVI header's data file is missing (looked for the header name "
                             "without .hdr, and with .img/.dat/.bsq/.bil/.bip/.raw); put it next to the header")])
    report.extend(check_dimensions(meta, options.limits))
    if any(i.code in (Code.TOO_LARGE, Code.BAD_DIMENSIONS) for i in report.errors):
        return _Opened(source, report)
    report.extend(check_georeferencing(meta))
    if meta.format in ("GTiff", "COG") and inp.kind is SceneKind.GDAL:
        report.extend(inspect_tiff(meta.path, meta.dtype, url=inp.url))
    profile = options.profile or match_profile(meta) or SensorProfile()
    plan, issues = build_plan(meta, profile, chunk=options.chunk)
    report.extend(issues)
    if options.profile is None and profile.match is None and not report.ok:
        report.extend(warning(Code.PROFILE_SUGGESTED,
                              f"no bundled profile matched this file by name or content, but {name} fits its "
                              f"{meta.count} bands; if the scene is one, ingest it with --profile {name}")
                      for name in near_profiles(meta))
    labels = None
    label_src = inp.labels
    if label_src is not None or getattr(source, "labels", None) is not None:
        labels, lab_issues = plan_labels(source, label_src)
        report.extend(lab_issues)
    opened = _Opened(source, report, plan, labels)
    if options.aux and report.ok:
        _plan_scene_aux(opened, inp, profile, options)
    return opened


def _plan_scene_aux(opened: _Opened, inp: SceneInput, profile: SensorProfile, options: IngestOptions) -> None:
    """Choose each aux layer's raster for this scene; a layer that cannot be aligned is a warning."""
    assert opened.source is not None
    meta = opened.source.meta
    acq = acquisition_time(meta.datetime, str(inp.path), profile.time, datetime.now(UTC))
    opened.aux, opened.aux_failed = plan_aux(options.aux, meta, acq, options.limits)
    opened.report.extend(i for i in (o.issue() for o in opened.aux_failed) if i is not None)


def _source_options(options: IngestOptions) -> SourceOptions:
    s = options.source
    if s.max_bytes is None:
        return dataclasses.replace(s, max_bytes=options.limits.max_bytes)
    return s


def _pixel_pass(opened: _Opened, options: IngestOptions, sinks: Sequence[Any], progress: Callable[[int, int], None] | None,
                chunk: int, shard: int | None, footprint: ValidMask | None = None) -> ScanResult:
    assert opened.source is not None
    meta = opened.source.meta
    grid = ChunkGrid.square(meta.height, meta.width, chunk)
    with rasterio.Env(GDAL_CACHEMAX=options.gdal_cache_bytes):
        result = scan(
            opened.source,
            grid,
            plan=opened.plan.calibration if opened.plan is not None else None,
            sinks=sinks,
            units_per_side=shard or 1,
            workers=options.workers,
            progress=progress,
            footprint=footprint,
        )
    nodata = opened.plan.calibration.nodata if opened.plan is not None else meta.nodata
    opened.report.extend(result.issues)
    if not result.issues:
        opened.report.extend(stats_issues(result.stats, meta, nodata))
    opened.report.band_stats = result.stats.raw_dict()
    opened.report.blocks_checked = result.units
    return result


def validate_scene(inp: SceneInput | str | Path, options: IngestOptions | None = None,
                   progress: ProgressCallback | None = None) -> ValidationReport:
    """Run every check on one scene (reading every block) without writing anything."""
    options = options or IngestOptions()
    if not isinstance(inp, SceneInput):
        found = discover([inp])
        if len(found) != 1:
            raise CubelakeError(f"{inp}: expected one scene, found {len(found)}; pass a single scene path")
        inp = found[0]
    with remote_input(inp) as ready:
        return _validate_scene(ready, options, progress)


def _validate_scene(inp: SceneInput, options: IngestOptions, progress: ProgressCallback | None) -> ValidationReport:
    opened = _open_and_check(inp, options)
    try:
        if opened.source is not None and not any(i.code in _NO_PIXEL_PASS for i in opened.report.errors):
            chunk = opened.plan.chunk if opened.plan else options.chunk or 256
            cb = (lambda d, t: progress(ProgressEvent(inp.name, "scan", d, t))) if progress else None
            _pixel_pass(opened, options, (), cb, chunk, None)
    finally:
        if opened.source is not None:
            opened.source.close()
    return opened.report


def iter_validate(paths: Sequence[str | Path], options: IngestOptions | None = None,
                  progress: ProgressCallback | None = None) -> Iterator[ValidationReport]:
    """Validate every scene found under ``paths``, yielding each report as it is done; one scene's
    failure is its report's error, never the end of the run."""
    for scene in discover(paths, labels=None):
        try:
            yield validate_scene(scene, options, progress)
        except Exception as exc:  # reported and counted, like a failed ingest; traceback with -vv
            log.debug("validating %s failed", scene.path, exc_info=True)
            report = ValidationReport(path=scene.name)
            report.extend([error(Code.UNREADABLE, f"{scene.name}: validation failed ({type(exc).__name__}: {exc}); "
                                                  "run again with -vv for the details")])
            yield report


def validate(paths: Sequence[str | Path], options: IngestOptions | None = None,
             progress: ProgressCallback | None = None) -> list[ValidationReport]:
    """Validate every scene found under ``paths``."""
    return list(iter_validate(paths, options, progress))


def _settings(plan: ScenePlan, options: IngestOptions, aux: Sequence[AuxPlan] = ()) -> dict[str, Any]:
    settings = {
        "profile": plan.profile.config_dict(),
        "products": sorted(options.products),
        "chunk": plan.chunk,
        "shard": options.shard if options.shard is not None else plan.profile.products.shard,
        "zarr_codec": dataclasses.asdict(options.zarr_codec),
        "calibration": plan.calibration.to_dict(),
    }
    if options.aux:  # only then: a lake ingested without aux layers keeps its config hashes
        taken = {a.spec.name: a.settings() for a in aux}
        settings["aux"] = [taken.get(s.name, {**s.settings(), "source": None}) for s in options.aux]
    return settings


def _keeping_products(options: IngestOptions, previous: SceneRecord | None) -> IngestOptions:
    """The products to build: those asked for, plus those the published version already has.

    Re-ingesting with ``--products refs`` must not delete the scene's COG and Zarr: a product
    once published stays (rebuilt with the new settings when anything changed).
    """
    had = set(previous.products if previous is not None else ()) & set(PRODUCTS)
    if had <= set(options.products):
        return options
    return dataclasses.replace(options, products=tuple(p for p in PRODUCTS if p in had | set(options.products)))


def _reject(lake: AnyLake, scene_id: str, inp: SceneInput, report: ValidationReport, t0: float,
            kept_previous: bool) -> IngestResult:
    record = {
        "scene_id": scene_id,
        "source": {"path": inp.url or (str(inp.path.resolve()) if inp.path.exists() else str(inp.path))},
        "rejected_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cubelake_version": __version__,
        "report": report.to_dict(),
    }
    path = lake.record_rejection(scene_id, record)
    note = " (the previously ingested version is kept)" if kept_previous else ""
    n = len(report.errors)
    return IngestResult(inp.name, scene_id, Outcome.REJECTED, report,
                        f"rejected{note}: {n} error{'s' if n != 1 else ''}, listed in the report {path}",
                        seconds=time.perf_counter() - t0)


def _dir_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ingest_scene(inp: SceneInput, lake: AnyLake, options: IngestOptions | None = None,
                 progress: ProgressCallback | None = None) -> IngestResult:
    """Validate, calibrate and convert one scene into ``lake``; never raises for bad input."""
    with remote_input(inp) as ready:  # an object that cannot be fetched fails this scene in ingest_one
        return _ingest_scene(ready, lake, options or IngestOptions(), progress)


def _ingest_scene(inp: SceneInput, lake: AnyLake, options: IngestOptions,
                  progress: ProgressCallback | None) -> IngestResult:
    t0 = time.perf_counter()

    def emit(stage: str, done: int = 0, total: int = 0) -> None:
        if progress:
            progress(ProgressEvent(inp.name, stage, done, total))

    emit("open")
    opened = _open_and_check(inp, options)
    report = opened.report
    source = opened.source
    try:
        with _claimed_id(lake, inp, source.meta.tags if source is not None else None) as scene_id:
            previous = lake.scene_record(scene_id)
            if not report.ok or source is None or opened.plan is None:
                if source is not None and not any(i.code in _NO_PIXEL_PASS for i in report.errors):
                    _pixel_pass(opened, options, (), None, options.chunk or 256, None)
                return _reject(lake, scene_id, inp, report, t0, previous is not None)
            wider = _keeping_products(options, previous)
            kept = [p for p in wider.products if p not in options.products]
            result = _build_or_skip(inp, lake, scene_id, opened, wider, previous, t0, emit)
            if kept:
                result.message += (f"; kept {', '.join(kept)} from the previous version"
                                   + (" (rebuilt with these settings)" if result.outcome is Outcome.INGESTED else ""))
            return result
    finally:
        if source is not None:
            source.close()


@contextlib.contextmanager
def _claimed_id(lake: AnyLake, inp: SceneInput, tags: dict[str, str] | None) -> Iterator[str]:
    """The scene's id, with its lock held. Two sources of one name ingested at once (two workers of a job)
    may both find the plain id free; the one that gets the lock second sees the other's record under it,
    so the id is looked up again under the lock until it is stable (never replacing another source's scene)."""
    scene_id = scene_id_for(lake, inp, tags)
    for _ in range(4):
        with lake.lock(scene_id):
            again = scene_id_for(lake, inp, tags)
            if again == scene_id:
                yield scene_id
                return
        scene_id = again
    raise LakeError(f"{inp.name}: its scene id kept changing while other ingests claimed it; run the ingest again")


@dataclass(frozen=True, slots=True)
class _BuildContext:
    """What every step of building one scene shares: the scene, its plan, the options, the lake.

    Only opened and planned scenes are built (:func:`ingest_scene` rejects the others first); the
    staging folder the products are written into is passed along with it.
    """

    inp: SceneInput
    lake: AnyLake
    scene_id: str
    opened: _Opened
    options: IngestOptions
    settings: dict[str, Any]  # what shapes the products (see _settings); its hash is cfg_hash
    cfg_hash: str
    t0: float  # perf_counter at the start of the scene
    emit: Callable[..., None]  # progress: emit(stage, done=0, total=0)

    @property
    def meta(self) -> SceneMetadata:
        assert self.opened.source is not None
        return self.opened.source.meta

    @property
    def plan(self) -> ScenePlan:
        assert self.opened.plan is not None
        return self.opened.plan

    @property
    def report(self) -> ValidationReport:
        return self.opened.report

    @property
    def shard(self) -> int | None:
        shard: int | None = self.settings["shard"]
        return shard

    def wants(self, product: str) -> bool:
        return product in self.options.products

    def staged_path(self, staged: Path, suffix: str) -> Path:
        """A product's path in the staging folder: ``<staged>/<scene id><suffix>``."""
        return staged / f"{self.scene_id}{suffix}"


def _build_or_skip(inp: SceneInput, lake: AnyLake, scene_id: str, opened: _Opened, options: IngestOptions,
                   previous: SceneRecord | None, t0: float, emit: Callable[..., None]) -> IngestResult:
    """Build the scene's products, unless the published version has the same content and settings."""
    assert opened.plan is not None
    assert opened.source is not None
    settings = _settings(opened.plan, options, opened.aux)
    cfg_hash = config_hash(settings)
    ctx = _BuildContext(inp, lake, scene_id, opened, options, settings, cfg_hash, t0, emit)
    meta = opened.source.meta
    files = list(meta.files) + ([str(inp.labels)] if inp.labels else [])
    if previous is None:
        # nothing to compare with: hash the source while the products are built
        return _guarded_build(ctx, _Background(lambda: fingerprint_files(files, None)), previous)
    prints = fingerprint_files(files, previous)
    c_hash = content_hash(prints)
    if (
        not options.force
        and previous.source.content_hash == c_hash
        and previous.config_hash == cfg_hash
    ):
        emit("done")
        return IngestResult(
            inp.name, scene_id, Outcome.UNCHANGED, opened.report,
            f"unchanged (content {c_hash[:12]}, config {cfg_hash[:12]}): nothing to do",
            products={k: join_url(lake.scene_location(scene_id) or "", v.path) for k, v in previous.products.items()},
            seconds=time.perf_counter() - t0,
        )
    return _guarded_build(ctx, _Background(lambda: prints), previous)


def _guarded_build(ctx: _BuildContext, hasher: _Background, previous: SceneRecord | None) -> IngestResult:
    """:func:`_build`, with a full device reported as such (where, how much is free, how much is needed)."""
    try:
        return _build(ctx, hasher, previous)
    except LakeFullError:
        raise
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        raise LakeFullError(
            f"{ctx.inp.path}: no space left for this scene's products in the lake {ctx.lake.root}: the "
            f"{ctx.lake.space_text(_estimated_bytes(ctx.opened, ctx.options))}. Nothing was published; free space "
            "(or use a --lake on another device) and run the same command again") from exc


def _estimated_bytes(opened: _Opened, options: IngestOptions) -> int | None:
    """An upper estimate of the products' size: the stored cube once per pixel product (before compression)."""
    if opened.plan is None or opened.source is None:
        return None
    meta, enc = opened.source.meta, opened.plan.calibration.encoding
    cube = opened.plan.calibration.n_out * meta.height * meta.width * np.dtype(enc.dtype).itemsize
    return cube * max(1, len({"cog", "zarr"} & set(options.products)))


def fault_point(name: str, scene_id: str | None = None) -> None:
    """Kill this process here when ``CUBELAKE_FAULT`` names this point, or ``point:scene_id`` (tests only)."""
    if os.environ.get("CUBELAKE_FAULT") in (name, f"{name}:{scene_id}"):
        log.warning("CUBELAKE_FAULT=%s: killing the process here", name)
        os.kill(os.getpid(), signal.SIGKILL)


class _Background:
    """Run one function in a thread; ``result()`` joins it and re-raises its error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as exc:  # handed to the caller by result()
                self._error = exc

        self._thread = threading.Thread(target=run, name="cubelake-hash", daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass(frozen=True, slots=True)
class _RefsPlan:
    """How the ``refs`` product is made: the source's tiles in place, or a COG written for it."""

    in_place: bool
    reason: str | None = None  # why the source is not referenced in place
    layout: TiffLayout | None = None
    encoding: CFEncoder | None = None


def _refs_plan(opened: _Opened, options: IngestOptions, local_lake: bool = True) -> _RefsPlan:
    assert opened.source is not None
    assert opened.plan is not None
    meta = opened.source.meta
    if not local_lake:
        return _RefsPlan(False, "the lake is on an object store: its references point inside it, at its own COG")
    if url_of_gdal_path(meta.files[0]) is not None:
        return _RefsPlan(False, "the source is on an object store: the lake's references point at its own COG")
    if meta.format != "GTiff" or len(meta.files) != 1:
        return _RefsPlan(False, f"the source is {meta.format}{' in several files' if len(meta.files) > 1 else ''}, not one GeoTIFF")
    from cubelake.refs.layout import read_layout

    try:
        layout = read_layout(meta.files[0])
    except Exception as exc:  # a damaged header can make tifffile raise almost anything; cogify instead
        return _RefsPlan(False, f"its TIFF header could not be parsed for references ({exc})")
    problems = layout.problems(options.chunk)
    if problems:
        return _RefsPlan(False, "; ".join(problems))
    encoding, why = opened.plan.calibration.as_reference()
    if encoding is None:
        return _RefsPlan(False, why)
    return _RefsPlan(True, None, layout, encoding)


def _write_scene_refs(ctx: _BuildContext, staged: Path, refs_plan: _RefsPlan,
                      cube_spec: CubeSpec) -> tuple[ProductInfo, str]:
    """Reference the source in place, or the staged COG beside the set; write the set into ``staged``.

    The scene's own COG is named relative to the set (``<id>.tif``), so the lake can be moved or
    copied; a source referenced in place keeps its absolute path (and its folder becomes an
    allowed root of the lake). Returns the product and a note for the result message.
    """
    from cubelake.refs.api import stat_target
    from cubelake.refs.build import reference_tiff
    from cubelake.refs.formats import PARQUET_THRESHOLD, write_refs
    from cubelake.refs.layout import read_layout

    ctx.emit("refs")
    if refs_plan.in_place:
        assert refs_plan.layout is not None
        assert refs_plan.encoding is not None
        src = Path(ctx.meta.files[0]).resolve()
        target = stat_target(str(src))
        layout = refs_plan.layout
        spec = dataclasses.replace(cube_spec, encoding=refs_plan.encoding)
        if ctx.lake.allow_root(str(src.parent)):
            log.info("%s: lake %s now allows references into %s", src, ctx.lake.root, src.parent)
        note = f"; refs point at the source's tiles in place ({src})"
    else:
        cog_path = ctx.staged_path(staged, ".tif")
        # publishing renames the folder: the name, size, mtime and content all stay
        target = dataclasses.replace(stat_target(str(cog_path)), url=cog_path.name)
        layout = read_layout(str(cog_path))
        spec = cube_spec
        note = f"; refs point at the COG, not the source, because {refs_plan.reason}"
    # a source's tiles must make training chunks; our own COG's tiles are the chunks
    refs = reference_tiff(layout, target, spec, tile_size_rule=refs_plan.in_place)
    fmt = ctx.options.refs_format
    if fmt == "auto":
        fmt = "parquet" if refs.n_chunks >= PARQUET_THRESHOLD and ctx.lake.is_local else "json"
    elif fmt == "parquet" and not ctx.lake.is_local:
        log.warning("%s: Parquet references are read from local lakes only; writing JSON to %s", ctx.scene_id,
                    ctx.lake.url)
        fmt = "json"
    path = write_refs(refs, ctx.staged_path(staged, f".refs.{'json' if fmt == 'json' else 'parq'}"), fmt)
    info = ProductInfo.model_validate({
        "path": path.name,
        "format": fmt,
        "bytes": _dir_size(path),
        "media_type": "application/json" if fmt == "json" else "application/vnd.apache.parquet",
        "zarr_format": 2,
        "chunks": refs.n_chunks,
        "in_place": refs_plan.in_place,
        "target": target.to_dict(),
        "reason_not_in_place": refs_plan.reason,
        # a JSON set is one file, a Parquet set a folder
        **({"blake3": file_blake3(path)} if path.is_file() else {"tree_blake3": tree_blake3(path)}),
    })
    return info, note


def _cube_spec(plan: ScenePlan, meta: SceneMetadata, scene_id: str, cfg_hash: str) -> CubeSpec:
    """What both pixel products describe: bands, grid, encoding, and the attributes that name the scene."""
    cal = plan.calibration
    data_attrs = {
        "long_name": cal.quantity or "calibrated values",
        **({"units": cal.unit} if cal.unit else {}),
        "cubelake:calibration": json.dumps(json_safe(cal.to_dict())),
    }
    return CubeSpec.from_bands(
        plan.bands,
        height=meta.height,
        width=meta.width,
        encoding=cal.encoding,
        transform=meta.transform,
        crs_wkt=meta.crs_wkt,
        attrs={"cubelake:scene_id": scene_id, "cubelake:source": display_name(meta.path),
               "cubelake:config_hash": cfg_hash, "cubelake:version": __version__,
               **({"cubelake:datetime": meta.datetime} if meta.datetime else {})},
        data_attrs=data_attrs,
    )


def _acquisition(inp: SceneInput, meta: SceneMetadata, profile: SensorProfile,
                 report: ValidationReport) -> AcquisitionTime:
    """The scene's acquisition time (metadata, file name or profile); a warning in ``report`` when unknown."""
    acq = acquisition_time(meta.datetime, str(inp.path), profile.time, datetime.now(UTC))
    if acq.source == "unknown":
        report.extend([warning(
            Code.UNKNOWN_TIME,
            ("the metadata's acquisition time " + repr(meta.datetime) + " is not ISO 8601, and "
             if meta.datetime else "no acquisition time in the metadata, ")
            + f"no time in the file name for profile '{profile.name}', and none in the profile: no "
            "datetime search will find this scene. Give time.filename_pattern or time.datetime in a profile")])
    return acq


def _build(ctx: _BuildContext, hasher: _Background, previous: SceneRecord | None) -> IngestResult:
    """Write the scene's products into a staging folder, then its records, and publish the folder.

    One pixel pass feeds every pixel product; a scene the pass finds invalid is rejected and
    nothing is published.
    """
    refs_plan = _refs_plan(ctx.opened, ctx.options, ctx.lake.is_local) if ctx.wants("refs") else None
    want_cog = ctx.wants("cog") or (refs_plan is not None and not refs_plan.in_place)
    if refs_plan is not None and not refs_plan.in_place:
        log.info("%s: referencing a COG copy, not the source, because %s", ctx.inp.path, refs_plan.reason)
    with ctx.lake.staging(ctx.scene_id) as staged:
        cube_spec = _cube_spec(ctx.plan, ctx.meta, ctx.scene_id, ctx.cfg_hash)
        zarr = _start_zarr(ctx, staged, cube_spec) if ctx.wants("zarr") else None
        cog = _start_cog(ctx, staged) if want_cog else None
        thumb = _start_thumbnail(ctx)
        valid_mask = ValidMask(ctx.meta.height, ctx.meta.width)
        result = _scan(ctx, zarr, cog, valid_mask, thumb)
        if not ctx.report.ok:
            if cog is not None:
                cog.abort()
            return _reject(ctx.lake, ctx.scene_id, ctx.inp, ctx.report, ctx.t0, previous is not None)
        products: dict[str, ProductInfo] = {}  # cog, refs, zarr: the order scene.json and the message list them
        if cog is not None:
            products["cog"] = _finish_cog(ctx, staged, cog)
        refs_note = ""
        if refs_plan is not None:
            products["refs"], refs_note = _write_scene_refs(ctx, staged, refs_plan, cube_spec)
        labels = _write_scene_labels(ctx, staged)
        aux_layers, aux_outcomes = _write_scene_aux(ctx, staged)
        measured = _measure(ctx, result, valid_mask, hasher)
        if zarr is not None:
            products["zarr"] = _finish_scene_zarr(ctx, staged, measured, zarr)
        thumbnail = _write_scene_thumbnail(ctx, staged, thumb, measured) if thumb is not None else None
        record = _scene_record(ctx, measured, products, labels, aux_layers, thumbnail)
        _write_records(staged, record, ctx.report)
        ctx.emit("publish")
        target = _publish(ctx.lake, staged, ctx.scene_id)
    ctx.emit("done")
    return _ingested(ctx, record, target, refs_note, [*ctx.opened.aux_failed, *aux_outcomes])


def _start_zarr(ctx: _BuildContext, staged: Path, cube_spec: CubeSpec) -> ZarrSink:
    """Create the Zarr store (metadata and coordinates) in ``staged``; its sink for the pixel pass."""
    path = ctx.staged_path(staged, ".zarr")
    labels = ctx.opened.labels
    create_zarr(path, cube_spec, chunk=ctx.plan.chunk, codec=ctx.options.zarr_codec, shard=ctx.shard,
                labels_dtype=labels.dtype if labels is not None else None)
    return ZarrSink(path)


def _start_cog(ctx: _BuildContext, staged: Path) -> CogSink:
    """The COG's sink for the pixel pass (tiles compressed as they come, assembled by ``finish``)."""
    plan, meta = ctx.plan, ctx.meta
    cal, products = plan.calibration, plan.profile.products
    tags = {"scene_id": ctx.scene_id, "calibration": cal.to_dict(), "config_hash": ctx.cfg_hash,
            "version": __version__}
    return CogSink(
        ctx.staged_path(staged, ".tif"),
        shape=(cal.n_out, meta.height, meta.width),
        encoding=cal.encoding,
        transform=meta.transform,
        crs_wkt=meta.crs_wkt,
        bands=plan.bands,
        tags=dataset_tags(tags),
        settings=CogSettings(plan.chunk, products.compression, products.level, products.overviews,
                             ctx.options.workers),
        unit=cal.unit,
    )


def _scan(ctx: _BuildContext, zarr: ZarrSink | None, cog: CogSink | None, valid_mask: ValidMask,
          thumb: ThumbnailSink | None = None) -> ScanResult:
    """The pixel pass, written into the sinks; values clipped to the encoding's range are a warning."""
    sinks: list[ZarrSink | CogSink | ThumbnailSink] = [s for s in (zarr, cog, thumb) if s is not None]
    try:
        result = _pixel_pass(ctx.opened, ctx.options, sinks, lambda d, t: ctx.emit("scan", d, t), ctx.plan.chunk,
                             ctx.shard, valid_mask)
    except BaseException:
        if cog is not None:
            cog.abort()
        raise
    if result.clipped is not None and result.clipped.any():
        enc = ctx.plan.calibration.encoding
        over = [ctx.plan.bands[i].number for i in np.flatnonzero(result.clipped)]
        ctx.report.extend([warning(
            Code.ENCODING_CLIPPED,
            f"{int(result.clipped.sum())} value(s) outside the {enc.dtype} range were clipped to it "
            f"(scale_factor {enc.scale_factor:g}); check those bands, or widen the encoding in the profile",
            bands=over)])
    return result


def _finish_cog(ctx: _BuildContext, staged: Path, cog: CogSink) -> ProductInfo:
    """Assemble and validate the COG; its product entry."""
    ctx.emit("cog")
    path = ctx.staged_path(staged, ".tif")
    cog.written()
    digest = _Background(lambda: file_blake3(path))  # the file is final: hash it while rio-cogeo validates it
    info = cog.finish()
    return ProductInfo(path=path.name, bytes=path.stat().st_size, blake3=digest.result(),
                       media_type="image/tiff; application=geotiff; profile=cloud-optimized",
                       validator_warnings=info["warnings"])


def _write_scene_labels(ctx: _BuildContext, staged: Path) -> Labels | None:
    """The scene's label map into the Zarr and as a COG beside it, when it has one."""
    if ctx.opened.labels is None:
        return None
    meta = ctx.meta
    zarr_path = ctx.staged_path(staged, ".zarr") if ctx.wants("zarr") else None
    return write_labels(ctx.opened.labels, staged, ctx.scene_id, ctx.plan.chunk, zarr_path, meta.transform,
                        meta.crs_wkt, ctx.wants("cog"))


def _write_scene_aux(ctx: _BuildContext, staged: Path) -> tuple[list[AuxLayer], list[AuxOutcome]]:
    """Warp each planned aux layer into the Zarr and a COG beside it; one that fails is removed and warned."""
    if not ctx.opened.aux:
        return [], []
    meta = ctx.meta
    assert meta.transform is not None
    assert meta.crs_wkt is not None
    target = LayerTarget(staged, ctx.scene_id, ctx.staged_path(staged, ".zarr") if ctx.wants("zarr") else None,
                         ctx.wants("cog") or not ctx.wants("zarr"), ctx.plan.chunk, meta.height, meta.width,
                         meta.transform, meta.crs_wkt, ctx.options.zarr_codec)
    layers: list[AuxLayer] = []
    outcomes: list[AuxOutcome] = []
    for i, plan in enumerate(ctx.opened.aux):
        ctx.emit("aux", i, len(ctx.opened.aux))
        try:
            with rasterio.Env(GDAL_CACHEMAX=ctx.options.gdal_cache_bytes):
                layer = write_aux(plan, target)
        except AuxError as exc:
            outcomes.append(not_aligned(plan.spec, exc))
        except Exception as exc:  # GDAL/zarr errors on a damaged aux file: the layer is dropped, the scene goes on
            if is_disk_full(exc):
                raise
            log.debug("aux %s of %s failed", plan.spec.name, ctx.scene_id, exc_info=True)
            outcomes.append(not_aligned(plan.spec, AuxError(
                Code.AUX_WARP_FAILED, f"warping {plan.source.path} failed ({type(exc).__name__}: {exc})")))
        else:
            layers.append(layer)
            outcomes.append(aligned(plan, layer))
            log.info("%s: %s", ctx.scene_id, outcomes[-1].message)
    ctx.report.extend(i for i in (o.issue() for o in outcomes) if i is not None)
    return layers, outcomes


@dataclass(frozen=True, slots=True)
class _Measured:
    """What the pixel pass and the source hash found."""

    stats: dict[str, list[Any]]  # physical per-band statistics of the kept bands: count, min, max, mean, std
    footprint: Footprint | None
    acquisition: Acquisition
    prints: list[FileFingerprint]  # the source files (and label file)
    content_hash: str


def _measure(ctx: _BuildContext, result: ScanResult, valid_mask: ValidMask, hasher: _Background) -> _Measured:
    """Band statistics, footprint and acquisition time of the scene, and the hash of its source files."""
    cal, meta = ctx.plan.calibration, ctx.meta
    stats = result.stats.physical(cal.selection.keep, cal.linear)
    fp = footprint_from_mask(valid_mask, meta.transform, meta.crs_wkt)
    acq = _acquisition(ctx.inp, meta, ctx.plan.profile, ctx.report)
    prints: list[FileFingerprint] = hasher.result()
    return _Measured(stats, Footprint.model_validate(fp.to_dict()) if fp is not None else None,
                     Acquisition.model_validate(acq.to_dict()), prints, content_hash(prints))


def _finish_scene_zarr(ctx: _BuildContext, staged: Path, measured: _Measured, sink: ZarrSink) -> ProductInfo:
    """Add what the pixel pass found to the Zarr and consolidate it; its product entry (the chunk files the
    sink hashed as it wrote them are not read again)."""
    path = ctx.staged_path(staged, ".zarr")
    finish_zarr(path, {"cubelake:band_stats": json.dumps(json_safe(measured.stats))},
                {"cubelake:content_hash": measured.content_hash})
    return ProductInfo(path=path.name, array="data", bytes=_dir_size(path),
                       media_type="application/vnd+zarr; version=3", tree_blake3=tree_blake3(path, sink.hashes))


def _start_thumbnail(ctx: _BuildContext) -> ThumbnailSink | None:
    """The preview's sink for the pixel pass (``None`` when thumbnails are off): it bins the candidate bands of
    every stored block, so the thumbnail costs no read after the pass, whichever products are written."""
    spec = ctx.options.thumbnail
    if spec is None:
        return None
    candidates = candidate_bands([b.wavelength_nm for b in ctx.plan.bands], spec)
    return ThumbnailSink(candidates, (ctx.meta.height, ctx.meta.width), spec, ctx.plan.calibration.encoding.fill_value)


def _write_scene_thumbnail(ctx: _BuildContext, staged: Path, sink: ThumbnailSink,
                           measured: _Measured) -> Thumbnail | None:
    """Render ``thumbnail.png`` into the staging folder from what ``sink`` binned during the pass; its record
    (``None``, with a warning in the log, when no band the sink binned has a valid pixel)."""
    spec = ctx.options.thumbnail
    assert spec is not None  # a sink exists only with a spec
    ctx.emit("thumbnail")
    bands = ctx.plan.bands
    try:
        choice = choose_accumulated([b.wavelength_nm for b in bands], sink.candidates, spec, measured.stats["count"])
    except ValueError as exc:
        log.warning("%s: no thumbnail: %s", ctx.scene_id, exc)
        return None
    enc = ctx.plan.calibration.encoding
    written = write_thumbnail(sink, choice, staged / THUMBNAIL_FILE, spec, enc.scale_factor, enc.add_offset)
    log.info("%s: thumbnail %s (%dx%d px), %.2f s binning during the pass and %.2f s after it", ctx.scene_id,
             choice.title(spec), written.width, written.height, sink.seconds, written.seconds)
    return Thumbnail(path=THUMBNAIL_FILE, bytes=written.bytes, blake3=file_blake3(written.path),
                     height=written.height, width=written.width, mode=choice.mode, bands=list(choice.indices),
                     wavelengths_nm=list(choice.wavelengths_nm), title=choice.title(spec),
                     description=choice.description(spec, len(bands)))


def _scene_record(ctx: _BuildContext, measured: _Measured, products: dict[str, ProductInfo],
                  labels: Labels | None, aux: list[AuxLayer] | None = None,
                  thumbnail: Thumbnail | None = None) -> SceneRecord:
    """The scene's record (``scene.json``), every key given (absent parts are ``None``, not missing)."""
    plan, meta, cal = ctx.plan, ctx.meta, ctx.plan.calibration
    return SceneRecord(
        scene_id=ctx.scene_id,
        calibration=Calibration.model_validate(cal.to_dict()),
        config_hash=ctx.cfg_hash,
        version=__version__,
        content_hash=measured.content_hash,
        format_version=SCENE_RECORD_VERSION,
        ingested_at=datetime.now(UTC).isoformat(timespec="seconds"),
        source=_record_source(ctx, measured),
        profile=ProfileInfo(name=plan.profile.name, origin=plan.profile.origin, settings=plan.profile.config_dict()),
        settings=BuildSettings.model_validate(ctx.settings),
        grid=Grid(
            height=meta.height, width=meta.width, crs_wkt=meta.crs_wkt, crs_epsg=meta.crs_epsg,
            transform=list(meta.transform) if meta.transform else None, georeferenced=meta.transform is not None,
            chunk_shape=[cal.n_out, plan.chunk, plan.chunk], shard_chunks=ctx.shard,
        ),
        datetime=meta.datetime,
        acquisition=measured.acquisition,
        footprint=measured.footprint,
        tags=meta.tags,
        bands=_record_bands(plan, measured.stats),
        encoding=Encoding.model_validate(cal.encoding.to_dict()),
        products=products,
        labels=labels,
        **({"aux": aux} if aux else {}),
        **({"thumbnail": thumbnail} if thumbnail is not None else {}),
        validation=ValidationSummary(ok=True, warnings=[RecordIssue.model_validate(w.to_dict())
                                                        for w in ctx.report.warnings]),
    )


def _source_file(inp: SceneInput, entry: dict[str, Any]) -> dict[str, Any]:
    """A fingerprint as the record keeps it: a source fetched from an object store is named by its URL (the
    objects of a scene read in place, every file of an ENVI or Landsat scene, are fingerprinted by URL already)."""
    if inp.url is not None and entry["path"] == str(inp.path.resolve()):
        return {**entry, "path": inp.url}
    return entry


def _record_source(ctx: _BuildContext, measured: _Measured) -> SourceInfo:
    meta = ctx.meta
    return SourceInfo(
        path=ctx.inp.url or str(ctx.inp.path.resolve()),
        format=meta.format,
        files=[SourceFile.model_validate(_source_file(ctx.inp, p.to_dict())) for p in measured.prints],
        content_hash=measured.content_hash,
        shape=list(meta.shape),
        dtype=meta.dtype,
        nodata=meta.nodata,
    )


def _record_bands(plan: ScenePlan, stats: dict[str, list[Any]]) -> list[Band]:
    """The stored bands, in order: source band, name, spectral position and calibrated statistics."""
    return [
        Band(index=i, source_band=b.number, name=b.name, wavelength_nm=b.wavelength_nm, fwhm_nm=b.fwhm_nm,
             count=stats["count"][i], min=stats["min"][i], max=stats["max"][i], mean=stats["mean"][i],
             std=stats["std"][i])
        for i, b in enumerate(plan.bands)
    ]


def _write_records(staged: Path, record: SceneRecord, report: ValidationReport) -> None:
    """The scene's validation report, record and STAC item, into the staging folder."""
    item = item_from_record(record)
    atomic_write_text(staged / "validation.json", report.to_json() + "\n")
    atomic_write_text(staged / SCENE_RECORD_FILE, record.to_json())
    atomic_write_text(staged / ITEM_FILE, item_json(item))


def _ingested(ctx: _BuildContext, record: SceneRecord, target: Path | str, refs_note: str,
              aux: list[AuxOutcome]) -> IngestResult:
    """The result of a published scene: its products (paths in the lake) and a one-line summary."""
    meta, cal = ctx.meta, ctx.plan.calibration
    return IngestResult(
        ctx.inp.name, ctx.scene_id, Outcome.INGESTED, ctx.report,
        f"ingested: {' + '.join(record.products)} ({cal.n_out} of {meta.count} bands, "
        f"{meta.height}x{meta.width}, {cal.encoding.dtype}) -> {target}{refs_note}",
        products={k: join_url(str(target), v.path) for k, v in record.products.items()},
        seconds=time.perf_counter() - ctx.t0,
        aux=aux,
    )


def _publish(lake: AnyLake, staged: Path, scene_id: str) -> Path | str:
    """Move the staged scene into the lake and index its item; the published folder.

    A ``.pending`` marker spans the two steps, so a crash between them is completed by the next run.
    """
    with LakeCatalog(lake) as catalog, catalog.pending(scene_id):
        fault_point("before-products", scene_id)
        target = lake.publish(staged, scene_id)
        fault_point("after-products", scene_id)
        try:
            catalog.publish(scene_id)
        except CatalogError as exc:
            if is_disk_full(exc):
                raise LakeFullError(
                    f"{scene_id}: the products are published in {target}, but the catalog index could not take "
                    f"its item because the {lake.space_text()}. Free space and run the ingest again: it "
                    "completes the index") from exc
            raise CatalogError(
                f"{scene_id}: the products are published in {target}, but indexing its catalog item failed "
                f"({exc}); the next ingest retries it, or run 'cubelake catalog reindex'") from exc
    return target


def iter_ingest(paths: Sequence[str | Path], lake: str | Path | AnyLake, options: IngestOptions | None = None,
                progress: ProgressCallback | None = None, labels: str | Path | None = None,
                aux: Sequence[AuxSpec] | None = None) -> Iterator[IngestResult]:
    """Ingest every scene found under ``paths`` into ``lake``, yielding each scene's result as it finishes.

    ``aux``: rasters on other grids to warp onto every scene's grid (replaces ``options.aux``).
    """
    if aux is not None:
        options = dataclasses.replace(options or IngestOptions(), aux=tuple(aux))
    lk = prepare_lake(lake)
    for scene in discover(paths, labels=labels, skip=(lk.root,) if isinstance(lk, Lake) else ()):
        yield ingest_one(scene, lk, options, progress)


def prepare_lake(lake: str | Path | AnyLake) -> AnyLake:
    """Open the lake and finish what crashed runs left (staging, half-replaced scenes, pending index entries)."""
    lk = open_lake(lake)
    try:
        lk.recover()
        with LakeCatalog(lk) as catalog:
            catalog.recover()
    except (OSError, CubelakeError) as exc:
        if is_disk_full(exc):  # not an index to rebuild: a device to free
            raise LakeFullError(f"{lk.root}: the lake cannot be written: the {lk.space_text()}. Free space (or use a "
                                "--lake on another device) and run the same command again") from exc
        raise
    return lk


def ingest(paths: Sequence[str | Path], lake: str | Path | AnyLake, options: IngestOptions | None = None,
           progress: ProgressCallback | None = None, labels: str | Path | None = None,
           aux: Sequence[AuxSpec] | None = None) -> list[IngestResult]:
    """Ingest every scene found under ``paths`` into ``lake``; one result per scene, in order (``aux``: see
    :func:`iter_ingest`)."""
    return list(iter_ingest(paths, lake, options, progress, labels, aux))


def ingest_one(scene: SceneInput, lake: AnyLake, options: IngestOptions | None = None,
               progress: ProgressCallback | None = None) -> IngestResult:
    """:func:`ingest_scene`, with any failure of the build turned into a ``FAILED`` result (never raises)."""
    t0 = time.perf_counter()
    try:
        return ingest_scene(scene, lake, options, progress)
    except Exception as exc:  # one scene's failure must not stop the others: it is reported and counted
        log.debug("ingesting %s failed", scene.path, exc_info=True)  # the traceback, with -vv only
        if isinstance(exc, CubelakeError):
            message = f"failed: {exc}"
        else:
            message = (f"failed while building products ({type(exc).__name__}: {exc}); nothing was published. "
                       "Run again with -vv for the details; if the input opens in GDAL, please report this as a "
                       "cubelake bug")
        log.info("%s: %s", scene.path, message)  # the result carries it; the CLI prints it once
        return IngestResult(scene.name, None, Outcome.FAILED, ValidationReport(path=scene.name), message,
                            seconds=time.perf_counter() - t0)
