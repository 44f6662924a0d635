"""The one pixel pass: read every block, check it decodes, gather statistics, calibrate, write.

Work is split into write units (a chunk, or a shard of chunks when the Zarr is sharded) that
run on a thread pool; GDAL and the codecs release the GIL, so reads, calibration and
compression overlap. At most ``workers + 2`` units are in flight, so memory stays bounded by
a few units whatever the scene size. A unit whose read fails is diagnosed block by block
(which native block failed, and GDAL's reason); after the first failure nothing more is
written, but the scan goes on so the report lists every bad block.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cubelake.errors import SceneReadError
from cubelake.grid import ChunkGrid, Window

from .calibrate import CalibrationPlan
from .footprint import ValidMask
from .report import Code, Issue, error
from .sources import RasterSource, block_grid
from .stats import ScanStats

__all__ = ["ChunkSink", "ProgressFn", "ScanResult", "scan"]

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]
"""Called with ``(units done, units total)``."""

_MAX_BLOCK_ERRORS = 20


class ChunkSink(Protocol):
    """Receives stored ``(band, y, x)`` blocks for chunk-aligned windows; must be thread-safe."""

    def write(self, window: Window, data: np.ndarray) -> None: ...


@dataclass(slots=True)
class ScanResult:
    stats: ScanStats
    issues: list[Issue] = field(default_factory=list)
    clipped: np.ndarray | None = None
    blocks_failed: int = 0
    units: int = 0

    @property
    def ok(self) -> bool:
        return not self.issues


def _diagnose(source: RasterSource, window: Window, exc: Exception) -> list[Issue]:
    """Which native blocks of ``window`` fail to decode, each with the reader's reason."""
    meta = source.meta
    grid = block_grid(meta)
    blocks = source.blocks(window)
    found: list[Issue] = []
    for b in blocks:
        try:
            source.read(b)
        except SceneReadError as e:
            reason = str(e).removeprefix(f"{meta.path}: ")
            found.append(
                error(
                    Code.BLOCK_DECODE,
                    f"block (row {b.row_off // grid.chunk_y}, col {b.col_off // grid.chunk_x}) at rows "
                    f"{b.row_off}-{b.row_end - 1}, cols {b.col_off}-{b.col_end - 1} fails to decode: {reason}. "
                    "The file is damaged; re-copy it or re-export it from the original",
                    where=f"block {b.row_off // grid.chunk_y},{b.col_off // grid.chunk_x}",
                )
            )
    if not found:  # the window failed as a whole but no single block does: report the window
        reason = str(exc).removeprefix(f"{meta.path}: ")
        found.append(
            error(
                Code.BLOCK_DECODE,
                f"rows {window.row_off}-{window.row_end - 1}, cols {window.col_off}-{window.col_end - 1} fail to read: {reason}",
                where=f"window {window.row_off},{window.col_off}",
            )
        )
    return found


def _reader(source: RasterSource) -> Callable[[Window], np.ndarray]:
    """How the pass reads a window as ``(band, y, x)``: from a pixel-interleaved file, a view of its pixels as
    GDAL stores them (half the CPU of de-interleaving every value); stats and sinks take either layout."""
    if not getattr(source, "pixel_interleaved", False):
        return source.read
    read_pixels: Callable[[Window], np.ndarray] = source.read_pixels  # type: ignore[attr-defined]
    return lambda win: read_pixels(win).transpose(2, 0, 1)


