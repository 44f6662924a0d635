"""From a manifest's inputs to the scenes a run must ingest (planning only; no pixel is read).

Inputs are expanded (globs, folders, ``s3://`` prefixes, STAC catalogs) into scenes with the
ingest's own discovery, filtered, and compared with the ledger: a scene whose files are
unchanged since it was last done with the same settings is skipped without a task. Files are
compared by size and mtime (an object by its ETag), as ``rsync`` does; the ingest itself
then compares content hashes, so a file touched but not changed costs a task, never a rebuild.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from cubelake import __version__
from cubelake.errors import ConfigError, CubelakeError
from cubelake.ingest import SceneInput, discover
from cubelake.storage import StorageError, is_url, object_at

from .spec import IngestStep, InputSpec, Manifest

__all__ = ["PlannedInput", "plan_inputs", "scene_files", "settings_hash"]

log = logging.getLogger(__name__)

_MAX_STAC_BYTES = 64 * 1024 * 1024
_MAX_STAC_ITEMS = 100_000
_MAX_STAC_DEPTH = 8
_DATA_TYPES = ("image/tiff", "application/x-hdf", "application/x-envi", "application/x-matlab")


@dataclass(frozen=True, slots=True)
class PlannedInput:
    """One scene of the job: its ledger key, the scene, the settings it is ingested with."""

    key: str
    scene: SceneInput
    settings: IngestStep
    settings_hash: str
    files: list[dict[str, Any]] = field(default_factory=list)
    force: bool = False  # rebuild even when the ingest finds the scene unchanged (``jobs run --force``)

    @property
    def name(self) -> str:
        return self.scene.name


@dataclass(slots=True)
class Plan:
    todo: list[PlannedInput] = field(default_factory=list)
    skipped: list[tuple[PlannedInput, str]] = field(default_factory=list)  # (input, why)
    filtered: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    notes: list[str] = field(default_factory=list)


def settings_hash(settings: IngestStep) -> str:
    """What the ledger compares: the input's effective ingest settings and this cubelake's version."""
    payload = {"settings": settings.model_dump(mode="json"), "cubelake": __version__}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def scene_files(scene: SceneInput) -> list[dict[str, Any]]:
    """Size and mtime (objects: size and ETag) of the files the job knows a scene by."""
    if scene.url is not None:
        store, key = object_at(scene.url)
        info = store.head(key)
        mtime = info.mtime.isoformat() if info.mtime else None
        return [{"path": scene.url, "size": info.size, "etag": info.etag, "mtime": mtime}]
    out: list[dict[str, Any]] = []
    for p in dict.fromkeys(x for x in (scene.path, scene.data, scene.labels) if x is not None):
        try:
            st = Path(p).stat()
        except OSError:
            out.append({"path": str(p), "size": None, "mtime_ns": None})
            continue
        out.append({"path": str(Path(p).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def _unchanged(files: list[dict[str, Any]]) -> bool:
    """Whether every file a done entry recorded (the source's own list, band files included) is as it was."""
    if not files:
        return False
    for f in files:
        path = str(f.get("path"))
        if is_url(path):
            if "etag" not in f:
                return False
            try:
                store, key = object_at(path)
                info = store.head(key)
            except CubelakeError:
                return False
            if (info.size, info.etag) != (f.get("size"), f.get("etag")):
                return False
            continue
        try:
            st = Path(path).stat()
        except OSError:
            return False
        if (st.st_size, st.st_mtime_ns) != (f.get("size"), f.get("mtime_ns")):
            return False
    return True


def _expand_path(spec: InputSpec, plan: Plan) -> list[str]:
    path = str(spec.path)
    if is_url(path) or not any(c in path for c in "*?["):
        return [path]
    found = sorted(glob.glob(path, recursive=True))
    if not found:
        plan.notes.append(f"{path}: the glob matches nothing (no new scenes?)")
    return found


def _stac_doc(where: str) -> dict[str, Any]:
    try:
        if is_url(where):
            store, key = object_at(where)
            text = store.get_text(key, _MAX_STAC_BYTES)
        else:
            p = Path(where)
            if p.stat().st_size > _MAX_STAC_BYTES:
                raise ConfigError(f"{where}: larger than {_MAX_STAC_BYTES} bytes; not a STAC file this job reads")
            text = p.read_text(encoding="utf-8")
        doc = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, StorageError) as exc:
        raise ConfigError(f"{where}: cannot read this STAC file ({exc}); give an ItemCollection or a "
                          "catalog.json") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: a STAC file is a JSON object, got {type(doc).__name__}")
    return doc


