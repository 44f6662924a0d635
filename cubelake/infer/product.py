"""One prediction's files, streamed chunk by chunk: a Zarr v3 store and COGs on the scene's grid.

:class:`PredictionWriter` takes the finished blocks of a prediction (each exactly one chunk of the
scene's grid, edge chunks clipped, row-major) and writes, without ever holding more than the
block in hand and the COG tiles waiting for their turn in the file:

* ``<name>.zarr`` — a Zarr v3 group xarray opens: ``classes (y, x)`` (uint8 for up to 255 classes,
  else uint16; nodata 255 / 65535 as the CF ``_FillValue``) and ``probabilities (class, y, x)``
  (float32 or float16, NaN nodata), cell-centre ``x``/``y`` coordinates and the CF grid mapping
  ``spatial_ref`` (``crs_wkt``, ``GeoTransform``) as the scene Zarr products carry them; chunks are
  the scene's, metadata consolidated;
* ``<name>_classes.tif`` and ``<name>_probabilities.tif`` — COGs written by the ingest's one-pass
  COG writer (tiles = chunks, the scene's CRS and transform), checked with rio-cogeo's validator.

Metadata goes first (xarray writes it, as for scenes and datacubes), pixels follow one chunk at a
time with zarr-python. Pixels per class are counted as blocks arrive, for the item (:mod:`.item`).
"""

from __future__ import annotations

import logging
import math
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.cube import grid_coords
from cubelake.grid import ChunkGrid, ChunkIndex, Window
from cubelake.lake import safe_scene_id

from .errors import InferError

__all__ = ["OUTPUTS", "Asset", "PredictionGrid", "PredictionWriter", "class_encoding"]

log = logging.getLogger(__name__)

OUTPUTS = ("classes", "probabilities")
PROB_DTYPES = ("float32", "float16")
ZARR_MEDIA_TYPE = "application/vnd+zarr; version=3"
COG_MEDIA_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
_PROB_CHUNK_BYTES = 64 * 1024 * 1024  # a probabilities chunk holds at most this many bytes (many classes)


def class_encoding(classes: int) -> tuple[str, int]:
    """The stored type of a class map of ``classes`` classes and its nodata value: uint8/255 or uint16/65535."""
    return ("uint8", 255) if classes <= 255 else ("uint16", 65535)


@dataclass(frozen=True, slots=True)
class PredictionGrid:
    """The scene's grid the prediction is on: size, square chunk (pixels), CRS (WKT, may be ``None``) and
    GDAL affine transform ``(a, b, c, d, e, f)`` (``None``: pixel coordinates)."""

    height: int
    width: int
    chunk: int
    crs_wkt: str | None
    transform: tuple[float, float, float, float, float, float] | None

    @property
    def chunks(self) -> ChunkGrid:
        return ChunkGrid.square(self.height, self.width, self.chunk)

    def bounds(self) -> tuple[float, float, float, float] | None:
        """``(minx, miny, maxx, maxy)`` of the grid in its CRS (``None`` without a transform)."""
        if self.transform is None:
            return None
        a, b, c, d, e, f = self.transform
        xs = [c + a * col + b * row for col, row in ((0, 0), (self.width, 0), (0, self.height),
                                                     (self.width, self.height))]
        ys = [f + d * col + e * row for col, row in ((0, 0), (self.width, 0), (0, self.height),
                                                     (self.width, self.height))]
        return min(xs), min(ys), max(xs), max(ys)

    def resolution_m(self) -> float | None:
        """The pixel size in metres of a north-up grid of square pixels in a projected CRS in metres, else ``None``."""
        if self.transform is None or self.crs_wkt is None:
            return None
        a, b, _, d, e, _ = self.transform
        if b != 0 or d != 0 or abs(a) != abs(e):
            return None
        from rasterio.crs import CRS

        crs = CRS.from_wkt(self.crs_wkt)
        return abs(a) if crs.is_projected and crs.linear_units in ("metre", "meter") else None

    def proj_fields(self) -> dict[str, Any]:
        """The STAC projection extension's fields of the grid (``proj:code`` or ``proj:wkt2``, shape, transform,
        bbox)."""
        out: dict[str, Any] = {}
        if self.crs_wkt is not None:
            from rasterio.crs import CRS

            epsg = CRS.from_wkt(self.crs_wkt).to_epsg()
            out["proj:code"] = f"EPSG:{epsg}" if epsg else None
            if not epsg:
                out["proj:wkt2"] = self.crs_wkt
        out["proj:shape"] = [self.height, self.width]
        bounds = self.bounds()
        if self.transform is not None and bounds is not None:
            out["proj:transform"] = [float(v) for v in self.transform]
            out["proj:bbox"] = [float(v) for v in bounds]
        return out


