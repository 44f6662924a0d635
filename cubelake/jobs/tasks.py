"""What a job runs on Dask workers: one ingest per scene, then the post-ingest steps.

Each function is a plain, picklable call that opens the lake itself (workers may be other
machines), does one thing through the library, and returns a small JSON-able report. A scene
whose build *failed* (I/O, not the input's fault) raises :class:`TaskFailed`, so Dask's
``retries`` run it again, possibly on another worker; a rejected scene is a result.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import itertools
import json
import os
import resource
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cubelake.errors import CubelakeError
from cubelake.lake import AnyLake, cube_key, open_lake, safe_scene_id
from cubelake.storage import is_url, join_url

from .spec import AuxEntry, ExportStep, IngestStep, StackStep

if TYPE_CHECKING:
    from cubelake.record import SceneRecord

__all__ = ["TaskFailed", "aux_files", "aux_specs", "export_task", "gc_task", "ingest_options", "ingest_task",
           "stack_task"]


class TaskFailed(Exception):
    """A scene's build failed (not the input's fault); Dask retries the task."""


def ingest_options(settings: IngestStep, threads: int) -> Any:
    """The :class:`~cubelake.ingest.IngestOptions` of an input's settings (raises ConfigError for a bad profile,
    ValueError for an aux layer the ingest refuses)."""
    from cubelake.ingest import IngestOptions, Limits, SourceOptions, load_profile

    limits = Limits(max_bytes=settings.max_scene_bytes) if settings.max_scene_bytes else Limits()
    profile = None if settings.profile in (None, "auto") else load_profile(str(settings.profile))
    return IngestOptions(
        products=settings.products or ("cog", "zarr"), profile=profile, chunk=settings.chunk, shard=settings.shard,
        workers=threads, limits=limits, force=bool(settings.force), refs_format=settings.refs_format or "auto",
        source=SourceOptions(variable=settings.variable, axes=settings.axes, max_bytes=limits.max_bytes),
        aux=aux_specs(settings.aux or ()))


def aux_specs(entries: Sequence[AuxEntry]) -> tuple[Any, ...]:
    """The ingest's :class:`~cubelake.ingest.AuxSpec` of a manifest's aux entries (paths already resolved)."""
    from cubelake.ingest import AuxSpec

    return tuple(AuxSpec(name=a.name, path=a.path, resampling=a.resampling, kind=a.kind,
                         max_time_delta=None if a.max_time_delta is None else dt.timedelta(seconds=a.max_time_delta))
                 for a in entries)


def _stat_entry(path: str) -> dict[str, Any] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def aux_files(entries: Sequence[AuxEntry], record: SceneRecord | None) -> list[dict[str, Any]]:
    """What the ledger watches of a scene's aux rasters (size and mtime, as of its own files): each raster the
    scene took, each file or folder an entry names (a file added to or removed from a folder changes its mtime),
    and a pattern's fixed leading folder. Paths that do not exist are left out."""
    paths = [str(layer.source) for layer in (record.aux if record is not None else [])]
    for a in entries:
        parts = Path(a.path).parts
        fixed = list(itertools.takewhile(lambda p: not any(c in p for c in "*?["), parts))
        paths.append(a.path if len(fixed) == len(parts) else str(Path(*fixed)) if fixed else ".")
    return [e for p in dict.fromkeys(paths) if (e := _stat_entry(p)) is not None]


def _worker() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except ValueError:  # called outside a worker (tests, a synchronous run)
        return f"pid {os.getpid()}"


