"""One publish protocol for the products a lake derives from its scenes: built datacubes and predictions.

Layout (keys from :func:`cubelake.lake.derived_key`, the same on disk and on an object store)::

    <root>/<name>/item.json             the product's STAC item, and its commit object
    <root>/<name>/v/<version>/...       one immutable build (version: UTC time + randomness)

``<root>`` is the kind's folder (:data:`DATACUBES`: ``datacubes``, :data:`PREDICTIONS`:
``predictions``). A build is completed in a private staging folder (:func:`product_staging`, inside
the lake on disk), put under a fresh version folder (one ``rename`` on disk, an upload on an object
store) and made visible by writing ``item.json`` conditionally: create-only for a new product,
``If-Match`` on the ETag read before the build to replace one. Readers find the product through
``item.json`` only, so they see the old build or the new one, never a partial one; of two builds
racing for one name exactly one commits, and the other's upload is deleted. Superseded versions
are removed after the commit: on disk at once (as a replaced scene is), on an object store once
older than :data:`GRACE` (readers on other machines may still be reading them). On one machine
:func:`product_lock` keeps builds of one name apart; across machines the conditional write decides.

The item names its version in a property of the kind (:attr:`DerivedKind.version_property`); its
assets inside the version have relative hrefs ``./v/<version>/...``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CubelakeError
from .lake import AnyLake, derived_key, safe_scene_id
from .object_lake import version_time
from .storage import CommitConflict, StorageError, read_json_info

__all__ = ["DATACUBES", "GRACE", "ITEM_FILE", "PREDICTIONS", "DerivedError", "DerivedKind", "check_name",
           "is_complete", "item_matches", "item_version", "list_items", "product_lock", "product_staging",
           "prune_versions", "publish", "read_item", "search_items", "version_url"]

log = logging.getLogger(__name__)

#: How long a superseded version stays on an object store (a reader elsewhere may still be reading it).
GRACE = dt.timedelta(hours=6)
ITEM_FILE = "item.json"
_MAX_ITEM = 64 * 1024 * 1024
_ZARR_TYPE = "application/vnd+zarr"


class DerivedError(CubelakeError, ValueError):
    """A derived product's name or item cannot be published as asked."""


@dataclass(frozen=True, slots=True)
class DerivedKind:
    """One kind of derived product: its lake folder, its name in messages, the item property naming the version."""

    root: str  # a folder of cubelake.lake.DERIVED_ROOTS
    noun: str  # "datacube", "prediction"
    version_property: str  # the item property holding the published version
    again: str  # what to do after losing a race, for the message

    def key(self, name: str, *parts: str) -> str:
        """``<root>/<name>/<parts...>``, every part checked."""
        return derived_key(self.root, name, *parts)


DATACUBES = DerivedKind("datacubes", "datacube", "cubelake:cube_version", "Run the build again")
PREDICTIONS = DerivedKind("predictions", "prediction", "cubelake:version", "Run the prediction again")


def check_name(kind: DerivedKind, name: str) -> str:
    """``name`` if it can name a product (letters, digits, ``.``, ``_``, ``-``: a folder and the item id)."""
    if not isinstance(name, str) or not name or safe_scene_id(name) != name:
        shown = safe_scene_id(name) if isinstance(name, str) and name else kind.noun
        raise DerivedError(f"{kind.noun} name {name!r}: use letters, digits, '.', '_' and '-' only (not starting "
                           f"or ending with a separator), e.g. {shown!r}")
    return name


@contextlib.contextmanager
def product_lock(lake: AnyLake, kind: DerivedKind, name: str) -> Iterator[None]:
    """One build of a product at a time on this machine (on an object store the conditional commit decides)."""
    with lake.lock(f"{kind.noun}-{name}"):
        yield


@contextlib.contextmanager
def product_staging(lake: AnyLake, kind: DerivedKind, name: str) -> Iterator[Path]:
    """A private folder to build a version in (inside the lake on disk, so it is renamed into place); removed
    on exit unless published."""
    with lake.staging(f"{kind.noun}-{name}") as path:
        yield path


