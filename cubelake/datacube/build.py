"""``build_cube``: scenes of one sensor reprojected onto one grid, written as a native Zarr v3 cube and published.

The build plans everything first (:func:`plan_cube`: scenes, checks, grid, time axis, kernel
scales, the hash of all of it), then compares that hash with the published cube's: equal means
the cube is up to date and nothing is read or written. Otherwise it fills the cube one output
chunk at a time: for each spatial block and time step, each scene of the step that reaches the
block is read in the window the block needs, decoded, warped onto the block and mosaicked (first
valid value wins, scenes in id order); the block is encoded and written as one Zarr chunk per band
chunk. Memory per worker is one block of every band plus one source window of at most
``max_source_bytes`` (a block is split when strong downsampling would need more).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from affine import Affine

from cubelake.cube import CFEncoder
from cubelake.grid import Window
from cubelake.lake import AnyLake, datacube_key, open_lake
from cubelake.object_lake import new_version
from cubelake.storage import S3Options

from .errors import CubeSettingsError, DatacubeError
from .grid import (
    Bounds,
    GridRequest,
    TargetGrid,
    derive_grid,
    extent_bounds_in,
    kernel_scale,
    parse_crs,
)
from .item import CB_BUILD_HASH, ITEM_FILE, CubeItemSpec, cube_item, iso_utc
from .publish import (
    check_name,
    cube_lock,
    cube_staging,
    cube_zarr_url,
    is_complete,
    publish_cube,
    read_cube_item,
)
from .scenes import (
    CubeScene,
    TimeSlice,
    check_one_encoding,
    check_one_quantity,
    check_one_sensor,
    load_scenes,
    select_scene_ids,
    time_slices,
)
from .warp import RESAMPLING, Resampling, SceneReader, margin_px, open_reader, pieces, warp_block
from .writer import CubeLayout, CubeSink, create_cube_zarr, finish_cube_zarr

__all__ = ["CUBE_FORMAT", "CubePlan", "CubeResult", "CubeSettings", "build_cube", "plan_cube", "write_cube"]

log = logging.getLogger(__name__)

#: Changes when the same inputs and settings would give a different cube (a rebuild follows).
CUBE_FORMAT = 1
ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class CubeSettings:
    """How to build: the target grid (``None`` parts derived), resampling, chunking, stored type, tolerances.

    ``crs``/``resolution``/``bounds``: see :class:`~.grid.GridRequest`. ``chunk``: spatial chunk
    side (pixels); ``band_chunk``: bands per chunk (``None``: all). ``dtype``: ``float32`` (decoded
    values, NaN fill) or ``source`` (the scenes' common stored encoding). ``workers``: blocks warped
    at once (threads). ``max_source_bytes``: largest source window read for one block.
    """

    crs: str | None = None
    resolution: float | None = None
    bounds: Bounds | None = None
    resampling: Resampling = "nearest"
    chunk: int = 256
    band_chunk: int | None = None
    dtype: Literal["float32", "source"] = "float32"
    wavelength_tolerance_nm: float = 1.0
    workers: int = 1
    max_source_bytes: int = 256 * 1024**2

    def checked(self) -> CubeSettings:
        """These settings, or :class:`CubeSettingsError` naming the first unusable one."""
        if self.resampling not in RESAMPLING:
            raise CubeSettingsError(f"--resampling {self.resampling!r}: use one of {', '.join(RESAMPLING)}")
        if self.dtype not in ("float32", "source"):
            raise CubeSettingsError(f"--dtype {self.dtype!r}: use float32 or source")
        for what, value, low in (("--chunk", self.chunk, 16), ("--band-chunk", self.band_chunk, 1),
                                 ("--workers", self.workers, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise CubeSettingsError(f"{what} {value!r}: expected a whole number of at least {low}")
        if not (math.isfinite(self.wavelength_tolerance_nm) and self.wavelength_tolerance_nm >= 0):
            raise CubeSettingsError(f"--wavelength-tolerance {self.wavelength_tolerance_nm!r}: expected nanometres >= 0")
        if self.crs is not None:
            parse_crs(self.crs)
        return self

    def shaping(self) -> dict[str, Any]:
        """The settings that shape the cube's content (``workers`` and the read budget do not)."""
        d = asdict(self)
        for k in ("workers", "max_source_bytes", "crs", "resolution", "bounds"):  # the grid is hashed resolved
            d.pop(k)
        return d


@dataclass(frozen=True, slots=True)
class CubePlan:
    """Everything decided before a pixel is read."""

    name: str
    scenes: tuple[CubeScene, ...]
    grid: TargetGrid
    slices: tuple[TimeSlice, ...]
    scales: dict[str, tuple[float, float]]
    outlines: dict[str, Bounds | None]  # each scene's bounds in the target CRS (None: not expressible there)
    layout: CubeLayout
    settings: CubeSettings
    build_hash: str
    by_id: dict[str, CubeScene] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CubeResult:
    """What a build did: ``built`` or ``up to date``, where the cube is, its shape and inputs."""

    name: str
    status: Literal["built", "up to date"]
    item_url: str
    zarr_url: str
    shape: tuple[int, int, int, int]
    scenes: tuple[str, ...]
    times: tuple[str, ...]
    grid: TargetGrid
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "item": self.item_url, "zarr": self.zarr_url,
                "shape": list(self.shape), "dims": ["time", "band", "y", "x"], "scenes": list(self.scenes),
                "times": list(self.times), "grid": self.grid.to_dict(), "seconds": round(self.seconds, 3)}


