"""Scenes on an object store (``s3://bucket/key`` or a prefix of them), read without downloading them.

GeoTIFFs, ENVI scenes (a header and its raw data object) and Landsat MTL sets (the MTL and the
band GeoTIFFs it names) are read by GDAL through ``/vsis3/`` with HTTP range requests: headers,
then the blocks the scan asks for, so memory stays that of a local ingest whatever the scene's
size. EnMAP/DESIS deliveries are read in place as well (the METADATA.XML by one bounded GET, the
image through GDAL; the delivery's other objects belong to the XML). HDF5 and NetCDF-4 files
(EMIT, PRISMA, research cubes) are read in place too: h5py reads
them through a ranged object reader, fetching only the metadata and chunks a window needs.
The small text files (an ENVI header, an MTL) are read by one size-bounded ranged GET. A
prefix is grouped into scenes as a local folder is: a header with its data object, an MTL with
its band objects. A scene's identity is the ETag and size of each of its objects (hashing a
multi-GB object would mean reading it all). MATLAB files need random access over all of them and
are fetched to a temporary file; other formats are refused with what to do (download the scene
and ingest the copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from cubelake.errors import CubelakeError
from cubelake.storage import (
    ObjectNotFound,
    S3Options,
    StorageError,
    Store,
    gdal_vsi_path,
    object_at,
    open_store,
    split_url,
    url_of_gdal_path,
)

from . import SceneInput, SceneKind
from ._base import is_regular_file
from .dlr import dlr_side_files, is_dlr_metadata
from .envi import envi_data_candidates, envi_header_candidates
from .landsat import is_mtl, mtl_band_files, parse_mtl

__all__ = ["REMOTE_TIFF", "discover_remote", "gdal_path", "remote_input"]

log = logging.getLogger(__name__)

REMOTE_TIFF = (".tif", ".tiff")
#: HDF5-based files read in place (their content picks the reader: EMIT, PRISMA or a generic cube)
REMOTE_HDF = (".nc", ".nc4", ".h5", ".he5", ".hdf5")
_SIDECARS = (".aux.xml", ".ovr", ".txt", ".md", ".json", ".xml", ".html", ".pdf", ".png", ".jpg", ".prj")
_MAX_OBJECTS = 100_000  # a prefix listing this long is not a folder of scenes

#: Whether an object exists: a key of the listing at hand, or a HEAD for a URL named on its own.
_Exists = Callable[[Path], bool]


def gdal_path(url: str) -> Path:
    """GDAL's name for an object: ``/vsis3/bucket/key``."""
    return Path(gdal_vsi_path(url))


def _envi(header: Path, exists: _Exists) -> SceneInput:
    data = next((c for c in envi_data_candidates(header) if exists(c)), None)
    return SceneInput(path=header, kind=SceneKind.ENVI, data=data, url=url_of_gdal_path(header))


def _scene(url: str, explicit: bool, exists: _Exists) -> SceneInput | None:
    """The scene an object is, in the order local discovery decides (MTL, ENVI header, ENVI data, ...);
    ``None`` for an object of a listing that is part of another scene or a sidecar."""
    path = gdal_path(url)
    name = path.name.lower()
    if is_mtl(path):
        return SceneInput(path=path, kind=SceneKind.LANDSAT, url=url)
    if name.endswith("-metadata.xml") and is_dlr_metadata(path):  # an EnMAP/DESIS delivery
        return SceneInput(path=path, kind=SceneKind.DLR, url=url)
    if name.endswith(".hdr"):
        return _envi(path, exists)
    header = next((c for c in envi_header_candidates(path) if exists(c)), None)
    if header is not None:  # an ENVI data object: its header is the scene (listed on its own)
        return _envi(header, exists) if explicit else None
    if name.endswith(REMOTE_TIFF + REMOTE_HDF):
        return SceneInput(path=path, kind=SceneKind.GDAL, url=url)
    if name.endswith(".mat"):  # HDF5/MAT needs random access over the whole file: fetched when it is read
        return SceneInput(path=Path(PurePosixPath(url).name), kind=SceneKind.MAT, url=url)
    if not explicit and name.endswith(_SIDECARS):
        return None
    return SceneInput(path=path, kind=SceneKind.SPECIAL, url=url,
                      problem=f"{url}: this format is not read from object stores (GeoTIFF, NetCDF/HDF5 (.nc, .h5, "
                              ".he5), ENVI header + data, Landsat MTL + band objects and EnMAP/DESIS METADATA.XML + "
                              "image are read in place, MATLAB files fetched); download it and ingest the local "
                              "copy")