def read_item(lake: AnyLake, kind: DerivedKind, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """The product's published item and its ETag; ``(None, None)`` when there is no such product."""
    return read_json_info(lake.store, kind.key(name, ITEM_FILE), _MAX_ITEM)


def item_version(kind: DerivedKind, item: dict[str, Any]) -> str | None:
    """The version an item publishes, if it names a safe one."""
    version = (item.get("properties") or {}).get(kind.version_property)
    return version if isinstance(version, str) and version and safe_scene_id(version) == version else None


def version_url(lake: AnyLake, kind: DerivedKind, name: str, item: dict[str, Any], *parts: str) -> str:
    """Where ``parts`` of the version the item publishes are (a local path or an object-store URL)."""
    version = item_version(kind, item)
    if version is None:
        raise DerivedError(f"{lake.store.url_of(kind.key(name, ITEM_FILE))}: names no version "
                           f"({kind.version_property}); build the {kind.noun} again")
    return lake.store.url_of(kind.key(name, "v", version, *parts))


def _version_keys(kind: DerivedKind, name: str, item: dict[str, Any], version: str) -> list[str] | None:
    """The key that proves each asset inside the version is there (a Zarr store's root metadata, written
    last); ``None`` if an href points inside the lake but outside the version."""
    keys = []
    for asset in (item.get("assets") or {}).values():
        href = asset.get("href") if isinstance(asset, dict) else None
        if not isinstance(href, str) or "://" in href or href.startswith("/"):
            continue  # absolute: not part of the version (a model file the item records, say)
        prefix = f"./v/{version}/"
        if not href.startswith(prefix):
            return None
        parts = href[len(prefix):].rstrip("/").split("/")
        if str(asset.get("type", "")).startswith(_ZARR_TYPE):
            parts.append("zarr.json")
        try:
            keys.append(kind.key(name, "v", version, *parts))
        except CubelakeError:
            return None
    return keys


def is_complete(lake: AnyLake, kind: DerivedKind, name: str, item: dict[str, Any]) -> bool:
    """Whether the version the item publishes is there: every asset it lists inside the version exists."""
    version = item_version(kind, item)
    if version is None:
        return False
    keys = _version_keys(kind, name, item, version)
    return keys is not None and bool(keys) and all(lake.store.exists(k) for k in keys)


def _place(lake: AnyLake, staged: Path, prefix: str) -> None:
    """Put the staged version folder at ``prefix``: one rename on disk, an upload (8 objects at a time) else."""
    if lake.is_local:
        target = Path(str(lake.root)) / prefix
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, target)
        return
    files = [(p, p.relative_to(staged).as_posix()) for p in sorted(staged.rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="cubelake-derived-upload") as pool:
        for done in [pool.submit(lake.store.put, f"{prefix}/{rel}", path) for path, rel in files]:
            done.result()


def _remove(lake: AnyLake, prefix: str) -> None:
    if lake.is_local:
        shutil.rmtree(Path(str(lake.root)) / prefix, ignore_errors=True)
    else:
        lake.store.delete_prefix(prefix)


def publish(lake: AnyLake, kind: DerivedKind, name: str, staged: Path, item: dict[str, Any],
            etag: str | None) -> str:
    """Publish the version built in ``staged`` with its ``item``; the URL of the item.

    ``etag``: that of the item read before the build (``None``: there was none). Raises
    :class:`~cubelake.storage.CommitConflict` (having removed this version) when another build
    committed the product meanwhile.
    """
    version = item_version(kind, item)
    if version is None:
        raise DerivedError(f"{kind.noun} {name}: the item names no version to publish ({kind.version_property})")
    prefix = kind.key(name, "v", version)
    key = kind.key(name, ITEM_FILE)
    body = (json.dumps(item, indent=1, allow_nan=False) + "\n").encode()
    try:
        _place(lake, staged, prefix)
        if etag is None:
            lake.store.put(key, body, create=True)
        else:
            lake.store.put(key, body, if_match=etag)
    except BaseException as exc:
        with contextlib.suppress(Exception):  # the upload is unreferenced: remove what there is of it
            _remove(lake, prefix)
        if isinstance(exc, CommitConflict):
            raise CommitConflict(f"{lake.url}: {kind.noun} {name} was published by another build while this one "
                                 f"ran; nothing of this run was published. {kind.again}") from None
        raise
    pruned = prune_versions(lake, kind, name, keep=version)
    log.info("%s: %s %s published as version %s%s", lake.url, kind.noun, name, version,
             f" ({len(pruned)} superseded version(s) removed)" if pruned else "")
    return lake.store.url_of(key)


def prune_versions(lake: AnyLake, kind: DerivedKind, name: str, keep: str, grace: dt.timedelta = GRACE) -> list[str]:
    """Remove the product's versions other than ``keep``: all on disk, those older than ``grace`` on an object store."""
    versions, _ = lake.store.list_dirs(kind.key(name, "v"))
    now = dt.datetime.now(dt.UTC)
    removed = []
    for v in versions:
        born = version_time(v)
        if v == keep or safe_scene_id(v) != v or (not lake.is_local and born is not None and now - born < grace):
            continue
        try:
            _remove(lake, kind.key(name, "v", v))
        except StorageError as exc:  # the next build tries again
            log.warning("%s: could not remove superseded version %s of %s %s: %s", lake.url, v, kind.noun, name, exc)
            continue
        removed.append(v)
    return removed


def list_items(lake: AnyLake, kind: DerivedKind, *, absolute: bool = False) -> list[dict[str, Any]]:
    """The item of every published product of the kind, by name; ``absolute``: hrefs made absolute, with a
    ``self`` link."""
    from cubelake.catalog.items import with_absolute_hrefs

    names, _ = lake.store.list_dirs(kind.root)
    out = []
    for name in names:
        if safe_scene_id(name) != name:
            continue
        item, _ = read_item(lake, kind, name)
        if item is None:
            continue
        out.append(with_absolute_hrefs(item, lake.store.url_of(kind.key(name, ITEM_FILE))) if absolute else item)
    return out


def item_matches(item: dict[str, Any], parsed: Any) -> bool:
    """Whether an item meets a parsed query's place (footprint) and time (its interval overlaps)."""
    from shapely.geometry import shape

    from cubelake.catalog.query import epoch

    if parsed.geometry is not None:
        geom = item.get("geometry")
        if not geom or not shape(geom).intersects(parsed.geometry):
            return False
    if parsed.has_time:
        props = item.get("properties") or {}
        start = props.get("start_datetime") or props.get("datetime")
        end = props.get("end_datetime") or props.get("datetime")
        if not start or not end:
            return False
        if (parsed.t_end is not None and epoch(start) > parsed.t_end) or \
                (parsed.t_start is not None and epoch(end) < parsed.t_start):
            return False
    return True


def search_items(lake: AnyLake, kind: DerivedKind, query: Any | None = None, *,
                 absolute: bool = False) -> list[dict[str, Any]]:
    """The items of the kind's products meeting ``query`` (a :class:`cubelake.catalog.Query`: its ``bbox``,
    ``intersects`` and ``datetime`` apply); raises :class:`~cubelake.errors.CatalogQueryError` for a bad one."""
    from cubelake.catalog.query import parse_query

    parsed = parse_query(query) if query is not None else None
    return [it for it in list_items(lake, kind, absolute=absolute) if parsed is None or item_matches(it, parsed)]