def scan(
    source: RasterSource,
    chunk_grid: ChunkGrid,
    *,
    plan: CalibrationPlan | None = None,
    sinks: Sequence[ChunkSink] = (),
    units_per_side: int = 1,
    workers: int = 2,
    progress: ProgressFn | None = None,
    footprint: ValidMask | None = None,
) -> ScanResult:
    """Read the whole scene once in chunk windows; with a ``plan``, write calibrated units to ``sinks``.

    ``units_per_side`` chunks per side make one write unit (the Zarr shard size). With a
    ``plan`` and a ``footprint``, the valid pixels of the kept bands are marked on it.
    """
    meta = source.meta
    nodata = plan.nodata if plan is not None else meta.nodata
    total = ScanStats(meta.count, nodata)
    unit_grid = chunk_grid.coarsened(units_per_side)
    units = [unit_grid.chunk_window(c) for c in unit_grid.chunks()]
    result = ScanResult(stats=total, units=len(units))
    if plan is not None:
        result.clipped = np.zeros(plan.n_out, dtype=np.int64)
    lock = threading.Lock()
    failed = threading.Event()
    read = _reader(source)

    def run(unit: Window) -> None:
        local = ScanStats(meta.count, nodata)
        chunks = chunk_grid.chunks_for_window(unit)
        out = None
        if plan is not None and sinks and len(chunks) > 1:  # a shard: assemble its chunks first
            out = np.empty((plan.n_out, unit.height, unit.width), dtype=plan.encoding.dtype)
        clipped = None
        problems: list[Issue] = []
        for c in chunks:
            win = chunk_grid.chunk_window(c)
            try:
                raw = read(win)
            except SceneReadError as exc:
                problems.extend(_diagnose(source, win, exc))
                continue
            local.update(raw)
            if footprint is not None and plan is not None:
                footprint.add(win, plan.valid_pixels(raw))
            if plan is not None and not problems and not failed.is_set():
                stored, clip = plan.apply(raw)
                clipped = clip if clipped is None else clipped + clip
                if out is not None:
                    rel = win.relative_to(unit)
                    out[:, rel.row_off : rel.row_end, rel.col_off : rel.col_end] = stored
                else:
                    out = stored  # the unit is this one chunk
        if problems:
            failed.set()
        elif out is not None and sinks and not failed.is_set():
            for sink in sinks:
                sink.write(unit, out)
        with lock:
            total.merge(local)
            result.issues.extend(problems)
            if clipped is not None and result.clipped is not None:
                result.clipped += clipped

    _run_bounded(units, run, workers, progress)
    result.issues, result.blocks_failed = _summarise_issues(result.issues)
    return result


def _run_bounded(units: Sequence[Window], run: Callable[[Window], None], workers: int,
                 progress: ProgressFn | None) -> None:
    """``run`` every unit on ``workers`` threads, at most ``workers + 2`` submitted at a time (memory stays
    bounded by the units in flight); the first error is raised once the pending units are cancelled."""
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="cubelake-scan") as pool:
        pending: set[Future[None]] = set()
        try:
            for unit in units:
                if len(pending) >= workers + 2:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in finished:
                        f.result()
                        done += 1
                        if progress:
                            progress(done, len(units))
                pending.add(pool.submit(run, unit))
            for f in pending:
                f.result()
                done += 1
                if progress:
                    progress(done, len(units))
        except BaseException:
            for f in pending:
                f.cancel()
            raise


def _summarise_issues(issues: list[Issue]) -> tuple[list[Issue], int]:
    """Each failing native block reported once (one block can span several chunks), at most
    ``_MAX_BLOCK_ERRORS`` of them listed; and how many blocks failed."""
    unique: dict[tuple[str, str | None], Issue] = {}
    for i in issues:
        unique.setdefault((i.code.value, i.where), i)
    issues = list(unique.values())
    block_errors = [i for i in issues if i.code is Code.BLOCK_DECODE]
    if len(block_errors) > _MAX_BLOCK_ERRORS:
        others = [i for i in issues if i.code is not Code.BLOCK_DECODE]
        block_errors.sort(key=lambda i: i.where or "")
        extra = error(
            Code.BLOCK_DECODE,
            f"... and {len(block_errors) - _MAX_BLOCK_ERRORS} more blocks fail to decode",
        )
        return others + block_errors[:_MAX_BLOCK_ERRORS] + [extra], len(block_errors)
    return sorted(issues, key=lambda i: i.where or ""), len(block_errors)