def _build_hash(grid: TargetGrid, slices: Sequence[TimeSlice], scenes: Sequence[CubeScene],
                settings: CubeSettings) -> str:
    payload = {"format": CUBE_FORMAT, "grid": grid.to_dict(), "settings": settings.shaping(),
               "slices": [[iso_utc(s.time), list(s.scene_ids)] for s in slices],
               "scenes": [{"id": s.scene_id, **dict(s.identity)} for s in scenes]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _layout(name: str, scenes: Sequence[CubeScene], grid: TargetGrid, slices: Sequence[TimeSlice],
            settings: CubeSettings, scales: dict[str, tuple[float, float]], build_hash: str) -> CubeLayout:
    ref = scenes[0]  # the earliest scene names the bands
    encoding = ref.encoding if settings.dtype == "source" else CFEncoder("float32", fill_value=math.nan)
    attrs = {"cubelake:datacube": name, "cubelake:scenes": [s.scene_id for s in scenes],
             "cubelake:time_scenes": [list(s.scene_ids) for s in slices], "cubelake:resampling": settings.resampling,
             "cubelake:warp_scale": {k: list(v) for k, v in sorted(scales.items())}, "cubelake:mosaic": "first-valid",
             "cubelake:build_hash": build_hash}
    data_attrs = {"long_name": "scene values reprojected onto the grid", **({"units": ref.unit} if ref.unit else {})}
    return CubeLayout(grid, tuple(s.time for s in slices), ref.band_numbers, ref.wavelengths_nm, ref.fwhm_nm,
                      ref.band_names, encoding, settings.chunk, settings.band_chunk or ref.band_count, attrs, data_attrs)


def _lonlat_union(scenes: Sequence[CubeScene]) -> Bounds | None:
    boxes = [s.lonlat_bbox for s in scenes if s.lonlat_bbox]
    if not boxes:
        return None
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def plan_cube(lake: AnyLake, name: str, scene_ids: Sequence[str], query: Any | None,
              settings: CubeSettings) -> CubePlan:
    """Choose and check the scenes, then fix the grid, time axis, kernel scales and the build hash."""
    scenes = load_scenes(lake, select_scene_ids(lake, scene_ids, query))
    check_one_sensor(scenes, settings.wavelength_tolerance_nm)
    check_one_quantity(scenes)
    if settings.dtype == "source":
        check_one_encoding(scenes)
        enc = scenes[0].encoding
        if enc.is_integer and enc.fill_value is None:
            raise CubeSettingsError(f"--dtype source: the scenes store {enc.dtype} without a fill value, so the "
                                    "places no scene covers could not be stored; use --dtype float32")
    grid = derive_grid([s.extent for s in scenes], GridRequest(settings.crs, settings.resolution, settings.bounds),
                       _lonlat_union(scenes))
    if len({s.extent for s in scenes}) == 1 and len(scenes) > 1:
        log.info("the scenes %s already share one grid: 'cubelake refs combine' stacks their references into a "
                 "virtual cube without copying a byte", ", ".join(s.scene_id for s in scenes))
    slices = time_slices(scenes)
    scales = {s.scene_id: kernel_scale(s.extent, grid) for s in scenes}
    crs = parse_crs(grid.crs_wkt, "the target CRS")
    outlines = {s.scene_id: extent_bounds_in(s.extent, crs) for s in scenes}
    build_hash = _build_hash(grid, slices, scenes, settings)
    layout = _layout(name, scenes, grid, slices, settings, scales, build_hash)
    return CubePlan(name, tuple(scenes), grid, tuple(slices), scales, outlines, layout, settings, build_hash,
                    {s.scene_id: s for s in scenes})


def _reaches(outline: Bounds | None, block: Bounds, pad: float) -> bool:
    if outline is None:
        return True  # unknown: let the source window decide
    return not (outline[2] < block[0] - pad or outline[0] > block[2] + pad
                or outline[3] < block[1] - pad or outline[1] > block[3] + pad)


def _mosaic(plan: CubePlan, readers: dict[str, SceneReader], step: TimeSlice, window: Window) -> np.ndarray | None:
    """One time step of one block: its scenes warped and merged (first valid value wins), or ``None`` if empty."""
    grid, settings = plan.grid, plan.settings
    nb = len(plan.layout.band_numbers)
    budget = max(1, settings.max_source_bytes // (4 * nb))
    out: np.ndarray | None = None
    for sid in step.scene_ids:
        scene = plan.by_id[sid]
        if not _reaches(plan.outlines[sid], grid.window_bounds(window), max(grid.res)):
            continue
        margin = margin_px(settings.resampling, plan.scales[sid])
        for part, src in pieces(scene.extent, grid, window, margin, budget):
            values = readers[sid].read(src)
            src_transform = scene.extent.affine @ Affine.translation(src.col_off, src.row_off)
            warped = warp_block(values, src_transform, scene.extent.crs_wkt, grid, part, settings.resampling,
                                plan.scales[sid])
            if out is None and part == window:
                out = warped  # the first scene over the whole block: no copy
                continue
            if out is None:
                out = np.full((nb, window.height, window.width), np.nan, dtype=np.float32)
            rel = part.relative_to(window)
            target = out[:, rel.row_off:rel.row_end, rel.col_off:rel.col_end]
            np.copyto(target, warped, where=np.isnan(target))
    return None if out is None or np.isnan(out).all() else out


def _fill_block(plan: CubePlan, readers: dict[str, SceneReader], sink: CubeSink, window: Window) -> None:
    encoding = plan.layout.encoding
    for t, step in enumerate(plan.slices):
        block = _mosaic(plan, readers, step, window)
        if block is None:
            continue  # never written: reads as the fill value
        stored = block if encoding.dtype == "float32" else encoding.encode(block.astype(np.float64))[0]
        sink.write(t, window, stored)


def _run_blocks(plan: CubePlan, readers: dict[str, SceneReader], sink: CubeSink,
                progress: ProgressCallback | None) -> None:
    """Every output block once; ``workers`` at a time, never more than twice that queued (bounded memory)."""
    chunks = plan.grid.chunk_grid(plan.settings.chunk)
    windows = [chunks.chunk_window(i) for i in chunks.chunks()]
    done = 0

    def finished(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, len(windows))

    workers = plan.settings.workers
    if workers == 1:
        for w in windows:
            _fill_block(plan, readers, sink, w)
            finished(1)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="cubelake-cube") as pool:
        pending: set[Future[None]] = set()
        for w in windows:
            if len(pending) >= 2 * workers:
                ready, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in ready:
                    f.result()
                finished(len(ready))
            pending.add(pool.submit(_fill_block, plan, readers, sink, w))
        for f in pending:
            f.result()
        finished(len(pending))


def write_cube(plan: CubePlan, path: Path, options: S3Options | None = None,
               progress: ProgressCallback | None = None) -> None:
    """Write the planned cube as a Zarr v3 store at ``path`` (a local folder)."""
    create_cube_zarr(path, plan.layout)
    readers: dict[str, SceneReader] = {}
    try:
        for s in plan.scenes:
            readers[s.scene_id] = open_reader(s, options)
        _run_blocks(plan, readers, CubeSink(path), progress)
    finally:
        for r in readers.values():
            r.close()
    finish_cube_zarr(path)


def _result(plan: CubePlan, status: Literal["built", "up to date"], lake: AnyLake, item: dict[str, Any],
            t0: float) -> CubeResult:
    return CubeResult(plan.name, status, lake.store.url_of(datacube_key(plan.name, ITEM_FILE)),
                      cube_zarr_url(lake, plan.name, item), plan.layout.shape,
                      tuple(s.scene_id for s in plan.scenes), tuple(iso_utc(s.time) for s in plan.slices), plan.grid,
                      time.perf_counter() - t0)


def build_cube(lake: AnyLake | str | Path, name: str, scene_ids: Sequence[str] = (), *,
               query: Any | None = None, settings: CubeSettings | None = None,
               progress: ProgressCallback | None = None) -> CubeResult:
    """Build (or confirm up to date) the cube ``name`` of ``lake`` from scenes chosen by id and/or catalog search.

    ``query``: a :class:`cubelake.catalog.Query` selecting scenes (with ``scene_ids``, both must
    hold). ``progress(done, total)`` is called per output block. Raises :class:`DatacubeError`
    (scenes missing, of different sensors or times unknown), :class:`CubeSettingsError` and, when
    another build published the cube meanwhile, :class:`~cubelake.storage.CommitConflict`.
    """
    t0 = time.perf_counter()
    settings = (settings or CubeSettings()).checked()
    check_name(name)
    lk = open_lake(lake, create=False)
    with cube_lock(lk, name):
        plan = plan_cube(lk, name, scene_ids, query, settings)
        published, etag = read_cube_item(lk, name)
        if published is not None and is_complete(lk, name, published) and \
                (published.get("properties") or {}).get(CB_BUILD_HASH) == plan.build_hash:
            log.info("%s: datacube %s is up to date", lk.url, name)
            _index_cube(lk, name)  # a no-op unless a killed build committed it without indexing it
            return _result(plan, "up to date", lk, published, t0)
        options = None if lk.is_local else lk.store.options
        with cube_staging(lk, name) as staged:
            write_cube(plan, staged / f"{name}.zarr", options, progress)
            item = _checked_item(plan, new_version())
            publish_cube(lk, name, staged, item, etag)
        _index_cube(lk, name)
    return _result(plan, "built", lk, item, t0)


def _index_cube(lake: AnyLake, name: str) -> None:
    """Make the published cube searchable in the lake's catalog (``cubelake catalog search``)."""
    from cubelake.catalog import LakeCatalog

    with LakeCatalog(lake) as cat:
        cat.publish_derived(datacube_key(name, ITEM_FILE))


def _checked_item(plan: CubePlan, version: str) -> dict[str, Any]:
    """The cube's STAC item, checked against the official schemas before anything is published."""
    from cubelake.catalog.validate import validate_stac

    spec = CubeItemSpec(plan.name, plan.layout, plan.slices, plan.scenes, plan.settings.resampling, plan.scales,
                        plan.build_hash, version, datetime.now(UTC), plan.scenes[0].unit)
    item = cube_item(spec)
    problems = validate_stac(item)
    if problems:
        raise DatacubeError(f"cube {plan.name}: its STAC item breaks the official schemas, nothing was published "
                            f"(please report this as a cubelake bug): {'; '.join(problems[:5])}")
    return item
