"""Calibration as reversible coders, and the plan that turns DNs into stored values. Pure numpy.

For every kept band ``b``::

    value  = gain[b] × DN + offset[b]            (LinearCoder, float64; NaN where DN is nodata/non-finite)
    stored = value                               (float32 encoding), or
    stored = round((value - add_offset) / scale_factor)   (int16/uint16 CF encoding, fill where NaN)

The last step, the stored representation (:class:`~cubelake.cube.CFEncoder`), lives in
``cubelake.cube``: the product writers, the references and the readers share it.
Each step has ``encode``/``decode`` and ``to_dict``/``from_dict`` (the record in every product's
metadata), so what was applied can be audited and undone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cubelake.cube import CFEncoder

__all__ = [
    "SUPPORTED_DTYPES",
    "BandSelection",
    "CalibrationPlan",
    "LinearCoder",
]

#: Source data types cubelake ingests (complex and 64-bit integer rasters are refused).
SUPPORTED_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64")

#: Bands calibrated at once: bounds the float64 working set to ``_GROUP × chunk²`` values.
_GROUP = 16


@dataclass(frozen=True, slots=True)
class BandSelection:
    """Kept bands (0-based source indices) and why the others were removed (1-based number -> reason)."""

    n_source: int
    keep: tuple[int, ...]
    removed: dict[int, str] = field(default_factory=dict)

    @property
    def is_all(self) -> bool:
        """Every source band, in source order (a permutation of them still needs ``raw[keep]``)."""
        return self.keep == tuple(range(self.n_source))

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": "select_bands",
            "n_source": self.n_source,
            "keep": [k + 1 for k in self.keep],
            "removed": {str(k): v for k, v in sorted(self.removed.items())},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BandSelection:
        return cls(d["n_source"], tuple(k - 1 for k in d["keep"]), {int(k): v for k, v in d["removed"].items()})


@dataclass(frozen=True, slots=True)
class LinearCoder:
    """``value = gain × DN + offset`` per band (kept bands only, in output order)."""

    gains: tuple[float, ...]
    offsets: tuple[float, ...]
    source: str = "none"

    @property
    def is_identity(self) -> bool:
        return all(g == 1.0 for g in self.gains) and all(o == 0.0 for o in self.offsets)

    def decode(self, dn: np.ndarray) -> np.ndarray:
        """DN ``(band, y, x)`` -> physical values (float64)."""
        g = np.asarray(self.gains, dtype=np.float64)[:, None, None]
        o = np.asarray(self.offsets, dtype=np.float64)[:, None, None]
        return dn.astype(np.float64) * g + o

    def encode(self, value: np.ndarray) -> np.ndarray:
        """Physical values -> DN (float64; the inverse of :meth:`decode`)."""
        g = np.asarray(self.gains, dtype=np.float64)[:, None, None]
        o = np.asarray(self.offsets, dtype=np.float64)[:, None, None]
        return (np.asarray(value, dtype=np.float64) - o) / g

    def subset(self, start: int, stop: int) -> LinearCoder:
        return LinearCoder(self.gains[start:stop], self.offsets[start:stop], self.source)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": "linear",
            "formula": "value = gain * DN + offset",
            "source": self.source,
            "gain": list(self.gains),
            "offset": list(self.offsets),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinearCoder:
        return cls(tuple(d["gain"]), tuple(d["offset"]), d.get("source", "none"))


@dataclass(frozen=True, slots=True)
class CalibrationPlan:
    """Everything needed to turn a source block of all bands into the stored block of kept bands."""

    source_dtype: str
    selection: BandSelection
    nodata: float | None
    linear: LinearCoder
    encoding: CFEncoder
    quantity: str | None = None
    unit: str | None = None

    @property
    def passthrough(self) -> bool:
        """Stored values are the source values (only masking/band selection applied)."""
        return self.linear.is_identity and self.encoding.dtype == self.source_dtype and not self.encoding.is_scaled

    @property
    def n_out(self) -> int:
        return len(self.selection.keep)

    def invalid_mask(self, block: np.ndarray) -> np.ndarray | None:
        """True where a source value is nodata or non-finite; ``None`` when nothing can be."""
        is_float = block.dtype.kind == "f"
        if self.nodata is None and not is_float:
            return None
        mask = np.zeros(block.shape, dtype=bool)
        # NaN nodata is covered by the non-finite test; nodata outside an integer type (e.g. -9999 in
        # uint16 data) never occurs
        nd = self.nodata
        if nd is not None and not math.isnan(nd) and (is_float or _fits(nd, block.dtype)):
            np.equal(block, block.dtype.type(nd), out=mask)
        if is_float:
            mask |= ~np.isfinite(block)
        return mask

    def valid_pixels(self, raw: np.ndarray) -> np.ndarray | None:
        """``(y, x)`` True where any kept band of ``raw (source band, y, x)`` is valid; ``None`` = all are."""
        is_float = raw.dtype.kind == "f"
        nd = self.nodata
        use_nd = nd is not None and not math.isnan(nd) and (is_float or _fits(nd, raw.dtype))
        if not is_float and not use_nd:
            return None
        keep = self.selection.keep
        valid: np.ndarray | None = None
        for g0 in range(0, len(keep), _GROUP):
            idx = keep[g0 : g0 + _GROUP]
            contiguous = idx == tuple(range(idx[0], idx[0] + len(idx)))  # keep need not be sorted
            block = raw[idx[0] : idx[-1] + 1] if contiguous else raw[list(idx)]  # a view when it can be
            if is_float:
                ok = np.isfinite(block)
                if use_nd:
                    ok &= block != raw.dtype.type(nd)
            else:
                ok = block != raw.dtype.type(nd)
            v = np.logical_or.reduce(ok, axis=0)
            valid = v if valid is None else (valid | v)
            if valid.all():  # the usual case inside a scene: one group decides
                return None
        return valid

    def apply(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``raw (source band, y, x)`` -> ``(stored (kept band, y, x), clipped count per kept band)``."""
        if raw.shape[0] != self.selection.n_source:
            raise ValueError(f"expected {self.selection.n_source} source bands, got {raw.shape[0]}")
        keep = self.selection.keep
        sel = raw if self.selection.is_all else raw[list(keep)]
        clipped = np.zeros(len(keep), dtype=np.int64)
        fill = self.encoding.fill_value
        if self.passthrough and (fill is None or fill == self.nodata) and sel.dtype.kind in "iu":
            return sel, clipped  # stored values are the source values: no copy
        out = np.empty(sel.shape, dtype=self.encoding.dtype)
        for g0 in range(0, len(keep), _GROUP):
            g1 = min(len(keep), g0 + _GROUP)
            block = sel[g0:g1]
            invalid = self.invalid_mask(block)
            if self.passthrough:
                out[g0:g1] = block
                if invalid is not None and fill is not None and invalid.any():
                    out[g0:g1][invalid] = fill
                continue
            value = self.linear.subset(g0, g1).decode(block)
            if invalid is not None:
                value[invalid] = np.nan
            enc, clip = self.encoding.encode(value)
            out[g0:g1] = enc
            clipped[g0:g1] = clip
        return out, clipped

    def decode(self, stored: np.ndarray) -> np.ndarray:
        """Stored kept bands -> physical values (float64, NaN = missing)."""
        return self.encoding.decode(stored)

    def as_reference(self) -> tuple[CFEncoder | None, str | None]:
        """The source DNs described as stored values, if this plan changes nothing a reader can't.

        A kerchunk reference serves the source's bytes; a calibration is expressible there only as
        CF attributes on them: one ``scale_factor``/``add_offset`` for every band and the source's
        nodata as ``_FillValue``. Returns ``(encoder, None)`` or ``(None, why not)``.
        """
        if not self.selection.is_all:
            removed = ", ".join(str(k) for k in sorted(self.selection.removed))
            return None, f"the calibration removes bands ({removed}), which a reference cannot do"
        gains, offsets = set(self.linear.gains), set(self.linear.offsets)
        if len(gains) > 1 or len(offsets) > 1:
            return None, "the calibration applies per-band gain/offset, which CF scale_factor/add_offset cannot express"
        gain, offset = (gains.pop() if gains else 1.0), (offsets.pop() if offsets else 0.0)
        enc = self.encoding
        if np.dtype(enc.dtype) != np.dtype(self.source_dtype):
            return None, f"the calibration stores {enc.dtype} values from {self.source_dtype} source values"
        if (gain, offset) != (enc.scale_factor, enc.add_offset):
            return None, (f"the calibration rescales values (gain {gain:g}, offset {offset:g} into scale_factor "
                          f"{enc.scale_factor:g}, add_offset {enc.add_offset:g})")
        return CFEncoder(self.source_dtype, gain, offset, self.nodata), None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source_dtype": self.source_dtype,
            "quantity": self.quantity,
            "unit": self.unit,
            "steps": [
                self.selection.to_dict(),
                {"step": "nodata_mask", "nodata": _json_float(self.nodata), "mask_nonfinite": True},
                self.linear.to_dict(),
                self.encoding.to_dict(),
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CalibrationPlan:
        steps = {s["step"]: s for s in d["steps"]}
        nd = steps["nodata_mask"]["nodata"]
        return cls(
            source_dtype=d["source_dtype"],
            selection=BandSelection.from_dict(steps["select_bands"]),
            nodata=math.nan if nd == "NaN" else nd,
            linear=LinearCoder.from_dict(steps["linear"]),
            encoding=CFEncoder.from_dict(steps["cf_encode"]),
            quantity=d.get("quantity"),
            unit=d.get("unit"),
        )


def _fits(value: float, dtype: np.dtype) -> bool:
    info = np.iinfo(dtype)
    return float(value).is_integer() and info.min <= value <= info.max


def _json_float(v: float | None) -> float | str | None:
    if v is None:
        return None
    return "NaN" if math.isnan(v) else v


def broadcast(value: float | Sequence[float] | None, n: int, default: float, what: str) -> list[float]:
    """A scalar or per-band list as a per-band list of length ``n``."""
    if value is None:
        return [default] * n
    if isinstance(value, int | float):
        return [float(value)] * n
    if len(value) != n:
        raise ValueError(f"{what} has {len(value)} values for {n} bands; give one per band or a single number")
    return [float(v) for v in value]
