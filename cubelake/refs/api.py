"""Make and open reference sets: the Python entry points behind ``cubelake refs`` and the ingest.

``build_refs`` references any tiled GeoTIFF, local or on S3, where it is; ``open_dataset`` opens
a reference set (JSON or Parquet, one scene or a stacked cube) as the same xarray dataset as the
native Zarr product, after checking every target against the allowed roots and its recorded
size and mtime/ETag.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cubelake.errors import NotReferenceableError, RefsError

from .build import reference_tiff
from .formats import load_refs
from .layout import TiffLayout, read_layout
from .model import RefSet, Target
from .security import AllowedRoots, split_url
from .store import RefsStore, S3Options, s3_config, s3_store

__all__ = ["build_refs", "lake_roots", "open_array", "open_dataset", "open_store", "stat_target", "tiff_layout"]


def lake_roots(path: str | Path) -> list[str] | None:
    """The reference roots of the lake holding ``path`` (see :meth:`Lake.reference_roots`), or ``None``."""
    from cubelake.lake import Lake

    p = Path(path).resolve()
    for parent in [p, *p.parents]:
        if (parent / "lake.json").is_file():
            return Lake(parent, create=False).reference_roots()
    return None


def open_store(path: str | Path, *, allowed_roots: Sequence[str] = (), storage_options: S3Options | None = None,
               verify: bool = True) -> RefsStore:
    """A read-only zarr store over the references at ``path``.

    Targets must lie under the lake holding ``path`` (plus the lake's own allowed roots), or
    under ``path``'s folder outside a lake, or under one of ``allowed_roots``.
    """
    refs = load_refs(path)
    base = lake_roots(path) or [str(Path(path).resolve().parent)]
    return RefsStore(refs, roots=AllowedRoots([*base, *allowed_roots]), storage_options=storage_options, verify=verify)


def open_array(path: str | Path, name: str = "data", **kw: Any) -> Any:
    """The ``name`` array (default ``data``) of a reference set, as a read-only ``zarr.Array``."""
    import zarr

    import cubelake.refs  # noqa: F401  (registers the codecs)

    return zarr.open_array(open_store(path, **kw), path=name, mode="r", zarr_format=2)


def open_dataset(path: str | Path, *, chunks: Any = None, allowed_roots: Sequence[str] = (),
                 storage_options: S3Options | None = None, **xr_kwargs: Any) -> Any:
    """The reference set at ``path`` as an xarray Dataset (``data (band, y, x)`` or ``(time, band, y, x)``)."""
    import xarray as xr

    store = open_store(path, allowed_roots=allowed_roots, storage_options=storage_options)
    return xr.open_dataset(store, engine="zarr"  # type: ignore[arg-type]
                           , consolidated=True, zarr_format=2, chunks=chunks, **xr_kwargs)


@contextlib.contextmanager
def _open_binary(url: str, storage_options: S3Options | None) -> Iterator[Any]:
    scheme, where = split_url(url)
    if scheme == "file":
        with open(where, "rb") as f:
            yield f
        return
    if scheme != "s3":
        raise RefsError(f"{url}: only local paths and s3:// URLs can be referenced")
    import obstore

    bucket, _, key = where.partition("/")
    reader = obstore.open_reader(s3_store(bucket, storage_options), key, buffer_size=1 << 20)
    try:
        yield _BytesReader(reader)
    finally:
        reader.close()


class _BytesReader(io.RawIOBase):
    """obstore's buffered object reader as a binary file whose reads return ``bytes`` (tifffile needs them)."""

    def __init__(self, reader: Any) -> None:
        self._r = reader

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._r.seek(offset, whence))

    def tell(self) -> int:
        return int(self._r.tell())

    def read(self, size: int = -1) -> bytes:
        return bytes(self._r.read(size if size is not None and size >= 0 else None))

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def stat_target(url: str, storage_options: S3Options | None = None) -> Target:
    """The target as it is now: size and mtime (local) or ETag (S3)."""
    scheme, where = split_url(url)
    if scheme == "file":
        st = os.stat(where)
        return Target(str(Path(where).resolve()), st.st_size, mtime_ns=st.st_mtime_ns)
    import obstore

    bucket, _, key = where.partition("/")
    head = obstore.head(s3_store(bucket, storage_options), key)
    return Target(url, int(head["size"]), etag=head.get("e_tag"))


def tiff_layout(url: str, storage_options: S3Options | None = None) -> TiffLayout:
    """The tile layout of the TIFF at ``url`` (header reads only)."""
    try:
        with _open_binary(url, storage_options) as fh:
            return read_layout(fh)
    except FileNotFoundError as exc:
        raise RefsError(f"{url}: no such file") from exc
    except Exception as exc:  # a damaged header can make tifffile raise almost anything
        raise NotReferenceableError(f"{url}: not a readable TIFF ({type(exc).__name__}: {exc})") from exc


def _gdal_env(storage_options: S3Options | None) -> Any:
    import rasterio
    from rasterio.session import AWSSession

    cfg, _client = s3_config(storage_options)
    endpoint = cfg.get("endpoint")
    opts: dict[str, Any] = {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR"}
    kw: dict[str, Any] = {"region_name": cfg.get("region")}
    if cfg.get("access_key_id"):
        kw.update(aws_access_key_id=cfg["access_key_id"], aws_secret_access_key=cfg["secret_access_key"])
    if endpoint:
        host = str(endpoint).split("://", 1)[-1]
        kw["endpoint_url"] = host
        opts.update(AWS_HTTPS="NO" if str(endpoint).startswith("http://") else "YES", AWS_VIRTUAL_HOSTING="FALSE")
    return rasterio.Env(session=AWSSession(**kw), **opts)


def build_refs(url: str, *, chunk: int | None = None, storage_options: S3Options | None = None) -> RefSet:
    """References to every tile of the tiled GeoTIFF at ``url`` (local path or ``s3://``), in place.

    Georeferencing, nodata and band wavelengths/FWHM come from GDAL (as the ingest reads them);
    the tile table from the TIFF header. Raises :class:`NotReferenceableError` naming what
    prevents referencing (striped, unsupported compression, irregular tiles ...).
    """
    from cubelake.ingest.calibrate import CFEncoder
    from cubelake.ingest.sources.gdal import open_gdal
    from cubelake.ingest.zarr_writer import CubeSpec

    layout = tiff_layout(url, storage_options)
    target = stat_target(url, storage_options)
    scheme, where = split_url(url)
    gdal_path = where if scheme == "file" else f"/vsis3/{where}"
    env = _gdal_env(storage_options) if scheme == "s3" else contextlib.nullcontext()
    with env:
        src = open_gdal(gdal_path)
        try:
            meta = src.meta
        finally:
            src.close()
    spec = CubeSpec.from_bands(
        meta.bands,
        height=meta.height,
        width=meta.width,
        encoding=CFEncoder(meta.dtype, 1.0, 0.0, meta.nodata),
        transform=meta.transform,
        crs_wkt=meta.crs_wkt,
        attrs={"cubelake:source": target.url, **({"cubelake:datetime": meta.datetime} if meta.datetime else {})},
        data_attrs={},
    )
    return reference_tiff(layout, target, spec, chunk=chunk)