def _href(href: Any, base: str, spec: InputSpec) -> str:
    """An asset or link href, resolved against its file and confined to the catalog's folder or allowed roots."""
    if not isinstance(href, str) or not href:
        raise ConfigError(f"{base}: an href is not a non-empty string")
    if href.startswith("file://"):
        href = unquote(urlparse(href).path)
    if is_url(href):
        if not any(href.startswith(r.rstrip("/") + "/") for r in spec.allow_roots):
            raise ConfigError(f"{base}: asset {href} is outside the roots this input allows; list its prefix in "
                              "the input's allow_roots if the job may read it")
        return href
    if is_url(base):
        raise ConfigError(f"{base}: local href {href!r} in a catalog on an object store; use absolute URLs")
    folder = Path(str(spec.stac)).resolve().parent
    target = (Path(base).parent / href).resolve()
    if not target.is_relative_to(folder):
        raise ConfigError(f"{base}: href {href!r} leads outside the catalog's folder {folder}; a catalog may only "
                          "name files beside or below it")
    return str(target)


def _item_assets(item: dict[str, Any], where: str, spec: InputSpec) -> Iterator[str]:
    assets = item.get("assets")
    if not isinstance(assets, dict):
        raise ConfigError(f"{where}: item {item.get('id')!r} has no assets object")
    chosen = [a for a in assets.values() if isinstance(a, dict) and "data" in (a.get("roles") or [])]
    if not chosen:
        chosen = [a for a in assets.values() if isinstance(a, dict) and str(a.get("type", "")).split(";")[0]
                  in _DATA_TYPES]
    for asset in chosen:
        yield _href(asset.get("href"), where, spec)


def _stac_inputs(spec: InputSpec) -> list[str]:
    """The data assets of every item of a STAC ItemCollection, Item or (static) Catalog, links followed."""
    out: list[str] = []
    queue = [(str(spec.stac), 0)]
    seen: set[str] = set()
    while queue:
        where, depth = queue.pop(0)
        if where in seen:
            continue
        seen.add(where)
        doc = _stac_doc(where)
        kind = doc.get("type")
        items = doc.get("features") if kind == "FeatureCollection" else [doc] if kind == "Feature" else []
        if not isinstance(items, list):
            raise ConfigError(f"{where}: 'features' is not a list")
        for item in items:
            if isinstance(item, dict):
                out.extend(_item_assets(item, where, spec))
        if kind in ("Catalog", "Collection"):
            if depth >= _MAX_STAC_DEPTH:
                raise ConfigError(f"{where}: catalog links nest deeper than {_MAX_STAC_DEPTH} levels; refused")
            for link in doc.get("links") or []:
                if isinstance(link, dict) and link.get("rel") in ("item", "child"):
                    queue.append((_href(link.get("href"), where, spec), depth + 1))
        elif kind not in ("FeatureCollection", "Feature"):
            raise ConfigError(f"{where}: STAC type {kind!r}; give an ItemCollection, an Item or a catalog.json")
        if len(out) > _MAX_STAC_ITEMS or len(seen) > _MAX_STAC_ITEMS:
            raise ConfigError(f"{spec.stac}: more than {_MAX_STAC_ITEMS} items or files; refused")
    if not out:
        raise ConfigError(f"{spec.stac}: no item with a data asset (role 'data' or a raster media type)")
    return out


