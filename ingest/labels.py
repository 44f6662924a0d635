"""Label maps that come with a scene (per-pixel classes on the scene's grid).

A label map is found next to the scene (``labels/<name>``, ``<name>_labels``), inside a MATLAB
file, or given with ``--labels``. It must be on the scene's grid (same shape; same transform
and CRS when both are georeferenced). It is stored as ``labels (y, x)`` in the Zarr and as a
single-band COG beside the cube, chunk-aligned with it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

from cubelake.errors import CubelakeError
from cubelake.grid import Window
from cubelake.record import Labels

from .cog_writer import layer_sink
from .report import Code, Issue, error
from .sources import RasterSource
from .sources.matlab import find_label_map, is_mat_v73

__all__ = ["LabelPlan", "plan_labels", "read_label_file", "write_labels"]


@dataclass(frozen=True, slots=True)
class LabelPlan:
    array: np.ndarray  # (y, x)
    source: str

    @property
    def dtype(self) -> str:
        return self.array.dtype.name


def _narrow(a: np.ndarray) -> np.ndarray:
    """Integral labels in the smallest fitting integer type (float label rasters are common)."""
    if a.dtype.kind == "f":
        finite = np.isfinite(a)
        if not finite.all() or not np.array_equal(a, np.round(a)):
            return a.astype(np.float32)
        a = a.astype(np.int64)
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    for dt in ("uint8", "int16", "uint16", "int32"):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return a.astype(dt)
    return a


def read_label_file(path: Path) -> tuple[np.ndarray, tuple[float, ...] | None, str | None]:
    """``(labels (y, x), transform or None, crs WKT or None)`` from a raster or MATLAB file."""
    if path.suffix.lower() == ".mat":
        if is_mat_v73(path):
            import h5py

            with h5py.File(path, "r") as h:
                small = {k: np.asarray(v).T for k, v in h.items() if isinstance(v, h5py.Dataset) and v.ndim == 2}
        else:
            import scipy.io

            try:
                small = scipy.io.loadmat(str(path))
            except Exception as exc:  # scipy raises bare errors on damaged files
                raise CubelakeError(f"{path}: not a readable MATLAB file: {exc}") from exc
        shapes = {np.asarray(v).shape for k, v in small.items() if not k.startswith("__") and np.asarray(v).ndim == 2}
        for shape in sorted(shapes, key=lambda s: -s[0] * s[1]):
            arr, _ = find_label_map(small, "", shape, None, path)
            if arr is not None:
                return arr, None, None
        raise CubelakeError(f"{path}: no 2-D integer label map in this MATLAB file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            with rasterio.open(path) as ds:
                t = ds.transform
                transform = None if t.is_identity else (t.a, t.b, t.c, t.d, t.e, t.f)
                return ds.read(1), transform, ds.crs.to_wkt() if ds.crs else None
    except RasterioIOError as exc:
        raise CubelakeError(f"{path}: cannot read the label raster: {exc}") from exc


def plan_labels(source: RasterSource, label_path: Path | None) -> tuple[LabelPlan | None, list[Issue]]:
    meta = source.meta
    if label_path is None:
        arr = getattr(source, "labels", None)
        if arr is None:
            return None, []
        return LabelPlan(_narrow(np.asarray(arr)), f"{meta.path}:{meta.tags.get('variable', '')} (labels)"), []
    try:
        arr, transform, crs = read_label_file(label_path)
    except CubelakeError as exc:
        return None, [error(Code.LABELS_MISMATCH, str(exc))]
    if arr.shape != (meta.height, meta.width):
        return None, [error(Code.LABELS_MISMATCH,
                            f"{label_path}: labels are {arr.shape[0]}x{arr.shape[1]} but the scene is "
                            f"{meta.height}x{meta.width}; a label map must be on the scene's grid")]
    if transform is not None and meta.transform is not None:
        if not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6) for a, b in zip(transform, meta.transform, strict=True)):
            return None, [error(Code.LABELS_MISMATCH,
                                f"{label_path}: label geotransform {transform} differs from the scene's {meta.transform}; "
                                "resample the labels onto the scene grid (gdalwarp -tr/-te, nearest)")]
        if crs is not None and meta.crs_wkt is not None:
            from rasterio.crs import CRS

            if CRS.from_wkt(crs) != CRS.from_wkt(meta.crs_wkt):
                return None, [error(Code.LABELS_MISMATCH, f"{label_path}: label CRS differs from the scene's")]
    return LabelPlan(_narrow(arr), str(label_path)), []


def write_labels(plan: LabelPlan, staged: Path, scene_id: str, chunk: int, zarr_path: Path | None,
                 transform: tuple[float, float, float, float, float, float] | None, crs_wkt: str | None,
                 cog: bool) -> Labels:
    """Write the label map into the Zarr (``labels``) and as ``<id>.labels.tif``; returns its record."""
    arr = plan.array
    info: dict[str, Any] = {"source": plan.source, "dtype": plan.dtype,
                            "classes": [int(v) for v in np.unique(arr)[:256]] if arr.dtype.kind in "iu" else None}
    if zarr_path is not None:
        import zarr

        zarr.open_array(str(zarr_path), path="labels", mode="r+")[:, :] = arr
        info["zarr_array"] = "labels"
    if cog:
        target = staged / f"{scene_id}.labels.tif"
        sink = layer_sink(target, shape=(1, *arr.shape), dtype=plan.dtype, fill=None, transform=transform,
                          crs_wkt=crs_wkt, band_names=["labels"], tags={"CUBELAKE_LABELS_SOURCE": plan.source},
                          chunk=chunk)
        sink.write(Window(0, 0, arr.shape[0], arr.shape[1]), arr[None])
        sink.finish()
        info["cog"] = target.name
    return Labels.model_validate(info)