def discover_remote(url: str, options: S3Options | None = None) -> list[SceneInput]:
    """The scenes at ``url``: one object, or every object below it as a prefix (in key order)."""
    scheme, _ = split_url(url)
    if scheme != "s3":
        return [SceneInput(path=Path(url), kind=SceneKind.SPECIAL, url=url,
                           problem=f"{url}: only s3:// sources can be read from an object store")]
    store, key = object_at(url.rstrip("/"), options)
    with contextlib.suppress(ObjectNotFound):
        store.head(key)
        return [s for s in [_scene(url, True, is_regular_file)] if s is not None]
    prefix = open_store(url.rstrip("/"), options)
    try:
        return _listed(url, prefix)
    except StorageError as exc:
        if "invalid path" not in str(exc):
            raise  # the bucket or the endpoint: the whole run's problem
        # object_store refuses a whole listing that holds one key it cannot parse (control characters)
        return [SceneInput(path=gdal_path(url), kind=SceneKind.SPECIAL, url=url,
                           problem=f"{exc}; rename that object, or name the scenes below this prefix one by one")]


def _objects(url: str, prefix: Store) -> list[str | SceneInput]:
    """The URLs of the objects below ``prefix`` in key order; those that cannot be scenes as problems."""
    out: list[str | SceneInput] = []
    for n, obj in enumerate(prefix.list()):
        if n >= _MAX_OBJECTS:
            out.append(SceneInput(path=gdal_path(url), kind=SceneKind.SPECIAL, url=url,
                                  problem=f"{url}: more than {_MAX_OBJECTS} objects below this prefix; name a "
                                          "narrower prefix"))
            break
        try:
            out.append(prefix.url_of(obj.key))
        except StorageError:  # a key cubelake would not write or read (control characters, '..' parts)
            out.append(SceneInput(path=gdal_path(url), kind=SceneKind.SPECIAL, url=f"{url.rstrip('/')}/{obj.key!r}",
                                  problem=f"{url.rstrip('/')}/{obj.key!r}: an object key with control characters "
                                          "or '..' parts cannot be a scene; rename the object"))
    return out


def _landsat_bands(paths: list[Path]) -> set[Path]:
    """The band objects the MTLs among ``paths`` name (each MTL read: it is small); matched against the
    listing, not looked up. An MTL that cannot be read consumes nothing: its scene reports why."""
    folders: dict[Path, set[str]] = {}
    for p in paths:
        folders.setdefault(p.parent, set()).add(p.name)
    bands: set[Path] = set()
    for p in paths:
        if not is_mtl(p):
            continue
        try:
            bands.update(f for _, f in mtl_band_files(p, parse_mtl(p), folders[p.parent])[0])
        except (CubelakeError, OSError) as exc:  # reported when the scene is opened
            log.debug("cannot list the bands of %s yet: %s", p, exc)
    return bands


def _dlr_files(paths: list[Path]) -> set[Path]:
    """The images, masks and quicklooks of the EnMAP/DESIS deliveries among ``paths`` (their XML is the scene)."""
    files: set[Path] = set()
    for p in paths:
        if p.name.lower().endswith("-metadata.xml") and is_dlr_metadata(p):
            files.update(dlr_side_files(p))
    return files


def _listed(url: str, prefix: Store) -> list[SceneInput]:
    entries = _objects(url, prefix)
    paths = {e: gdal_path(e) for e in entries if isinstance(e, str)}
    present = {str(p) for p in paths.values()}

    def listed(p: Path) -> bool:
        return str(p) in present

    consumed = _landsat_bands(list(paths.values())) | _dlr_files(list(paths.values()))
    out: list[SceneInput] = []
    for e in entries:
        if isinstance(e, SceneInput):
            out.append(e)
            continue
        scene = None if paths[e] in consumed else _scene(e, False, listed)
        if scene is not None:
            out.append(scene)
    if not out:
        return [SceneInput(path=gdal_path(url), kind=SceneKind.MISSING, url=url,
                           problem=f"{url}: no such object, and no scene below it as a prefix; check the URL")]
    return out


@contextlib.contextmanager
def remote_input(inp: SceneInput, options: S3Options | None = None) -> Iterator[SceneInput]:
    """The scene ready to read: GDAL's S3 settings set for a scene read in place (GeoTIFF, ENVI, Landsat);
    a MATLAB file (which needs random access over all of it) streamed to a local temporary file, removed
    afterwards."""
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
