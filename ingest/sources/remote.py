"""Scenes on an object store (``s3://bucket/key`` or a prefix of them), read without downloading them.

GeoTIFFs are read by GDAL through ``/vsis3/`` with HTTP range requests: the header, then the
blocks the scan asks for, so memory stays that of a local ingest whatever the scene's size.
Their identity is the object's ETag and size (hashing a multi-GB object would mean reading it
all). Other formats are refused with what to do (download the scene and ingest the copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from cubelake.storage import (
    ObjectNotFound,
    S3Options,
    StorageError,
    Store,
    object_at,
    open_store,
    split_url,
)

from . import SceneInput, SceneKind

__all__ = ["REMOTE_TIFF", "discover_remote", "gdal_path", "remote_input"]

log = logging.getLogger(__name__)

REMOTE_TIFF = (".tif", ".tiff")
_SIDECARS = (".aux.xml", ".ovr", ".txt", ".md", ".json", ".xml", ".html", ".pdf", ".png", ".jpg", ".prj")
_MAX_OBJECTS = 100_000  # a prefix listing this long is not a folder of scenes


def gdal_path(url: str) -> Path:
    """GDAL's name for an object: ``/vsis3/bucket/key``."""
    scheme, where = split_url(url)
    if scheme != "s3":
        raise ValueError(f"{url}: only s3:// sources can be read from an object store")
    return Path(f"/vsis3/{where}")


def _scene(url: str, explicit: bool) -> SceneInput | None:
    name = PurePosixPath(url).name.lower()
    if name.endswith(REMOTE_TIFF):
        return SceneInput(path=gdal_path(url), kind=SceneKind.GDAL, url=url)
    if name.endswith(".mat"):  # HDF5/MAT needs random access over the whole file: fetched when it is read
        return SceneInput(path=Path(PurePosixPath(url).name), kind=SceneKind.MAT, url=url)
    if not explicit and name.endswith(_SIDECARS):
        return None
    return SceneInput(path=gdal_path(url), kind=SceneKind.SPECIAL, url=url,
                      problem=f"{url}: only GeoTIFF (read in place) and MATLAB (fetched) scenes are read from object "
                              "stores so far; download this one and ingest the local copy")


def discover_remote(url: str, options: S3Options | None = None) -> list[SceneInput]:
    """The scenes at ``url``: one object, or every object below it as a prefix (in key order)."""
    scheme, _ = split_url(url)
    if scheme != "s3":
        return [SceneInput(path=Path(url), kind=SceneKind.SPECIAL, url=url,
                           problem=f"{url}: only s3:// sources can be read from an object store")]
    store, key = object_at(url.rstrip("/"), options)
    with contextlib.suppress(ObjectNotFound):
        store.head(key)
        return [s for s in [_scene(url, True)] if s is not None]
    prefix = open_store(url.rstrip("/"), options)
    try:
        return _listed(url, prefix)
    except StorageError as exc:
        if "invalid path" not in str(exc):
            raise  # the bucket or the endpoint: the whole run's problem
        # object_store refuses a whole listing that holds one key it cannot parse (control characters)
        return [SceneInput(path=gdal_path(url), kind=SceneKind.SPECIAL, url=url,
                           problem=f"{exc}; rename that object, or name the scenes below this prefix one by one")]


def _listed(url: str, prefix: Store) -> list[SceneInput]:
    out: list[SceneInput] = []
    for n, obj in enumerate(prefix.list()):
        if n >= _MAX_OBJECTS:
            out.append(SceneInput(path=gdal_path(url), kind=SceneKind.SPECIAL, url=url,
                                  problem=f"{url}: more than {_MAX_OBJECTS} objects below this prefix; name a "
                                          "narrower prefix"))
            break
        try:
            scene = _scene(prefix.url_of(obj.key), False)
        except StorageError:  # a key cubelake would not write or read (control characters, '..' parts)
            scene = SceneInput(path=gdal_path(url), kind=SceneKind.SPECIAL, url=f"{url.rstrip('/')}/{obj.key!r}",
                               problem=f"{url.rstrip('/')}/{obj.key!r}: an object key with control characters or "
                                       "'..' parts cannot be a scene; rename the object")
        if scene is not None:
            out.append(scene)
    if not out:
        return [SceneInput(path=gdal_path(url), kind=SceneKind.MISSING, url=url,
                           problem=f"{url}: no such object, and no scene below it as a prefix; check the URL")]
    return out


@contextlib.contextmanager
def remote_input(inp: SceneInput, options: S3Options | None = None) -> Iterator[SceneInput]:
    """The scene ready to read: GDAL's S3 settings set for a GeoTIFF read in place; a MATLAB file (which
    needs random access over all of it) streamed to a local temporary file, removed afterwards."""
    if inp.url is None:
        yield inp
        return
    if inp.kind is SceneKind.MAT:
        from cubelake.object_lake import staging_root

        folder = Path(tempfile.mkdtemp(prefix=f"source.{os.getpid()}.", dir=staging_root()))
        try:
            local = folder / PurePosixPath(inp.url).name
            store, key = object_at(inp.url, options)
            log.info("%s: fetching the whole object to %s: the MATLAB format needs random access to all of it",
                     inp.url, local)
            store.download(key, local)
            yield dataclasses.replace(inp, path=local)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    with S3Options.coerce(options).gdal_env():
        yield inp