@dataclass(frozen=True, slots=True)
class Asset:
    """One file (or Zarr folder) of a prediction, described as the catalog describes a scene's products.

    ``href`` is relative to the folder the writer wrote into (``./<file>``); ``size`` in bytes (a
    folder: all its files); ``checksum`` the BLAKE3 multihash (``file:checksum`` of a file, the
    catalog's ``cubelake:tree_checksum`` of a folder); ``fields``: more STAC asset fields.
    """

    key: str
    href: str
    media_type: str
    roles: tuple[str, ...]
    size: int
    checksum: str
    title: str
    is_folder: bool = False
    fields: dict[str, Any] = field(default_factory=dict)

    def to_stac(self, version: str | None = None) -> dict[str, Any]:
        """The STAC asset object; ``version``: its href made ``./v/<version>/...`` (inside a published version)."""
        href = f"./v/{version}/{self.href.removeprefix('./')}" if version else self.href
        out: dict[str, Any] = {"href": href, "type": self.media_type, "roles": list(self.roles), "title": self.title,
                               "file:size": self.size}
        out["cubelake:tree_checksum" if self.is_folder else "file:checksum"] = self.checksum
        out.update(self.fields)
        return out


def _check_args(name: str, grid: PredictionGrid, classes: int, outputs: Sequence[str], prob_dtype: str,
                class_names: Sequence[str] | None, cog: bool) -> None:
    if not isinstance(name, str) or not name or safe_scene_id(name) != name:
        raise InferError(f"prediction name {name!r}: use letters, digits, '.', '_' and '-' only")
    for what, v in (("height", grid.height), ("width", grid.width), ("chunk", grid.chunk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InferError(f"prediction {name}: {what}={v!r}, expected a whole number of pixels >= 1")
    if cog and grid.chunk % 16:
        raise InferError(f"prediction {name}: chunk={grid.chunk} px is not a multiple of 16, which COG tiles must "
                         "be; predict a scene ingested with such a chunk (e.g. --chunk 256)")
    if isinstance(classes, bool) or not isinstance(classes, int) or not 1 <= classes <= 65534:
        raise InferError(f"prediction {name}: classes={classes!r}, expected 1..65534 (65535 is the nodata value)")
    if not outputs or len(set(outputs)) != len(outputs) or set(outputs) - set(OUTPUTS):
        raise InferError(f"prediction {name}: outputs={tuple(outputs)!r}, expected one or both of {OUTPUTS}")
    if prob_dtype not in PROB_DTYPES:
        raise InferError(f"prediction {name}: prob_dtype={prob_dtype!r}, expected one of {PROB_DTYPES}")
    if class_names is not None and (len(class_names) != classes or not all(
            isinstance(n, str) and n.strip() for n in class_names)):
        raise InferError(f"prediction {name}: class_names must be {classes} non-empty strings, one per class "
                         f"(got {len(class_names)})")


def _affine(transform: Sequence[float] | None, name: str) -> tuple[float, float, float, float, float, float] | None:
    """A GDAL affine ``(a, b, c, d, e, f)`` from six numbers (or an ``affine.Affine``, whose nine end 0, 0, 1)."""
    if transform is None:
        return None
    values = [float(v) for v in transform]
    if len(values) == 9 and values[6:] == [0.0, 0.0, 1.0]:
        values = values[:6]
    if len(values) != 6 or not all(math.isfinite(v) for v in values):
        raise InferError(f"prediction {name}: transform {tuple(transform)!r} is not a GDAL affine (a, b, c, d, e, f)")
    a, b, c, d, e, f = values
    return a, b, c, d, e, f


def _codec() -> Any:
    # the blosc settings ingest's ZarrCodecSpec picked on the real cubes (BENCHMARKS.md): zstd 3, byte shuffle, 1 MiB
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="zstd", clevel=3, shuffle="shuffle", blocksize=1024 * 1024)


def _coords(grid: PredictionGrid, classes: int, with_class: bool) -> dict[str, Any]:
    """``x``/``y`` cell centres, the ``class`` axis and the CF grid mapping, as the scene Zarr products write them."""
    coords: dict[str, Any] = {}
    xy = grid_coords(grid.transform, grid.height, grid.width)
    if xy is not None:  # a rotated grid has no 1-D coordinates; its GeoTransform still says where it is
        georef = grid.transform is not None
        xattrs = {"standard_name": "projection_x_coordinate", "axis": "X"} if georef else \
            {"long_name": "pixel column centre", "units": "pixel"}
        yattrs = {"standard_name": "projection_y_coordinate", "axis": "Y"} if georef else \
            {"long_name": "pixel row centre", "units": "pixel"}
        coords["x"] = ("x", xy["x"], xattrs)
        coords["y"] = ("y", xy["y"], yattrs)
    if with_class:
        coords["class"] = ("class", np.arange(classes, dtype=np.int32),
                           {"long_name": "class index (the value classes holds)"})
    if grid.crs_wkt is not None or grid.transform is not None:
        gm: dict[str, Any] = {}
        if grid.crs_wkt is not None:
            gm["crs_wkt"] = gm["spatial_ref"] = grid.crs_wkt
        if grid.transform is not None:
            a, b, c, d, e, f = grid.transform
            gm["GeoTransform"] = " ".join(repr(float(v)) for v in (c, a, b, f, d, e))
        coords["spatial_ref"] = ((), np.int32(0), gm)
    return coords


def create_prediction_zarr(path: Path, grid: PredictionGrid, classes: int, outputs: Sequence[str], prob_dtype: str,
                           class_names: Sequence[str], attrs: dict[str, Any]) -> None:
    """Write the store's metadata and coordinates (xarray); pixels come later, one chunk at a time."""
    import dask.array as da
    import xarray as xr

    ny, nx, c = grid.height, grid.width, grid.chunk
    coords = _coords(grid, classes, "probabilities" in outputs)
    mapping = {"grid_mapping": "spatial_ref"} if "spatial_ref" in coords else {}
    variables: dict[str, Any] = {}
    enc: dict[str, Any] = {}
    if "classes" in outputs:
        dtype, nodata = class_encoding(classes)
        # a one-chunk dask placeholder: compute=False writes metadata only, its graph one task
        variables["classes"] = (("y", "x"), da.zeros((ny, nx), dtype=dtype, chunks=(ny, nx)), {
            "long_name": "predicted class (argmax of the probabilities)", "flag_values": list(range(classes)),
            "flag_meanings": " ".join("_".join(n.split()) for n in class_names), **mapping})
        enc["classes"] = {"dtype": dtype, "chunks": (c, c), "_FillValue": nodata, "fill_value": nodata,
                          "compressors": [_codec()]}
    if "probabilities" in outputs:
        item = np.dtype(prob_dtype).itemsize
        kc = max(1, min(classes, _PROB_CHUNK_BYTES // (c * c * item)))
        variables["probabilities"] = (("class", "y", "x"), da.zeros((classes, ny, nx), dtype=prob_dtype,
                                                                    chunks=(classes, ny, nx)), {
            "long_name": "class probability", "units": "1", "class_names": list(class_names), **mapping})
        enc["probabilities"] = {"dtype": prob_dtype, "chunks": (kc, c, c), "_FillValue": math.nan,
                                "fill_value": math.nan, "compressors": [_codec()]}
    ds = xr.Dataset(variables, coords=coords, attrs=attrs)
    ds.to_zarr(str(path), mode="w-", zarr_format=3, compute=False, encoding=enc, consolidated=False)


def _cog_sink(target: Path, grid: PredictionGrid, bands: Sequence[str], dtype: str, fill: float,
              tags: dict[str, str]) -> Any:
    """The ingest's one-pass COG writer for one product (imported here: only a prediction needs the ingest)."""
    from cubelake.ingest.cog_writer import layer_sink

    return layer_sink(target, shape=(len(bands), grid.height, grid.width), dtype=dtype, fill=fill,
                      transform=grid.transform, crs_wkt=grid.crs_wkt, band_names=bands, tags=tags, chunk=grid.chunk)


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class PredictionWriter:
    """Writes one prediction (:meth:`write` each chunk once, row-major; :meth:`finish`; :meth:`abort` on failure).

    ``folder``: where the files go (a staging folder); ``name``: the product's name (file names and
    attributes). ``height``/``width``/``chunk``: the scene's grid (pixels, square chunks, a multiple
    of 16); ``crs_wkt``/``transform``: its CRS and GDAL affine transform. ``classes``: number of
    classes; ``outputs``: ``classes`` and/or ``probabilities``; ``prob_dtype``: stored probabilities
    in the Zarr (the COG holds float32: GDAL 3.10, rasterio's, has no Float16 type to write it with);
    ``class_names``: one per class (default ``class_<i>``). ``cog``: write the COGs too (their tiles are
    the chunks, so the chunk must be a multiple of 16; a scene of other chunks gets the Zarr alone).
    """

    def __init__(self, folder: Path, name: str, *, height: int, width: int, chunk: int, crs_wkt: str | None,
                 transform: Sequence[float] | None, classes: int, outputs: Sequence[str] = OUTPUTS,
                 prob_dtype: str = "float32", class_names: Sequence[str] | None = None, cog: bool = True) -> None:
        self.grid = PredictionGrid(height, width, chunk, crs_wkt, _affine(transform, name))
        _check_args(name, self.grid, classes, tuple(outputs), prob_dtype, class_names, cog)
        self.folder, self.name, self.classes = Path(folder), name, classes
        self.outputs = tuple(o for o in OUTPUTS if o in outputs)
        self.prob_dtype = prob_dtype
        self.class_names = tuple(class_names) if class_names is not None else tuple(f"class_{i}" for i in range(classes))
        self.class_dtype, self.nodata = class_encoding(classes)
        self.class_counts = np.zeros(classes, dtype=np.int64)
        self.nodata_pixels = 0
        self._chunks = self.grid.chunks
        self._next = 0
        self._state = "open"
        self.zarr_path = self.folder / f"{name}.zarr"
        self.cog_paths = {o: self.folder / f"{name}_{o}.tif" for o in self.outputs} if cog else {}
        self._sinks: dict[str, Any] = {}
        self._arrays: dict[str, Any] = {}
        try:
            self._open()
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if kind is not None:
            self.abort()

    def _attrs(self) -> dict[str, Any]:
        return {"cubelake:prediction": self.name, "cubelake:classes": self.classes,
                "cubelake:class_names": list(self.class_names)}

    def _open(self) -> None:
        import zarr

        self.folder.mkdir(parents=True, exist_ok=True)
        create_prediction_zarr(self.zarr_path, self.grid, self.classes, self.outputs, self.prob_dtype,
                               self.class_names, self._attrs())
        for o in self.outputs:
            self._arrays[o] = zarr.open_array(str(self.zarr_path), path=o, mode="r+")
        tags = {"CUBELAKE_PREDICTION": self.name, "CUBELAKE_CLASSES": str(self.classes)}
        if "classes" in self.cog_paths:
            self._sinks["classes"] = _cog_sink(self.cog_paths["classes"], self.grid, ["class"], self.class_dtype,
                                               float(self.nodata), tags)
        if "probabilities" in self.cog_paths:
            self._sinks["probabilities"] = _cog_sink(self.cog_paths["probabilities"], self.grid, self.class_names,
                                                     "float32", math.nan, tags)

    # -- blocks ---------------------------------------------------------------
    def _window(self, cy: int, cx: int) -> Window:
        g = self._chunks
        if self._state != "open":
            raise InferError(f"{self.zarr_path}: the writer is {self._state}; no more blocks can be written")
        expected = ChunkIndex(self._next // g.n_cols, self._next % g.n_cols) if self._next < g.n_chunks else None
        if expected is None or (cy, cx) != (expected.iy, expected.ix):
            raise InferError(f"{self.zarr_path}: block ({cy}, {cx}) arrived out of order; the {g.n_rows} x "
                             f"{g.n_cols} chunks must come row-major, each once (expected "
                             f"{'none: all were written' if expected is None else (expected.iy, expected.ix)})")
        return g.chunk_window(expected)

    def _checked_classes(self, block: np.ndarray, w: Window) -> np.ndarray:
        if not isinstance(block, np.ndarray) or block.shape != (w.height, w.width) or block.dtype.kind not in "iu":
            raise InferError(f"{self.zarr_path}: classes of chunk at row {w.row_off}, col {w.col_off}: expected an "
                             f"integer array of shape {(w.height, w.width)}, got "
                             f"{getattr(block, 'dtype', type(block))} {getattr(block, 'shape', '')}")
        valid = block != self.nodata
        values = block[valid]
        if values.size and (int(values.min()) < 0 or int(values.max()) >= self.classes):
            raise InferError(f"{self.zarr_path}: classes of chunk at row {w.row_off}, col {w.col_off} hold values "
                             f"outside 0..{self.classes - 1} that are not the nodata value {self.nodata}")
        self.class_counts += np.bincount(values.astype(np.int64), minlength=self.classes)
        self.nodata_pixels += int(valid.size - values.size)
        return block.astype(self.class_dtype, copy=False)

    def _checked_probs(self, block: np.ndarray, w: Window, count: bool) -> np.ndarray:
        shape = (self.classes, w.height, w.width)
        if not isinstance(block, np.ndarray) or block.shape != shape or block.dtype.kind != "f":
            raise InferError(f"{self.zarr_path}: probabilities of chunk at row {w.row_off}, col {w.col_off}: "
                             f"expected a float array of shape {shape}, got "
                             f"{getattr(block, 'dtype', type(block))} {getattr(block, 'shape', '')}")
        if count:  # no class map given: count the argmax where every class has a probability
            valid = np.isfinite(block).all(axis=0)
            best = np.argmax(np.where(np.isfinite(block), block, -np.inf), axis=0)[valid]
            self.class_counts += np.bincount(best, minlength=self.classes)
            self.nodata_pixels += int(valid.size - best.size)
        return block

    def write(self, cy: int, cx: int, classes: np.ndarray | None, probs: np.ndarray | None) -> None:
        """Write the chunk ``(cy, cx)``: ``classes`` ``(h, w)`` integers (nodata = :attr:`nodata`) and/or
        ``probs`` ``(class, h, w)`` floats (NaN nodata); ``(h, w)`` is the chunk's, clipped at the edges."""
        w = self._window(cy, cx)
        for o, given in (("classes", classes), ("probabilities", probs)):
            if o in self.outputs and given is None:
                raise InferError(f"{self.zarr_path}: chunk ({cy}, {cx}) has no {o}, which this prediction writes")
        cls = self._checked_classes(classes, w) if classes is not None else None
        prob = self._checked_probs(probs, w, count=cls is None) if probs is not None else None
        if cls is None and prob is None:
            raise InferError(f"{self.zarr_path}: chunk ({cy}, {cx}) has neither classes nor probabilities")
        rows, cols = w.slices()
        if "classes" in self.outputs and cls is not None:
            self._arrays["classes"][rows, cols] = cls
            if "classes" in self._sinks:
                self._sinks["classes"].write(w, cls[None])
        if "probabilities" in self.outputs and prob is not None:
            self._arrays["probabilities"][:, rows, cols] = prob.astype(self.prob_dtype, copy=False)
            if "probabilities" in self._sinks:
                self._sinks["probabilities"].write(w, prob.astype(np.float32, copy=False))
        self._next += 1

    # -- completion -------------------------------------------------------------
    def finish(self) -> list[Asset]:
        """Complete and check every file; their assets (Zarr first, then the COGs)."""
        import zarr

        from cubelake.hashing import file_blake3, tree_blake3

        if self._state != "open":
            raise InferError(f"{self.zarr_path}: the writer is {self._state}; finish() is called once")
        if self._next != self._chunks.n_chunks:
            raise InferError(f"{self.zarr_path}: {self._next} of {self._chunks.n_chunks} chunks were written; "
                             "every chunk of the grid must be written before finish()")
        reports = {o: sink.finish() for o, sink in self._sinks.items()}  # rio-cogeo's cog_validate, each
        group = zarr.open_group(str(self.zarr_path), mode="r+")
        group.attrs.update({"cubelake:class_counts": [int(v) for v in self.class_counts],
                            "cubelake:nodata_pixels": self.nodata_pixels})
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            zarr.consolidate_metadata(str(self.zarr_path))
        self._state = "finished"
        proj = self.grid.proj_fields()
        assets = [Asset("zarr", f"./{self.zarr_path.name}", ZARR_MEDIA_TYPE, ("data", "zarr"),
                        _dir_size(self.zarr_path), "1e20" + tree_blake3(self.zarr_path),
                        f"prediction {self.name}: {' and '.join(self._zarr_arrays())}", is_folder=True,
                        fields={"cubelake:arrays": list(self.outputs), "cubelake:chunk_shape": [self.grid.chunk] * 2,
                                **proj})]
        for o, path in self.cog_paths.items():
            assets.append(Asset(o, f"./{path.name}", COG_MEDIA_TYPE, ("data", "cloud-optimized"),
                                path.stat().st_size, "1e20" + file_blake3(path), self._cog_title(o),
                                fields={**self._cog_fields(o), **proj}))
            if reports[o]["warnings"]:
                log.info("%s: rio-cogeo warnings: %s", path, reports[o]["warnings"])
        return assets

    def _zarr_arrays(self) -> list[str]:
        return [{"classes": "classes (y, x)", "probabilities": "probabilities (class, y, x)"}[o] for o in self.outputs]

    def _cog_title(self, output: str) -> str:
        if output == "classes":
            return f"prediction {self.name}: class map ({self.class_dtype}, nodata {self.nodata})"
        return f"prediction {self.name}: class probabilities, one band per class (float32, NaN nodata)"

    def _cog_fields(self, output: str) -> dict[str, Any]:
        res = self.grid.resolution_m()
        raster = {"raster:spatial_resolution": res} if res is not None else {}
        if output == "classes":
            return {"data_type": self.class_dtype, "nodata": self.nodata, "bands": [{"name": "class"}], **raster}
        return {"data_type": "float32", "nodata": "nan", "unit": "1",
                "bands": [{"name": n} for n in self.class_names], **raster}

    def abort(self) -> None:
        """Stop writing and remove what was written (safe to call more than once, and after a failed start)."""
        if self._state == "aborted":
            return
        self._state = "aborted"
        for sink in self._sinks.values():
            try:
                sink.abort()
            except Exception as exc:  # removing the files below is what matters; say why a thread did not end well
                log.warning("%s: stopping a COG writer: %s", self.folder, exc)
        shutil.rmtree(self.zarr_path, ignore_errors=True)
        for path in self.cog_paths.values():
            path.unlink(missing_ok=True)
