"""Make and open reference sets: the Python entry points behind ``cubelake refs`` and the ingest.

``build_refs`` references any tiled GeoTIFF, local or on S3, where it is; ``open_dataset`` opens
a reference set (JSON or Parquet, one scene or a stacked cube) as the same xarray dataset as the
native Zarr product, after checking every entry, every target against the roots the caller
trusts, and each target's recorded size and content fingerprint/ETag.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from cubelake.cube import CFEncoder, CubeSpec
from cubelake.errors import CubelakeError, NotReferenceableError, RefsError
from cubelake.storage import S3Options, gdal_vsi_path, is_transient, object_at, translate

from .build import reference_tiff
from .fingerprint import file_fingerprint
from .formats import LoadedRefs, load_refs
from .layout import TiffLayout, read_layout
from .model import RefSet, Target
from .security import AllowedRoots, split_url
from .store import RefsStore

if TYPE_CHECKING:
    from cubelake.lake import Lake

__all__ = ["build_refs", "open_array", "open_dataset", "open_store", "stat_target", "tiff_layout", "trusted_roots"]


LakeLike = Union["Lake", str, Path]


def trusted_roots(refs: LoadedRefs, lake: LakeLike | None = None, allowed_roots: Sequence[str] = ()) -> AllowedRoots:
    """The roots the caller trusts for ``refs``: its own folder, ``lake``'s roots, and ``allowed_roots``.

    Nothing found next to the reference set counts: a ``lake.json`` that arrives with it is as
    untrusted as the set itself, so a lake's roots count only when the caller names the lake.
    """
    from cubelake.lake import open_lake

    roots = [refs.base]
    if lake is not None:
        roots += open_lake(lake, create=False).reference_roots()
    return AllowedRoots([*roots, *allowed_roots])


def open_store(path: str | Path, *, lake: LakeLike | None = None, allowed_roots: Sequence[str] = (),
               storage_options: S3Options | None = None, verify: bool = True) -> RefsStore:
    """A read-only zarr store over the references at ``path``, every entry checked.

    Targets (relative ones resolved against ``path``'s folder) must lie under ``path``'s folder,
    under the lake ``lake`` (a :class:`~cubelake.lake.Lake` or its folder) or one of its allowed
    roots, or under one of ``allowed_roots``. ``verify``: compare each target with what was recorded now.
    """
    refs = load_refs(path, storage_options)
    return RefsStore(refs, roots=trusted_roots(refs, lake, allowed_roots), storage_options=storage_options,
                     verify=verify)


def _zarr_error(path: str | Path, exc: Exception) -> RefsError:
    return RefsError(f"{path}: zarr cannot open these references ({type(exc).__name__}: {exc}); "
                     "re-create them with cubelake")


def open_array(path: str | Path, name: str = "data", **kw: Any) -> Any:
    """The ``name`` array (default ``data``) of a reference set, as a read-only ``zarr.Array``.

    ``kw``: ``lake``, ``allowed_roots``, ``storage_options``, ``verify`` as for :func:`open_store`.
    """
    import zarr

    import cubelake.refs  # noqa: F401  (registers the codecs)

    store = open_store(path, **kw)
    try:
        return zarr.open_array(store, path=name, mode="r", zarr_format=2)
    except (ValueError, TypeError, KeyError, FileNotFoundError) as exc:  # e.g. no such array
        raise _zarr_error(path, exc) from None


def open_dataset(path: str | Path, *, chunks: Any = None, lake: LakeLike | None = None,
                 allowed_roots: Sequence[str] = (), storage_options: S3Options | None = None,
                 **xr_kwargs: Any) -> Any:
    """The reference set at ``path`` as an xarray Dataset (``data (band, y, x)`` or ``(time, band, y, x)``).

    ``lake``: the lake the set belongs to, when its targets lie in the lake's allowed roots (see :func:`open_store`).
    """
    import xarray as xr

    store = open_store(path, lake=lake, allowed_roots=allowed_roots, storage_options=storage_options)
    try:
        return xr.open_dataset(store, engine="zarr"  # type: ignore[arg-type]
                               , consolidated=True, zarr_format=2, chunks=chunks, **xr_kwargs)
    except (ValueError, TypeError, KeyError) as exc:  # metadata xarray cannot decode (dimensions, attributes)
        raise _zarr_error(path, exc) from None


@contextlib.contextmanager
def _open_binary(url: str, storage_options: S3Options | None) -> Iterator[Any]:
    scheme, where = split_url(url)
    if scheme == "file":
        if os.path.exists(where) and not os.path.isfile(where):  # a FIFO would block the open forever
            raise RefsError(f"{url}: not a regular file (a folder, FIFO or device); give a GeoTIFF file")
        with open(where, "rb") as f:
            yield f
        return
    if scheme != "s3":
        raise RefsError(f"{url}: only local paths and s3:// URLs can be referenced")
    store, key = object_at(url, storage_options)
    with store.open_reader(key) as reader:
        yield reader


def stat_target(url: str, storage_options: S3Options | None = None) -> Target:
    """The target as it is now: size, mtime and content fingerprint (local) or ETag (S3)."""
    scheme, where = split_url(url)
    if scheme == "file":
        st = os.stat(where)
        return Target(str(Path(where).resolve()), st.st_size, mtime_ns=st.st_mtime_ns,
                      fingerprint=file_fingerprint(where))
    store, key = object_at(url, storage_options)
    head = store.head(key)
    return Target(url, head.size, etag=head.etag)


def tiff_layout(url: str, storage_options: S3Options | None = None) -> TiffLayout:
    """The tile layout of the TIFF at ``url`` (header reads only)."""
    try:
        with _open_binary(url, storage_options) as fh:
            return read_layout(fh)
    except FileNotFoundError as exc:
        raise RefsError(f"{url}: no such file") from exc
    except CubelakeError:
        raise
    except Exception as exc:  # a damaged header can make tifffile raise almost anything
        if is_transient(exc):  # the store failed reading it (a timeout, a cut body): not the TIFF's fault
            raise translate(exc, url, "read") from None
        raise NotReferenceableError(f"{url}: not a readable TIFF ({type(exc).__name__}: {exc})") from exc


def build_refs(url: str, *, chunk: int | None = None, storage_options: S3Options | None = None) -> RefSet:
    """References to every tile of the tiled GeoTIFF at ``url`` (local path or ``s3://``), in place.

    Georeferencing, nodata and band wavelengths/FWHM come from GDAL (as the ingest reads them);
    the tile table from the TIFF header. Raises :class:`NotReferenceableError` naming what
    prevents referencing (striped, unsupported compression, irregular tiles ...).
    """
    # the source's metadata as the ingest reads it (the one use of the ingest in this package:
    # building references from a source file; reading and opening references never imports it)
    from cubelake.ingest.sources.gdal import open_gdal

    layout = tiff_layout(url, storage_options)
    target = stat_target(url, storage_options)
    scheme, where = split_url(url)
    if scheme not in ("file", "s3"):
        raise NotReferenceableError(f"{url}: GDAL reads sources here from local files and s3:// objects only; copy "
                                    "the file to one of those")
    gdal_path = where if scheme == "file" else gdal_vsi_path(url)
    env = S3Options.coerce(storage_options).gdal_env() if scheme == "s3" else contextlib.nullcontext()
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
