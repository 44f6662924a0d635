"""Stack scenes on one grid into a single virtual datacube along ``time`` (or ``scene``).

kerchunk's ``MultiZarrToZarr`` can concatenate reference sets, but it does not check that the
inputs share a grid: scenes with another CRS, resolution or origin would be stacked silently
and misplaced. Here the grids are compared first (CRS, resolution, origin, size, bands,
encoding, codec) and any difference is named; stacking same-grid sets is then only a renaming
of chunk keys (``data/b.y.x`` -> ``data/t.b.y.x``), done directly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from cubelake.errors import CubelakeError, GridMismatchError, RefsError

from .formats import LoadedRefs, load_refs
from .model import RefSet, Target

__all__ = ["combine_refs"]

T = TypeVar("T")


def _json(refs: LoadedRefs, key: str) -> dict[str, Any]:
    v = refs.get(key)
    if not isinstance(v, bytes):
        raise RefsError(f"{refs.path}: missing {key}; not a cubelake/kerchunk cube reference set")
    return dict(json.loads(v))


def _coord(refs: LoadedRefs, name: str) -> np.ndarray | None:
    """A small inline 1-D coordinate array, decoded with numcodecs (``None`` if absent)."""
    import numcodecs

    if refs.get(f"{name}/.zarray") is None:
        return None
    za = _json(refs, f"{name}/.zarray")
    raw = refs.get(f"{name}/0")
    if not isinstance(raw, bytes):
        return None
    if za.get("compressor"):
        raw = numcodecs.get_codec(za["compressor"]).decode(raw)
    for f in reversed(za.get("filters") or []):
        raw = numcodecs.get_codec(f).decode(raw)
    return np.frombuffer(bytes(raw), dtype=za["dtype"])[: int(np.prod(za["shape"]))]


def _grid(refs: LoadedRefs) -> dict[str, Any]:
    za = _json(refs, "data/.zarray")
    attrs = _json(refs, "data/.zattrs")
    sr = _json(refs, "spatial_ref/.zattrs") if refs.get("spatial_ref/.zattrs") is not None else {}
    gt = [float(v) for v in str(sr.get("GeoTransform", "")).split()] or None
    return {
        "dims": attrs.get("_ARRAY_DIMENSIONS"),
        "shape": za["shape"], "chunks": za["chunks"], "dtype": za["dtype"], "fill_value": za.get("fill_value"),
        "codec": za.get("compressor"), "filters": za.get("filters"),
        "scale": (attrs.get("scale_factor", 1.0), attrs.get("add_offset", 0.0)),
        "crs": sr.get("crs_wkt"), "gt": gt,
        "band": _coord(refs, "band"), "wavelength": _coord(refs, "wavelength"),
    }


def _same_crs(a: str | None, b: str | None) -> bool:
    if a == b:
        return True
    if a is None or b is None:
        return False
    from rasterio.crs import CRS

    return bool(CRS.from_wkt(a) == CRS.from_wkt(b))


def _differences(g0: dict[str, Any], g: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if g["dims"] != g0["dims"]:
        out.append(f"dimensions {g['dims']} vs {g0['dims']}")
    if not _same_crs(g0["crs"], g["crs"]):
        out.append("CRS differs")
    gt0, gt = g0["gt"], g["gt"]
    if (gt0 is None) != (gt is None):
        out.append("one is georeferenced, the other not")
    elif gt0 is not None and gt is not None:
        if not (math.isclose(gt0[1], gt[1], rel_tol=1e-9) and math.isclose(gt0[5], gt[5], rel_tol=1e-9)
                and gt0[2] == gt[2] and gt0[4] == gt[4]):
            out.append(f"resolution differs ({gt[1]:g} x {gt[5]:g} vs {gt0[1]:g} x {gt0[5]:g})")
        elif (gt0[0], gt0[3]) != (gt[0], gt[3]):
            dx, dy = (gt[0] - gt0[0]) / gt0[1] + 0.0, (gt[3] - gt0[3]) / gt0[5] + 0.0  # + 0.0: no "-0"
            out.append(f"alignment differs: origin offset by ({dx:g}, {dy:g}) pixels")
    if g["shape"][-2:] != g0["shape"][-2:]:
        out.append(f"size differs ({g['shape'][-2]} x {g['shape'][-1]} vs {g0['shape'][-2]} x {g0['shape'][-1]} pixels)")
    if g["shape"][0] != g0["shape"][0]:
        out.append(f"band count differs ({g['shape'][0]} vs {g0['shape'][0]})")
    else:
        for name in ("band", "wavelength"):
            a, b = g0[name], g[name]
            if (a is None) != (b is None) or (a is not None and b is not None and not np.allclose(a, b, rtol=0, atol=1e-6)):
                out.append(f"bands differ ({name} values)")
                break
    for key, what in (("chunks", "chunk shape"), ("dtype", "data type"), ("fill_value", "nodata/fill value"),
                      ("scale", "scale_factor/add_offset"), ("codec", "tile encoding (compression/predictor)"),
                      ("filters", "filters")):
        if g[key] != g0[key]:
            out.append(f"{what} differs ({g[key]} vs {g0[key]})")
    return out


def _stem(path: str) -> str:
    name = Path(path).name
    for suffix in (".refs.json", ".refs.parq", ".json", ".parq", ".refs"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _time_value(refs: LoadedRefs) -> datetime | None:
    attrs = _json(refs, ".zattrs")
    text = attrs.get("cubelake:datetime")
    if not text:
        return None
    text = str(text).strip().replace("Z", "+00:00")
    if len(text) >= 10 and text[4] == ":" and text[7] == ":":  # TIFF DateTime "YYYY:MM:DD HH:MM:SS"
        text = text[:4] + "-" + text[5:7] + "-" + text[8:]
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _inline_array(values: np.ndarray, dim: str, attrs: dict[str, Any]) -> tuple[bytes, bytes, bytes]:
    zarray = {"zarr_format": 2, "shape": [len(values)], "chunks": [len(values)], "dtype": values.dtype.str,
              "compressor": None, "filters": None, "fill_value": None, "order": "C"}
    return (json.dumps(zarray).encode(), json.dumps({**attrs, "_ARRAY_DIMENSIONS": [dim]}).encode(),
            np.ascontiguousarray(values).tobytes())


def _guarded(path: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, with any failure to decode a set's grid description reported as a RefsError naming it."""
    try:
        return fn(*args)
    except CubelakeError:
        raise
    except Exception as exc:  # hostile inline bytes/WKT: numcodecs, imagecodecs and PROJ raise many types
        raise RefsError(f"{path}: the grid description (coordinates, CRS, geotransform) cannot be read "
                        f"({type(exc).__name__}: {exc}); re-create the references with cubelake") from None