def _scenes(manifest: Manifest, spec: InputSpec, skip: tuple[str, ...], plan: Plan) -> list[SceneInput]:
    paths = _stac_inputs(spec) if spec.stac is not None else _expand_path(spec, plan)
    if not paths:
        return []
    labels = manifest.settings_for(spec).labels
    return discover(paths, labels=labels, skip=skip)


def _size(scene: SceneInput, files: list[dict[str, Any]]) -> int | None:
    labels = str(Path(scene.labels).resolve()) if scene.labels is not None else None
    sizes = [f.get("size") for f in files if f.get("path") != labels]
    return sum(s for s in sizes if isinstance(s, int)) if sizes else None


def _filtered(manifest: Manifest, scene: SceneInput, files: list[dict[str, Any]],
              since: datetime | None) -> str | None:
    """Why the manifest's filters drop this scene, or ``None``."""
    f = manifest.filters
    name = Path(scene.url or str(scene.path)).name
    if f.pattern and not fnmatch.fnmatch(name, f.pattern):
        return f"name does not match pattern {f.pattern!r}"
    size = _size(scene, files)
    if size is not None and f.min_size is not None and size < f.min_size:
        return f"{size} bytes, under min_size {f.min_size}"
    if size is not None and f.max_size is not None and size > f.max_size:
        return f"{size} bytes, over max_size {f.max_size}"
    if since is not None and f.newer_than_last_success:
        mtime = _mtime(files)
        if mtime is not None and mtime <= since:
            return f"not modified since the last successful run ({since.isoformat(timespec='seconds')})"
    return None


def _mtime(files: list[dict[str, Any]]) -> datetime | None:
    """When the scene's files last changed, from what :func:`scene_files` recorded (no second look)."""
    stamps = [datetime.fromtimestamp(f["mtime_ns"] / 1e9, UTC) for f in files if isinstance(f.get("mtime_ns"), int)]
    stamps += [datetime.fromisoformat(f["mtime"]) for f in files if isinstance(f.get("mtime"), str)]
    return max(stamps) if stamps else None



def plan_inputs(manifest: Manifest, entries: dict[str, dict[str, Any]], *, skip: tuple[str, ...] = (),
                since: datetime | None = None, force: bool = False) -> Plan:
    """Every scene of the job, split into work to do, work already done (skipped) and filtered out.

    ``entries``: the ledger's input entries; ``since``: when the last successful run started (for
    the ``newer_than_last_success`` filter); ``force``: redo everything. An input named twice
    (two globs matching one file) is planned once, with the settings of its first input.
    """
    from .ledger import input_key

    plan = Plan()
    seen: set[str] = set()
    for i, spec in enumerate(manifest.inputs):
        settings = manifest.settings_for(spec)
        digest = settings_hash(settings)
        try:
            scenes = _scenes(manifest, spec, skip, plan)
        except ConfigError as exc:
            raise ConfigError(f"{manifest.source}: inputs[{i}]: {exc}") from None
        for scene in scenes:
            if scene.name in seen:
                continue
            seen.add(scene.name)
            try:
                files = scene_files(scene)
            except CubelakeError as exc:  # an object that cannot be looked at: the task reports it
                log.info("%s: %s", scene.name, exc)
                files = []
            why = _filtered(manifest, scene, files, since)
            if why:
                plan.filtered.append((scene.name, why))
                continue
            planned = PlannedInput(input_key(scene.name), scene, settings, digest, files, force)
            entry = entries.get(planned.key)
            if not force and entry is not None and _settled(entry, digest):
                plan.skipped.append((planned, f"unchanged since run {entry.get('run_id')} ({entry.get('state')})"))
            else:
                plan.todo.append(planned)
    return plan


def _settled(entry: dict[str, Any], digest: str) -> bool:
    """A ledger entry that needs no new task: done or rejected, same settings, its files unchanged."""
    return (entry.get("state") in ("done", "rejected") and entry.get("settings_hash") == digest
            and _unchanged(list(entry.get("files") or [])))
