"""Where built cubes live in a lake, how a build appears atomically, and how cubes are found again.

Layout (keys from :func:`cubelake.lake.datacube_key`, the same on disk and on an object store)::

    datacubes/<name>/item.json                   the cube's STAC item, and its commit object
    datacubes/<name>/v/<version>/<name>.zarr     one immutable build (version: UTC time + randomness)

Publication follows the object lake's protocol on both kinds of lake: a build is completed in a
private staging folder, put under a fresh version folder (one ``rename`` on disk, an upload on an
object store), and made visible by writing ``item.json`` conditionally: create-only for a new cube,
``If-Match`` on the ETag read before the build to replace one. Readers find the cube through
``item.json`` only, so they see the old build or the new one, never a partial one; of two builds
racing for one name exactly one commits, and the other's upload is deleted. Superseded versions
are removed after the commit: on disk at once (as a replaced scene is), on an object store once
older than :data:`GRACE` (readers on other machines may still be reading them).
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
from pathlib import Path
from typing import Any

from cubelake.catalog.items import with_absolute_hrefs
from cubelake.lake import AnyLake, datacube_key, open_lake, safe_scene_id
from cubelake.object_lake import version_time
from cubelake.storage import CommitConflict, StorageError, open_store, read_json_info

from .errors import CubeSettingsError, DatacubeError
from .item import CB_CUBE_VERSION, ITEM_FILE

__all__ = ["GRACE", "check_name", "cube_lock", "cube_staging", "cube_zarr_url", "is_complete", "list_cube_items",
           "open_cube", "prune_versions", "publish_cube", "read_cube_item", "search_cube_items"]

log = logging.getLogger(__name__)

#: How long a superseded version stays on an object store (a reader elsewhere may still be reading it).
GRACE = dt.timedelta(hours=6)
_MAX_ITEM = 64 * 1024 * 1024


def check_name(name: str) -> str:
    """A cube name: letters, digits, ``.``, ``_``, ``-`` (it names a folder and the STAC item id)."""
    if not name or safe_scene_id(name) != name:
        raise CubeSettingsError(f"cube name {name!r}: use letters, digits, '.', '_' and '-' only (not starting or "
                                f"ending with a separator), e.g. {safe_scene_id(name or 'cube')!r}")
    return name


def _lock_id(name: str) -> str:
    return f"datacube-{name}"


@contextlib.contextmanager
def cube_lock(lake: AnyLake, name: str) -> Iterator[None]:
    """One build of a cube at a time on this machine (on an object store the conditional commit decides)."""
    with lake.lock(_lock_id(name)):
        yield


@contextlib.contextmanager
def cube_staging(lake: AnyLake, name: str) -> Iterator[Path]:
    """A private folder to build a version in (inside the lake on disk, so it is renamed into place)."""
    with lake.staging(_lock_id(name)) as path:
        yield path


def read_cube_item(lake: AnyLake, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """The cube's published item and its ETag; ``(None, None)`` when there is no such cube."""
    return read_json_info(lake.store, datacube_key(name, ITEM_FILE), _MAX_ITEM)


def _version(item: dict[str, Any]) -> str | None:
    version = (item.get("properties") or {}).get(CB_CUBE_VERSION)
    return version if isinstance(version, str) and safe_scene_id(version) == version else None


def cube_zarr_url(lake: AnyLake, name: str, item: dict[str, Any]) -> str:
    """Where the published item's Zarr store is (a local path or an object-store URL)."""
    version = _version(item)
    if version is None:
        raise DatacubeError(f"{lake.store.url_of(datacube_key(name, ITEM_FILE))}: names no version "
                            f"({CB_CUBE_VERSION}); rebuild the cube with 'cubelake cube build'")
    return lake.store.url_of(datacube_key(name, "v", version, f"{name}.zarr"))


def is_complete(lake: AnyLake, name: str, item: dict[str, Any]) -> bool:
    """Whether the version the item publishes is there (its Zarr metadata, written last, exists)."""
    version = _version(item)
    return version is not None and lake.store.exists(datacube_key(name, "v", version, f"{name}.zarr", "zarr.json"))