def combine_refs(paths: Sequence[str | Path], *, dim: Literal["time", "scene"] = "time") -> RefSet:
    """One reference set of ``data (dim, band, y, x)`` from scene reference sets on the same grid.

    ``dim="time"`` orders scenes by their ``cubelake:datetime`` (every scene needs one, all
    different); ``dim="scene"`` keeps the given order. Raises :class:`GridMismatchError`
    naming each difference (CRS, resolution, alignment, size, bands, encoding).
    """
    if not paths:
        raise RefsError("combine needs at least one reference set")
    sets = [load_refs(p) for p in paths]
    for loaded in sets:
        loaded.check_ranges()
    grids = [_guarded(r.path, _grid, r) for r in sets]
    if grids[0]["dims"] != ["band", "y", "x"]:
        raise GridMismatchError(f"{sets[0].path}: data has dimensions {grids[0]['dims']}; only single scenes "
                                "(band, y, x) can be stacked")
    problems = [f"{r.path}: " + "; ".join(d) for r, g in zip(sets[1:], grids[1:], strict=True)
                if (d := _guarded(r.path, _differences, grids[0], g))]
    if problems:
        raise GridMismatchError(f"scenes are not on the grid of {sets[0].path}, so they cannot be stacked: "
                                + " | ".join(problems) + ". Re-ingest them onto one grid (same CRS, resolution, "
                                "origin, size and bands) first")
    ids = [str(_json(r, ".zattrs").get("cubelake:scene_id") or _stem(r.path)) for r in sets]
    order = list(range(len(sets)))
    times: list[datetime | None] = [_time_value(r) for r in sets]
    if dim == "time":
        missing = [sets[i].path for i, t in enumerate(times) if t is None]
        if missing:
            raise RefsError(f"no acquisition time in {', '.join(missing)}; stack along dim='scene' instead")
        if len({t for t in times}) != len(times):
            raise RefsError("two scenes have the same acquisition time; stack along dim='scene' instead")
        order.sort(key=lambda i: times[i])  # type: ignore[arg-type, return-value]
    out = RefSet()
    first = sets[0]
    for key in first.iter_keys():
        if key.startswith("data/") and not key.endswith((".zarray", ".zattrs")):
            continue
        v = first.get(key)
        if isinstance(v, bytes) and key != ".zmetadata":
            out.meta[key] = v
    za = _json(first, "data/.zarray")
    za["shape"] = [len(sets), *za["shape"]]
    za["chunks"] = [1, *za["chunks"]]
    out.set_json("data/.zarray", za)
    da = _json(first, "data/.zattrs")
    da["_ARRAY_DIMENSIONS"] = [dim, *da["_ARRAY_DIMENSIONS"]]
    da.pop("cubelake:band_stats", None)  # per-scene statistics do not describe the stack
    out.set_json("data/.zattrs", da)
    root = _json(first, ".zattrs")
    for k in ("cubelake:scene_id", "cubelake:source", "cubelake:datetime", "cubelake:content_hash"):
        root.pop(k, None)
    root["cubelake:scenes"] = [ids[i] for i in order]
    out.set_json(".zattrs", root)
    ordered_ids = np.asarray([ids[i] for i in order])
    if dim == "time":
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        secs = np.asarray([int((times[i] - epoch).total_seconds()) for i in order], dtype="<i8")  # type: ignore[operator]
        out.meta["time/.zarray"], out.meta["time/.zattrs"], out.meta["time/0"] = _inline_array(
            secs, "time", {"units": "seconds since 1970-01-01T00:00:00", "calendar": "proleptic_gregorian",
                           "standard_name": "time"})
        out.meta["scene_id/.zarray"], out.meta["scene_id/.zattrs"], out.meta["scene_id/0"] = _inline_array(
            ordered_ids.astype(f"<U{max(1, max(len(s) for s in ids))}"), "time", {"long_name": "scene id"})
        da["coordinates"] = "scene_id"
        out.set_json("data/.zattrs", da)
    else:
        out.meta["scene/.zarray"], out.meta["scene/.zattrs"], out.meta["scene/0"] = _inline_array(
            ordered_ids.astype(f"<U{max(1, max(len(s) for s in ids))}"), "scene", {"long_name": "scene id"})
    index: dict[str, int] = {}
    for t_out, i in enumerate(order):
        r = sets[i]
        recorded = {t.url: t for t in r.targets}
        for key in r.iter_keys():
            if not key.startswith("data/") or key.endswith((".zarray", ".zattrs")):
                continue
            v = r.get(key)
            if not isinstance(v, tuple):
                raise RefsError(f"{r.path}: chunk {key} is inline data; expected a byte-range reference")
            url, off, n = v
            if url not in index:
                index[url] = len(out.targets)
                out.targets.append(recorded.get(url) or Target(url, -1))
            out.chunks[f"data/{t_out}.{key[5:]}"] = (index[url], off, n)
    missing_info = [t.url for t in out.targets if t.size < 0]
    if missing_info:
        raise RefsError(f"no recorded size/mtime for {missing_info[:3]}; rebuild those references with cubelake")
    out.consolidate()
    return out
