"""Open a lake product as the analysis-ready xarray Dataset users expect.

Plain ``xr.open_zarr`` reads a scene's Zarr fine, with two surprises for spectral work: zarr
stores attributes as JSON, so a CF ``scale_factor`` is always a float64 and xarray decodes
int16 reflectance to float64 (twice the memory of the float32 it was before encoding), and
non-dimension coordinates such as ``wavelength`` come back as dask arrays, which cannot index
(``ds.band[ds.wavelength > 800]`` fails). :func:`open_dataset` opens a scene's Zarr or its
references and returns calibrated values as float32 and ``wavelength``/``fwhm`` loaded, with
an index on ``wavelength`` so ``ds.sel(wavelength=slice(800, 900))`` selects bands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CubelakeError

if TYPE_CHECKING:  # the record (pydantic, numpy) is imported when a scene folder is opened, not by 'import cubelake'
    from .record import ProductInfo

__all__ = ["AUX_PREFIX", "aux_array_name", "aux_cog_name", "open_dataset", "scene_product"]

_SPECTRAL_COORDS = ("wavelength", "fwhm")
#: Aux layers (rasters warped onto the scene grid) are ``aux_<name>`` arrays next to ``data`` in the Zarr.
AUX_PREFIX = "aux_"


def aux_array_name(name: str) -> str:
    """The Zarr array (a data variable in xarray) of the aux layer ``name``."""
    return f"{AUX_PREFIX}{name}"


def aux_cog_name(scene_id: str, name: str) -> str:
    """The file name, in the scene folder, of the aux layer ``name``'s COG."""
    return f"{scene_id}.{AUX_PREFIX}{name}.tif"


def scene_product(folder: Path, products: Mapping[str, ProductInfo], prefer: Sequence[str]) -> tuple[str, Path] | None:
    """``(kind, path)`` of the first of ``prefer`` a scene record's ``products`` has, or ``None``."""
    for kind in prefer:
        info = products.get(kind)
        if info is not None:
            return kind, folder / info.path
    return None


def _product_path(path: Path, prefer: Sequence[str]) -> tuple[str, Path]:
    """``(kind, path)`` of the product to open: a scene folder picks its first product in ``prefer``."""
    name = path.name.lower()
    if name.endswith(".zarr"):
        return "zarr", path
    if name.endswith((".json", ".parq", ".parquet")):
        return "refs", path
    from .record import SCENE_RECORD_FILE, read_scene_record

    try:
        products = read_scene_record(path / SCENE_RECORD_FILE).products
    except FileNotFoundError:
        raise CubelakeError(f"{path}: not a lake scene folder (no scene.json), a .zarr store or a reference set") from None
    found = scene_product(path, products, [k for k in prefer if k in ("zarr", "refs")])
    if found is not None:
        return found
    raise CubelakeError(f"{path}: the scene has no {' or '.join(prefer)} product (it has {sorted(products)}); "
                        "re-ingest it with --products zarr or refs, or open its COG with rioxarray")


def open_dataset(product: str | Path, *, prefer: Sequence[str] = ("zarr", "refs"), chunks: Any = "auto",
                 dtype: str = "float32", lake: Any = None, **refs_kwargs: Any) -> Any:
    """A scene's cube ``data (band, y, x)`` as an xarray Dataset, decoded to ``dtype``.

    ``product``: a lake scene folder, a ``.zarr`` store, or a reference set (JSON/Parquet).
    ``chunks``: dask chunks as in ``xr.open_dataset`` (``None`` for no dask). ``dtype``: the
    floating type calibrated values are decoded to (nodata becomes NaN). ``lake`` and
    ``refs_kwargs`` (``allowed_roots``, ``storage_options``) are passed to
    :func:`cubelake.refs.open_dataset` for reference sets, which checks every target.
    """
    import xarray as xr

    kind, path = _product_path(Path(product), prefer)
    if kind == "zarr":
        ds = xr.open_dataset(path, engine="zarr", chunks=chunks)
    else:
        from cubelake.refs import open_dataset as open_refs

        kwargs = dict(refs_kwargs, **({"lake": lake} if lake is not None else {}))
        ds = open_refs(path, chunks=chunks, **kwargs)
    return _analysis_ready(ds, dtype)


def _analysis_ready(ds: Any, dtype: str) -> Any:
    """Spectral coordinates loaded and indexed; floating data variables in ``dtype`` (lazy when dask)."""
    spectral = {name: ds[name].load() for name in _SPECTRAL_COORDS if name in ds.coords}
    if spectral:
        ds = ds.assign_coords(spectral)
    if "wavelength" in ds.coords and ds["wavelength"].dims == ("band",) and "wavelength" not in ds.indexes:
        ds = ds.set_xindex("wavelength")
    for name, var in ds.data_vars.items():
        if var.dtype.kind == "f" and var.dtype != dtype:
            ds[name] = var.astype(dtype, keep_attrs=True)
    return ds
