"""HDF5 plumbing shared by the HDF5/NetCDF-4 readers (EMIT, PRISMA, generic cubes).

Product files are untrusted: every group, dataset and attribute a reader needs is looked up
here, so a missing or mis-shaped one is a :class:`SceneReadError` that names the file, the
missing piece and what the product should have had. Attributes are read only after their
size is checked (HDF5 allows attributes of any size in dense storage). A truncated or damaged
file is refused when it is opened, or at the first block that cannot be read.

Object-store inputs (GDAL's ``/vsis3/`` names) are opened through :mod:`cubelake.storage`'s
ranged reader, so h5py reads only the byte ranges it needs.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

import numpy as np

from cubelake.errors import SceneReadError
from cubelake.storage import object_at, url_of_gdal_path

from ._base import display_name

__all__ = [
    "HDF5_SIGNATURE",
    "attr",
    "attr_floats",
    "attr_text",
    "dataset",
    "epsg_of_wkt",
    "hdf5_signature_at",
    "is_netcdf3",
    "iso_utc",
    "open_h5",
]

log = logging.getLogger(__name__)

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: An HDF5 file may start with a user block of 512, 1024, 2048 ... bytes (MATLAB v7.3 uses 512).
_SIGNATURE_OFFSETS = (0, 512, 1024, 2048)
#: HDF5's chunk cache per dataset (its default is 1 MiB): a compressed chunk bigger than that is decoded
#: again for every window that touches it; EMIT's swath is read by many windows per chunk.
CHUNK_CACHE_BYTES = 64 * 1024 * 1024
#: No product attribute needs more numbers than this (a per-band list of a few hundred bands, a WKT).
MAX_ATTR_ELEMENTS = 1 << 16


def hdf5_signature_at(head: bytes) -> int | None:
    """Where the HDF5 signature is in the first 2 KiB + 8 bytes of a file, or ``None``."""
    for off in _SIGNATURE_OFFSETS:
        if head[off : off + 8] == HDF5_SIGNATURE:
            return off
    return None


def is_netcdf3(head: bytes) -> bool:
    """NetCDF classic (CDF-1), 64-bit offset (CDF-2) or CDF-5."""
    return head[:3] == b"CDF" and head[3:4] in (b"\x01", b"\x02", b"\x05")


def open_h5(path: str | os.PathLike[str]) -> Any:
    """An open ``h5py.File`` (read-only); a truncated or damaged file is a :class:`SceneReadError`."""
    import h5py

    url = url_of_gdal_path(path)
    handle: Any = None
    try:
        if url is not None:
            store, key = object_at(url)
            handle = store.open_reader(key)
            return h5py.File(handle, "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
        return h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        if handle is not None:
            handle.close()
        raise SceneReadError(
            f"{display_name(path)}: not a readable HDF5 file ({exc}); it is truncated or damaged. "
            "Download it again (compare its checksum with the archive's)") from exc


def _name(obj: Any) -> str:
    return str(obj.name) if obj.name not in (None, "/") else "the root group"


def dataset(h5: Any, key: str, path: str, *, product: str, ndim: int | None = None) -> Any:
    """The dataset ``key``; a missing group/dataset or a wrong rank is an error naming it."""
    import h5py

    parts = key.strip("/").split("/")
    node = h5
    for i, part in enumerate(parts):
        where = "/".join(parts[: i + 1])
        try:
            node = node[part]
        except (KeyError, ValueError):
            kind = "dataset" if i == len(parts) - 1 else "group"
            raise SceneReadError(f"{display_name(path)}: no {kind} '{where}'; {product} files have '{key}'. "
                                 "The file is incomplete or another product") from None
    if not isinstance(node, h5py.Dataset):
        raise SceneReadError(f"{display_name(path)}: '{key}' is a group, not a dataset; a {product} file has it "
                             "as an array")
    if ndim is not None and node.ndim != ndim:
        raise SceneReadError(f"{display_name(path)}: '{key}' has {node.ndim} dimensions {node.shape}; {product} "
                             f"file has {ndim}")
    return node


def attr(obj: Any, name: str, path: str, *, product: str, required: bool = True) -> Any:
    """An attribute's value (numpy array or scalar), size-checked before it is read; ``None`` if absent
    and not ``required``."""
    if name not in obj.attrs:
        if not required:
            return None
        raise SceneReadError(f"{display_name(path)}: attribute '{name}' missing on {_name(obj)}; {product} "
                             "file has it. The file is incomplete or another product")
    shape = obj.attrs.get_id(name).shape or ()
    if int(np.prod(shape, dtype=np.int64)) > MAX_ATTR_ELEMENTS:
        raise SceneReadError(f"{display_name(path)}: attribute '{name}' has {int(np.prod(shape))} elements, far more "
                             f"than a {product} file's; the file is damaged or not that product")
    try:
        return obj.attrs[name]
    except (OSError, TypeError, ValueError) as exc:
        raise SceneReadError(f"{display_name(path)}: attribute '{name}' cannot be read ({exc})") from exc


def attr_text(obj: Any, name: str, path: str, *, product: str, required: bool = True) -> str | None:
    """A text attribute (bytes, numpy string or a one-element array of either) as ``str``."""
    v = attr(obj, name, path, product=product, required=required)
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        if v.size != 1:
            raise SceneReadError(f"{display_name(path)}: attribute '{name}' is an array of {v.size}; text expected")
        v = v.reshape(()).item()
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    return str(v)


def attr_floats(obj: Any, name: str, path: str, *, product: str, n: int | None = None,
                required: bool = True) -> list[float] | None:
    """A numeric attribute as floats, with ``n`` elements when given."""
    v = attr(obj, name, path, product=product, required=required)
    if v is None:
        return None
    a = np.atleast_1d(np.asarray(v))
    if a.dtype.kind not in "uif":
        raise SceneReadError(f"{display_name(path)}: attribute '{name}' is {a.dtype} ({a.ravel()[:3]!r}...); "
                             f"a {product} file has numbers")
    if n is not None and a.size != n:
        raise SceneReadError(f"{display_name(path)}: attribute '{name}' has {a.size} values for {n} bands; "
                             "the file is inconsistent")
    return [float(x) for x in a.ravel()]

def iso_utc(text: str | None, what: str) -> str | None:
    """A product's time attribute (``2023-02-17T06:40:52+0000``, ``2020-06-13T10:23:41.123``: naive = UTC) as
    ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``; an unparseable one is logged and ``None``."""
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        log.warning("%s %r is not an ISO 8601 time; ignored", what, text)
        return None
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return t.isoformat().replace("+00:00", "Z")


def epsg_of_wkt(wkt: str | None) -> int | None:
    """The EPSG code of a CRS given as WKT, when it has one (pyproj)."""
    if not wkt:
        return None
    from pyproj import CRS
    from pyproj.exceptions import CRSError

    try:
        return CRS.from_wkt(wkt).to_epsg()
    except CRSError:
        return None
