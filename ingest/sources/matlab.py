"""MATLAB ``.mat`` cubes: v5 (scipy) and v7.3 (HDF5, h5py), e.g. the classic HSI benchmarks.

These files carry no georeferencing: the product gets a pixel grid and a warning. The cube
variable is found (largest 3-D numeric array, or a 2-D ``bands × pixels`` array with
``nRow``/``nCol``) or named by the user; the axis order is MATLAB's ``(y, x, band)`` unless
given. A 2-D integer array on the cube's grid is attached as the label map.

v5 files are not block-addressable, so scipy loads the chosen variable whole; the size limit
is checked from the variable table (``whosmat``) before anything is loaded. v7.3 cubes are
read window by window through h5py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cubelake.errors import NoCubeError, SceneReadError
from cubelake.grid import Window

from ..report import Code, Issue, warning
from ._base import BandInfo, LockedSource, SceneMetadata

__all__ = ["MatSource", "find_label_map", "is_mat_v73", "open_mat"]

log = logging.getLogger(__name__)

Axes = Literal["yxb", "xyb", "byx", "bxy", "ybx", "bp", "pb"]  # ybx: band-interleaved by line (NetCDF/HDF5)
_SIZE_NAMES = (("nrow", "ncol"), ("nrows", "ncols"), ("rows", "cols"), ("height", "width"), ("h", "w"), ("m", "n"))
_LABEL_HINTS = ("gt", "map", "label", "labels", "lab", "clas", "class", "truth", "y")


def is_mat_v73(path: Path) -> bool:
    """MATLAB v7.3 files are HDF5 with a 512-byte user block."""
    import h5py

    return bool(h5py.is_hdf5(str(path)))


@dataclass(frozen=True, slots=True)
class _Var:
    name: str
    shape: tuple[int, ...]  # MATLAB order (as scipy returns it)
    dtype: str  # numpy dtype for v7.3; MATLAB class name (unreliable) for v5


def _list_v5(path: Path) -> list[_Var]:
    import scipy.io

    try:
        table = scipy.io.whosmat(str(path))
    except Exception as exc:  # scipy raises bare ValueError/TypeError/OSError on damaged files
        raise SceneReadError(f"{path}: not a readable MATLAB v5 file: {exc}") from exc
    # whosmat's class is unreliable (arrays saved by scipy report 'double'): the real dtype is read on load
    return [_Var(n, tuple(s), c) for n, s, c in table]


def _list_v73(h: Any) -> list[_Var]:
    import h5py

    out = []
    for name, obj in h.items():
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "uif":
            out.append(_Var(name, tuple(reversed(obj.shape)), obj.dtype.name))
    return out


def _open_v73(path: Path) -> tuple[Any, list[_Var]]:
    """The open HDF5 file of a v7.3 MAT file and its numeric variables; a damaged file is a SceneReadError."""
    import h5py

    h5 = None
    try:
        h5 = h5py.File(path, "r")
        return h5, _list_v73(h5)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:  # truncated or damaged HDF5
        if h5 is not None:
            h5.close()
        raise SceneReadError(f"{path}: not a readable MATLAB v7.3 (HDF5) file ({exc}); it is damaged or "
                             "truncated. Re-copy it, or re-save it from MATLAB") from exc


def _scalar(v: Any) -> int | None:
    a = np.asarray(v)
    if a.size == 1 and a.dtype.kind in "uif":
        return int(a.reshape(()))
    return None


class MatSource(LockedSource):
    """A cube held as a ``(band, y, x)`` array view (v5) or read lazily from HDF5 (v7.3), and its label map."""

    def __init__(self, meta: SceneMetadata, get: Any, labels: np.ndarray | None, close: Any = None) -> None:
        super().__init__(meta, get, close)
        self.labels = labels

def _pick_cube(vars_: list[_Var], variable: str | None, path: Path, grid: tuple[int, int] | None) -> _Var:
    if variable is not None:
        for v in vars_:
            if v.name == variable:
                return v
        raise SceneReadError(
            f"{path}: no variable {variable!r}; the file has {[v.name for v in vars_]} (choose one with --variable)"
        )
    three_d = [v for v in vars_ if len(v.shape) == 3 and min(v.shape) > 1]
    if three_d:
        return max(three_d, key=lambda v: int(np.prod(v.shape)))
    if grid is not None:
        npx = grid[0] * grid[1]
        flat = [v for v in vars_ if len(v.shape) == 2 and npx in v.shape and min(v.shape) > 1]
        if flat:
            return max(flat, key=lambda v: int(np.prod(v.shape)))
    two_d = [v.name for v in vars_ if len(v.shape) == 2 and min(v.shape) > 1]
    hint = f" The 2-D arrays {two_d} look like label maps: attach one to its cube with --labels." if two_d else ""
    raise NoCubeError(
        f"{path}: no hyperspectral cube found (variables: {[f'{v.name} {v.shape}' for v in vars_]}); "
        f"a cube is a 3-D array (y, x, band), or a 2-D bands x pixels array with nRow/nCol scalars.{hint}",
    )


def _grid_size(scalars: dict[str, int]) -> tuple[int, int] | None:
    low = {k.lower(): v for k, v in scalars.items()}
    for r, c in _SIZE_NAMES:
        if r in low and c in low:
            return low[r], low[c]
    return None


def open_mat(path: Path, *, variable: str | None = None, axes: Axes | None = None, labels_variable: str | None = None,
             max_bytes: int | None = None) -> MatSource:
    """Open a MATLAB cube; raises :class:`SceneReadError` (with the reason) when there is none."""
    import h5py  # scipy and h5py are imported when a .mat file is opened (~0.2 s otherwise on every start)

    v73 = is_mat_v73(path)
    h5: h5py.File | None = None
    if v73:
        h5, vars_ = _open_v73(path)
    else:
        vars_ = _list_v5(path)
    try:
        small = _load_small(path, h5, vars_)
        scalars = {k: s for k, v in small.items() if not k.startswith("__") and (s := _scalar(v)) is not None}
        grid = _grid_size(scalars)
        cube = _pick_cube(vars_, variable, path, grid)
        itemsize = np.dtype(cube.dtype).itemsize if v73 else 8  # whosmat's class is unreliable: assume 8
        nbytes = int(np.prod(cube.shape)) * itemsize
        if max_bytes is not None and nbytes > max_bytes:
            raise SceneReadError(
                f"{path}: variable {cube.name!r} {cube.shape} is up to {nbytes} bytes decoded, over the "
                f"{max_bytes}-byte scene limit; raise --max-bytes if it is genuine"
            )
        if axes is None:
            axes = _detect_axes(cube.shape, grid, small, cube.name)
        if len(cube.shape) == 2:
            (nb, ny, nx), dtype, get = _unfold(path, h5, cube, small, grid, axes)
        else:
            (nb, ny, nx), dtype, get = _cube_3d(path, h5, cube, axes)
        labels, issues = find_label_map(small, cube.name, (ny, nx), labels_variable, path)
        meta = _metadata(path, v73, (nb, ny, nx), dtype, cube.name, axes, issues)
    except BaseException:
        if h5 is not None:
            h5.close()
        raise
    return MatSource(meta, get, labels, close=h5.close if h5 is not None else None)


def _load_small(path: Path, h5: Any, vars_: list[_Var]) -> dict[str, Any]:
    """Scalars and small 2-D arrays (nRow/nCol, label maps), cheap to load; the cube is loaded last."""
    import scipy.io

    names = [v.name for v in vars_ if int(np.prod(v.shape)) <= 16 * 1024 * 1024 and len(v.shape) < 3]
    if h5 is not None:
        return {n: np.asarray(h5[n]).T for n in names}
    try:
        return scipy.io.loadmat(str(path), variable_names=names) if names else {}
    except Exception as exc:  # scipy raises bare errors on damaged files
        raise SceneReadError(f"{path}: not a readable MATLAB v5 file: {exc}") from exc


def _unfold(path: Path, h5: Any, cube: _Var, small: dict[str, Any], grid: tuple[int, int] | None,
            axes: Axes) -> tuple[tuple[int, int, int], np.dtype[Any], Callable[..., np.ndarray]]:
    """A 2-D bands x pixels (or pixels x bands) array unfolded onto the nRow x nCol grid."""
    if grid is None:
        raise NoCubeError(
            f"{path}: {cube.name!r} is 2-D {cube.shape} but the file has no nRow/nCol scalars to unfold "
            "it into (y, x, band); store the cube as (y, x, band)"
        )
    arr = small[cube.name] if cube.name in small else _load_full(path, h5, cube.name)
    if axes == "pb":
        arr = arr.T
    if arr.shape[1] != grid[0] * grid[1]:
        raise SceneReadError(f"{path}: {cube.name!r} has {arr.shape[1]} pixels but nRow x nCol = {grid[0]}x{grid[1]}")
    # MATLAB stores the pixels of each band column-major
    data = arr.reshape(arr.shape[0], grid[1], grid[0]).transpose(0, 2, 1)
    return data.shape, data.dtype, _numpy_getter(data)


def _cube_3d(path: Path, h5: Any, cube: _Var,
             axes: Axes) -> tuple[tuple[int, int, int], np.dtype[Any], Callable[..., np.ndarray]]:
    """A 3-D cube as (band, y, x): read lazily from HDF5 (v7.3), loaded whole from a v5 file."""
    perm = {"yxb": (2, 0, 1), "xyb": (2, 1, 0), "byx": (0, 1, 2), "bxy": (0, 2, 1)}.get(axes)
    if perm is None:
        raise SceneReadError(f"{path}: axes {axes!r} do not fit a 3-D cube; use yxb, xyb, byx or bxy")
    shape = (cube.shape[perm[0]], cube.shape[perm[1]], cube.shape[perm[2]])
    if h5 is not None:
        return shape, h5[cube.name].dtype, _h5_getter(h5[cube.name], perm)
    data = _load_full(path, None, cube.name).transpose(perm)
    return data.shape, data.dtype, _numpy_getter(data)


def _metadata(path: Path, v73: bool, shape: tuple[int, int, int], dtype: Any, variable: str, axes: Axes,
              issues: list[Issue]) -> SceneMetadata:
    nb, ny, nx = shape
    note = warning(Code.NOT_GEOREFERENCED,
                   "MATLAB files carry no georeferencing; the product uses a pixel grid (x, y = pixel centres)")
    return SceneMetadata(path=str(path), files=(str(path),), format="MAT-v7.3" if v73 else "MAT-v5", count=nb,
                         height=ny, width=nx, dtype=np.dtype(dtype).name, bands=tuple(BandInfo(i + 1) for i in range(nb)),
                         block_shape=(ny, nx), tags={"variable": variable, "axes": axes}, georeferenced=False,
                         issues=(*issues, note))


def _detect_axes(shape: tuple[int, ...], grid: tuple[int, int] | None, small: dict[str, Any], cube: str) -> Axes:
    """Axis order from the file's own hints: nRow/nCol scalars or a label map on the cube's grid.

    Without hints a 3-D cube is taken as MATLAB's usual ``(y, x, band)``.
    """
    if len(shape) == 2:
        return "bp" if grid and shape[1] == grid[0] * grid[1] else "pb"
    grids = [tuple(np.asarray(v).shape) for k, v in small.items()
             if not k.startswith("__") and k != cube and np.asarray(v).ndim == 2 and min(np.asarray(v).shape) > 1]
    if grid is not None:
        grids.insert(0, grid)
    for g in grids:
        if g == (shape[0], shape[1]):
            return "yxb"
        if g == (shape[1], shape[2]):
            return "byx"
    return "yxb"


def _load_full(path: Path, h5: Any, name: str) -> np.ndarray:
    import scipy.io

    if h5 is not None:
        return np.asarray(h5[name]).T
    try:
        return np.asarray(scipy.io.loadmat(str(path), variable_names=[name])[name])
    except Exception as exc:
        raise SceneReadError(f"{path}: cannot load {name!r}: {exc}") from exc


def _numpy_getter(data: np.ndarray) -> Any:
    def get(w: Window) -> np.ndarray:
        return data[:, w.row_off : w.row_end, w.col_off : w.col_end]

    return get


def _h5_getter(ds: Any, perm: tuple[int, int, int]) -> Any:
    # h5py shape is the reverse of MATLAB's; MATLAB axis k is h5 axis (2 - k)
    def get(w: Window) -> np.ndarray:
        sl: list[slice] = [slice(None)] * 3
        _band_axis_m, y_axis_m, x_axis_m = perm
        sl[2 - y_axis_m] = slice(w.row_off, w.row_end)
        sl[2 - x_axis_m] = slice(w.col_off, w.col_end)
        block = ds[tuple(sl)]  # h5 order
        m_order = block.T  # MATLAB order
        return m_order.transpose(perm)

    return get


def find_label_map(
    small: dict[str, Any], cube_name: str, shape: tuple[int, int], wanted: str | None, path: Path
) -> tuple[np.ndarray | None, list[Issue]]:
    issues: list[Issue] = []
    cands = {
        k: np.asarray(v)
        for k, v in small.items()
        if not k.startswith("__") and k != cube_name and np.asarray(v).ndim == 2 and np.asarray(v).dtype.kind in "ui"
        and min(np.asarray(v).shape) > 1
    }
    if wanted is not None:
        if wanted not in cands:
            raise SceneReadError(f"{path}: no 2-D integer label variable {wanted!r}; candidates: {sorted(cands)}")
        cands = {wanted: cands[wanted]}
    on_grid = {k: v for k, v in cands.items() if v.shape == shape}
    for k, v in cands.items():
        if v.shape != shape:
            issues.append(
                warning(
                    Code.LABELS_IGNORED,
                    f"2-D integer variable {k!r} {v.shape} is not on the cube's {shape} grid; not attached as labels",
                )
            )
    if not on_grid:
        return None, issues
    name = next((k for k in on_grid if any(h in k.lower() for h in _LABEL_HINTS)), next(iter(on_grid)))
    return on_grid[name], issues
