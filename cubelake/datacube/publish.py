"""Where built cubes live in a lake, how a build appears atomically, and how cubes are found again.

Layout (keys from :func:`cubelake.lake.datacube_key`, the same on disk and on an object store)::

    datacubes/<name>/item.json                   the cube's STAC item, and its commit object
    datacubes/<name>/v/<version>/<name>.zarr     one immutable build (version: UTC time + randomness)

Publication is :mod:`cubelake.derived`'s protocol (predictions share it), on both kinds of lake: a
build is completed in a private staging folder, put under a fresh version folder (one ``rename`` on
disk, an upload on an object store), and made visible by writing ``item.json`` conditionally: create-only for a new cube,
``If-Match`` on the ETag read before the build to replace one. Readers find the cube through
``item.json`` only, so they see the old build or the new one, never a partial one; of two builds
racing for one name exactly one commits, and the other's upload is deleted. Superseded versions
are removed after the commit: on disk at once (as a replaced scene is), on an object store once
older than :data:`GRACE` (readers on other machines may still be reading them).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cubelake import derived
from cubelake.derived import DATACUBES, GRACE
from cubelake.lake import AnyLake, open_lake
from cubelake.storage import open_store

from .errors import CubeSettingsError, DatacubeError
from .item import CB_CUBE_VERSION

__all__ = ["GRACE", "check_name", "cube_lock", "cube_staging", "cube_zarr_url", "is_complete", "list_cube_items",
           "open_cube", "prune_versions", "publish_cube", "read_cube_item", "search_cube_items"]

def check_name(name: str) -> str:
    """A cube name: letters, digits, ``.``, ``_``, ``-`` (it names a folder and the STAC item id)."""
    try:
        return derived.check_name(DATACUBES, name)
    except derived.DerivedError as exc:  # a bad name is a settings (usage) error of the build
        raise CubeSettingsError(str(exc)) from None


@contextlib.contextmanager
def cube_lock(lake: AnyLake, name: str) -> Iterator[None]:
    """One build of a cube at a time on this machine (on an object store the conditional commit decides)."""
    with derived.product_lock(lake, DATACUBES, name):
        yield


@contextlib.contextmanager
def cube_staging(lake: AnyLake, name: str) -> Iterator[Path]:
    """A private folder to build a version in (inside the lake on disk, so it is renamed into place)."""
    with derived.product_staging(lake, DATACUBES, name) as path:
        yield path


def read_cube_item(lake: AnyLake, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """The cube's published item and its ETag; ``(None, None)`` when there is no such cube."""
    return derived.read_item(lake, DATACUBES, name)


def cube_zarr_url(lake: AnyLake, name: str, item: dict[str, Any]) -> str:
    """Where the published item's Zarr store is (a local path or an object-store URL)."""
    if derived.item_version(DATACUBES, item) is None:
        raise DatacubeError(f"{lake.store.url_of(DATACUBES.key(name, derived.ITEM_FILE))}: names no version "
                            f"({CB_CUBE_VERSION}); rebuild the cube with 'cubelake cube build'")
    return derived.version_url(lake, DATACUBES, name, item, f"{name}.zarr")


def is_complete(lake: AnyLake, name: str, item: dict[str, Any]) -> bool:
    """Whether the version the item publishes is there (its Zarr metadata, written last, exists)."""
    return derived.is_complete(lake, DATACUBES, name, item)


def publish_cube(lake: AnyLake, name: str, staged: Path, item: dict[str, Any], etag: str | None) -> str:
    """Publish the version built in ``staged`` with its ``item``; the URL of the item.

    ``etag``: that of the item read before the build (``None``: there was none). Raises
    :class:`~cubelake.storage.CommitConflict` (having removed this version) when another build
    committed the cube meanwhile.
    """
    if derived.item_version(DATACUBES, item) is None:
        raise DatacubeError(f"cube {name}: the item names no version to publish")
    return derived.publish(lake, DATACUBES, name, staged, item, etag)


def prune_versions(lake: AnyLake, name: str, keep: str, grace: dt.timedelta = GRACE) -> list[str]:
    """Remove the cube's versions other than ``keep``: all on disk, those older than ``grace`` on an object store."""
    return derived.prune_versions(lake, DATACUBES, name, keep, grace)


def list_cube_items(lake: AnyLake, *, absolute: bool = False) -> list[dict[str, Any]]:
    """The item of every published cube, by name; ``absolute``: hrefs made absolute, with a ``self`` link."""
    return derived.list_items(lake, DATACUBES, absolute=absolute)


def search_cube_items(lake: AnyLake, query: Any | None = None, *, absolute: bool = False) -> list[dict[str, Any]]:
    """The items of the published cubes meeting ``query`` (a :class:`cubelake.catalog.Query`: its ``bbox``,
    ``intersects`` and ``datetime`` apply); raises :class:`~cubelake.errors.CatalogQueryError` for a bad one."""
    return derived.search_items(lake, DATACUBES, query, absolute=absolute)


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