def ingest_task(lake_url: str, planned: Any, threads: int) -> dict[str, Any]:
    """Ingest one planned input into the lake; its result, the record's hashes and the files it was built from."""
    from cubelake.ingest import Outcome, ingest_one

    lake = open_lake(lake_url, create=False)
    options = ingest_options(planned.settings, threads)
    if planned.force:
        options = dataclasses.replace(options, force=True)
    result = ingest_one(planned.scene, lake, options)
    if result.outcome is Outcome.FAILED:
        raise TaskFailed(result.message)
    files = list(planned.files)
    record = lake.scene_record(result.scene_id) if result.scene_id and result.outcome is not Outcome.REJECTED \
        else None
    if record is not None:
        known = {f["path"] for f in files}
        files += [{"path": f.path, "size": f.size, "mtime_ns": f.mtime_ns} for f in record.source.files
                  if f.path not in known and not is_url(f.path) and f.mtime_ns]
    if planned.settings.aux:  # a changed aux raster is a changed input: the ledger must not skip the scene
        known = {f["path"] for f in files}
        files += [f for f in aux_files(planned.settings.aux, record) if f["path"] not in known]
    return {
        "result": result.to_dict(),
        "content_hash": record.source.content_hash if record else None,
        "config_hash": record.config_hash if record else None,
        "files": files,
        "worker": _worker(),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _grid_key(record: Any) -> str:
    """Scenes stack only on one grid and band set: the hash of everything combine_refs compares."""
    g = record.grid
    payload = {"crs": g.crs_wkt or g.crs_epsg, "transform": g.transform, "size": [g.height, g.width],
               "chunks": g.chunk_shape, "bands": [b.wavelength_nm for b in record.bands],
               "encoding": record.encoding.model_dump(mode="json")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _groups(lake: AnyLake, scene_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Grid key -> [(scene id, refs location)] of the scenes that have references."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for sid in sorted(set(scene_ids)):
        record = lake.scene_record(sid)
        where = lake.scene_location(sid)
        if record is None or where is None or "refs" not in record.products:
            continue
        name = f"{safe_scene_id(record.profile.name or 'cube')}-{_grid_key(record)}"
        groups.setdefault(name, []).append((sid, join_url(where, record.products["refs"].path)))
    return groups


def stack_task(lake_url: str, job: str, scene_ids: list[str], step: StackStep) -> dict[str, Any]:
    """Group the job's scenes by grid and write one stacked reference set per group of ``min_scenes`` or more."""
    from cubelake.refs import write_refs
    from cubelake.refs.combine import combine_refs
    from cubelake.refs.formats import PARQUET_THRESHOLD

    lake = open_lake(lake_url, create=False)
    cubes, problems = [], []
    for name, members in _groups(lake, scene_ids).items():
        if len(members) < step.min_scenes:
            continue
        try:
            stacked = combine_refs([m[1] for m in members], dim=step.dim)
            fmt = step.format if step.format != "auto" else \
                ("parquet" if stacked.n_chunks >= PARQUET_THRESHOLD else "json")
            key = cube_key(job, f"{name}.refs.{fmt}")
            where = _write_in_lake(lake, key, lambda path, s=stacked, f=fmt: write_refs(s, path, f))
        except CubelakeError as exc:
            problems.append(f"{name}: {exc}")
            continue
        cubes.append({"cube": name, "scenes": [m[0] for m in members], "refs": where, "chunks": stacked.n_chunks})
    return {"cubes": cubes, "problems": problems}


def _write_in_lake(lake: AnyLake, key: str, write: Any) -> str:
    """Write a file or folder at ``key`` in the lake: in place on disk, through a local copy on an object store."""
    if lake.is_local:
        target = Path(str(lake.root)) / key
        target.parent.mkdir(parents=True, exist_ok=True)
        return str(write(target))
    with tempfile.TemporaryDirectory(prefix="cubelake-job-") as tmp:
        local = Path(write(Path(tmp) / Path(key).name))
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(local).as_posix() if local.is_dir() else ""
            lake.store.put(join_url(key, rel) if rel else key, f)
    return lake.store.url_of(key)


def export_task(lake_url: str, step: ExportStep) -> dict[str, Any]:
    """A stac-geoparquet snapshot of the whole catalog; a relative ``path`` is a key in the lake."""
    from cubelake.catalog import LakeCatalog
    from cubelake.storage import check_key

    lake = open_lake(lake_url, create=False)
    absolute = is_url(step.path) or Path(step.path).is_absolute()
    target = step.path if absolute else join_url(lake.url, check_key(step.path))
    if not absolute and lake.is_local:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    with LakeCatalog(lake) as cat:
        n = cat.export_geoparquet(target)
    return {"items": n, "path": target}


def gc_task(lake_url: str, grace_s: float) -> dict[str, Any]:
    from cubelake.catalog.lake import collect_garbage

    lake = open_lake(lake_url, create=False)
    return {"removed": collect_garbage(lake, dt.timedelta(seconds=grace_s))}