def _place(lake: AnyLake, staged: Path, prefix: str) -> None:
    """Put the staged version folder at ``prefix``: one rename on disk, an upload (8 objects at a time) else."""
    if lake.is_local:
        target = Path(str(lake.root)) / prefix
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, target)
        return
    files = [(p, p.relative_to(staged).as_posix()) for p in sorted(staged.rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="cubelake-cube-upload") as pool:
        for done in [pool.submit(lake.store.put, f"{prefix}/{rel}", path) for path, rel in files]:
            done.result()


def _remove(lake: AnyLake, prefix: str) -> None:
    if lake.is_local:
        shutil.rmtree(Path(str(lake.root)) / prefix, ignore_errors=True)
    else:
        lake.store.delete_prefix(prefix)


def publish_cube(lake: AnyLake, name: str, staged: Path, item: dict[str, Any], etag: str | None) -> str:
    """Publish the version built in ``staged`` with its ``item``; the URL of the item.

    ``etag``: that of the item read before the build (``None``: there was none). Raises
    :class:`~cubelake.storage.CommitConflict` (having removed this version) when another build
    committed the cube meanwhile.
    """
    version = _version(item)
    if version is None:
        raise DatacubeError(f"cube {name}: the item names no version to publish")
    prefix = datacube_key(name, "v", version)
    key = datacube_key(name, ITEM_FILE)
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
            raise CommitConflict(f"{lake.url}: datacube {name} was published by another build while this one ran; "
                                 "nothing of this run was published. Run the build again") from None
        raise
    pruned = prune_versions(lake, name, keep=version)
    log.info("%s: datacube %s published as version %s%s", lake.url, name, version,
             f" ({len(pruned)} superseded version(s) removed)" if pruned else "")
    return lake.store.url_of(key)


def prune_versions(lake: AnyLake, name: str, keep: str, grace: dt.timedelta = GRACE) -> list[str]:
    """Remove the cube's versions other than ``keep``: all on disk, those older than ``grace`` on an object store."""
    versions, _ = lake.store.list_dirs(datacube_key(name, "v"))
    now = dt.datetime.now(dt.UTC)
    removed = []
    for v in versions:
        born = version_time(v)
        if v == keep or safe_scene_id(v) != v or (not lake.is_local and born is not None and now - born < grace):
            continue
        try:
            _remove(lake, datacube_key(name, "v", v))
        except StorageError as exc:  # the next build tries again
            log.warning("%s: could not remove superseded version %s of datacube %s: %s", lake.url, v, name, exc)
            continue
        removed.append(v)
    return removed


def list_cube_items(lake: AnyLake, *, absolute: bool = False) -> list[dict[str, Any]]:
    """The item of every published cube, by name; ``absolute``: hrefs made absolute, with a ``self`` link."""
    names, _ = lake.store.list_dirs("datacubes")
    out = []
    for name in names:
        if safe_scene_id(name) != name:
            continue
        item, _ = read_cube_item(lake, name)
        if item is None:
            continue
        out.append(with_absolute_hrefs(item, lake.store.url_of(datacube_key(name, ITEM_FILE))) if absolute else item)
    return out


def _matches(item: dict[str, Any], parsed: Any) -> bool:
    """Whether a cube item meets a parsed query's place (footprint) and time (its interval overlaps)."""
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


def search_cube_items(lake: AnyLake, query: Any | None = None, *, absolute: bool = False) -> list[dict[str, Any]]:
    """The items of the published cubes meeting ``query`` (a :class:`cubelake.catalog.Query`: its ``bbox``,
    ``intersects`` and ``datetime`` apply); raises :class:`~cubelake.errors.CatalogQueryError` for a bad one."""
    from cubelake.catalog.query import parse_query

    parsed = parse_query(query) if query is not None else None
    return [it for it in list_cube_items(lake, absolute=absolute) if parsed is None or _matches(it, parsed)]


def open_cube(lake: AnyLake | str | Path, name: str, *, chunks: Any = "auto", dtype: str = "float32") -> Any:
    """The published cube ``name`` as an xarray Dataset ``data (time, band, y, x)``, analysis-ready as a scene is.

    Values are CF-decoded to ``dtype`` (NaN where no scene has one), ``wavelength``/``fwhm`` loaded
    and ``wavelength`` indexed (``ds.sel(wavelength=slice(800, 900))``). ``chunks``: dask chunks as
    in ``xr.open_dataset`` (``None``: no dask).
    """
    import xarray as xr

    # the one home of "analysis-ready" (for scenes and cubes alike)
    from cubelake.products import _analysis_ready

    lk = open_lake(lake, create=False)
    item, _ = read_cube_item(lk, check_name(name))
    if item is None:
        raise DatacubeError(f"no datacube {name!r} in {lk.url}; list them with 'cubelake cube list --lake {lk.url}'")
    url = cube_zarr_url(lk, name, item)
    target: Any = url if lk.is_local else open_store(url, lk.store.options).zarr_store()
    return _analysis_ready(xr.open_dataset(target, engine="zarr", consolidated=True, chunks=chunks), dtype)
