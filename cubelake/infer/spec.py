"""What a model expects, saved with it: its input layout, patch, bands and classes, and the preprocessing
the training loader applied (band selection, normalisation, projection), replayed exactly at inference.

Both are plain frozen dataclasses with a bounded JSON form: a model file is untrusted input, so its
spec is checked field by field (types, ranges, sizes) before anything uses it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from cubelake.lake import safe_scene_id

from .errors import ModelError

if TYPE_CHECKING:
    import torch

    from cubelake.loaders.dataset import CubeDataset
    from cubelake.loaders.spectral import Projection

__all__ = ["LAYOUTS", "MAX_BANDS", "ModelSpec", "Preprocessing"]

LAYOUTS = ("BC", "B1C", "BCHW", "B1CHW")
MAX_BANDS = 4096  # bounds every vector and matrix a spec may hold
MAX_CLASSES = 65534  # class maps are uint16 at most, 65535 being nodata
MAX_PATCH = 255
Normalize = Literal["scene", "fixed", "none"]


def _floats(v: Any, what: str, n: int | None = None) -> tuple[float, ...]:
    if not isinstance(v, list | tuple) or len(v) > MAX_BANDS or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in v):
        raise ModelError(f"{what}: expected a list of at most {MAX_BANDS} finite numbers")
    if n is not None and len(v) != n:
        raise ModelError(f"{what}: expected {n} numbers, got {len(v)}")
    return tuple(float(x) for x in v)


@dataclass(frozen=True)
class Preprocessing:
    """The band-axis steps of :class:`~cubelake.loaders.spectral.Spectral`, with the numbers training used.

    ``wavelength_ranges_nm``: keep bands whose centre lies in a range (as training selected them).
    ``normalize``: ``"scene"`` standardises with the predicted scene's own statistics (what
    ``Spectral(normalize="scene")`` does), ``"fixed"`` with ``mean``/``std`` (the pooled statistics
    a ``"global"`` training run used), ``"none"`` keeps physical values. ``projection``/``center``:
    ``y = projection @ (x - center)`` after normalisation (PCA). ``fill``: value of nodata and
    out-of-raster pixels after normalisation.
    """

    wavelength_ranges_nm: tuple[tuple[float, float], ...] | None = None
    normalize: Normalize = "scene"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    projection: tuple[tuple[float, ...], ...] | None = None
    center: tuple[float, ...] | None = None
    fill: float = 0.0

    def __post_init__(self) -> None:
        if self.normalize not in ("scene", "fixed", "none"):
            raise ModelError(f"preprocessing normalize={self.normalize!r}: use 'scene', 'fixed' or 'none'")
        if (self.normalize == "fixed") != (self.mean is not None and self.std is not None):
            raise ModelError("preprocessing: normalize='fixed' needs both mean and std (and only it takes them)")
        if self.mean is not None and self.std is not None and len(self.mean) != len(self.std):
            raise ModelError(f"preprocessing: mean has {len(self.mean)} values, std {len(self.std)}")
        if self.std is not None and not all(s > 0 for s in self.std):
            raise ModelError("preprocessing: every std must be > 0")
        if (self.projection is None) != (self.center is None):
            raise ModelError("preprocessing: projection and center go together")
        if self.projection is not None and self.center is not None and (
                not self.projection or any(len(r) != len(self.center) for r in self.projection)):
            raise ModelError(f"preprocessing: projection rows must each have {len(self.center)} values (the center's)")
        for lo, hi in self.wavelength_ranges_nm or ():
            if not lo < hi:
                raise ModelError(f"preprocessing wavelength range ({lo}, {hi}): low must be below high (nm)")

    @property
    def out_bands(self) -> int | None:
        """Channels after the projection (``None``: as many as selected)."""
        return len(self.projection) if self.projection is not None else None

    def matrix(self) -> Projection | None:
        from cubelake.loaders.spectral import Projection

        if self.projection is None or self.center is None:
            return None
        return Projection(np.asarray(self.projection, np.float32), np.asarray(self.center, np.float32))

    @classmethod
    def from_dataset(cls, ds: CubeDataset, projection: Projection | None = None) -> Preprocessing:
        """What ``ds`` does to the band axis (``projection``: one fitted apart, e.g. by ``ds.fit_projection``).

        A ``"global"`` dataset's pooled statistics are recorded as ``"fixed"`` numbers: at inference the
        scene is standardised with the statistics the model was trained on, not its own.
        """
        sp = ds.spectral
        proj = projection if projection is not None else sp.projection
        mean = std = None
        mode: Normalize = "none" if sp.normalize == "none" else "scene"
        if sp.normalize == "global":
            m, s = ds._norm[0]  # pooled: equal for every scene
            mean, std, mode = tuple(map(float, m)), tuple(map(float, s)), "fixed"
        ranges = tuple((float(lo), float(hi)) for lo, hi in sp.wavelength_ranges_nm) if sp.wavelength_ranges_nm else None
        return cls(wavelength_ranges_nm=ranges, normalize=mode, mean=mean, std=std,
                   projection=tuple(tuple(map(float, r)) for r in proj.matrix) if proj is not None else None,
                   center=tuple(map(float, proj.center)) if proj is not None else None, fill=float(sp.fill))

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: Any, where: str = "preprocessing") -> Preprocessing:
        if not isinstance(d, dict):
            raise ModelError(f"{where}: expected an object")
        unknown = set(d) - {"wavelength_ranges_nm", "normalize", "mean", "std", "projection", "center", "fill"}
        if unknown:
            raise ModelError(f"{where}: unknown field(s) {sorted(unknown)}")
        ranges = d.get("wavelength_ranges_nm")
        if ranges is not None:
            if not isinstance(ranges, list | tuple) or len(ranges) > MAX_BANDS:
                raise ModelError(f"{where}.wavelength_ranges_nm: expected a list of [low, high] pairs (nm)")
            ranges = tuple(cast(tuple[float, float], _floats(r, f"{where}.wavelength_ranges_nm[]", 2)) for r in ranges)
        proj = d.get("projection")
        if proj is not None:
            if not isinstance(proj, list | tuple) or not 0 < len(proj) <= MAX_BANDS:
                raise ModelError(f"{where}.projection: expected a list of at most {MAX_BANDS} rows")
            proj = tuple(_floats(r, f"{where}.projection[]") for r in proj)
        fill = d.get("fill", 0.0)
        return cls(wavelength_ranges_nm=ranges, normalize=d.get("normalize", "scene"),
                   mean=_floats(d["mean"], f"{where}.mean") if "mean" in d else None,
                   std=_floats(d["std"], f"{where}.std") if "std" in d else None, projection=proj,
                   center=_floats(d["center"], f"{where}.center") if "center" in d else None,
                   fill=_floats([fill], f"{where}.fill")[0])


@dataclass(frozen=True)
class ModelSpec:
    """What a model takes and gives (see the module docstring of :mod:`cubelake.infer`)."""

    name: str
    kind: Literal["pixel", "dense"]
    layout: Literal["BC", "B1C", "BCHW", "B1CHW"]
    bands: int
    classes: int
    patch: int = 1
    receptive_field: int | None = None
    output: Literal["logits", "probabilities"] = "logits"
    preprocessing: Preprocessing | None = field(default=None)
    pad_to: int = 1  # dense models: input height/width must be multiples of this (a U-Net's 2**depth)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or safe_scene_id(self.name) != self.name:
            raise ModelError(f"model name {self.name!r}: use letters, digits, '.', '_' and '-' only")
        if self.kind not in ("pixel", "dense"):
            raise ModelError(f"model kind {self.kind!r}: 'pixel' (patch-centred) or 'dense' (segmentation)")
        if self.layout not in LAYOUTS:
            raise ModelError(f"model layout {self.layout!r}: one of {', '.join(LAYOUTS)}")
        if self.output not in ("logits", "probabilities"):
            raise ModelError(f"model output {self.output!r}: 'logits' or 'probabilities'")
        for what, v, lo, hi in (("bands", self.bands, 1, MAX_BANDS), ("classes", self.classes, 1, MAX_CLASSES),
                                ("patch", self.patch, 0, MAX_PATCH), ("pad_to", self.pad_to, 1, 1024)):
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ModelError(f"model {what}={v!r}: expected an integer in [{lo}, {hi}]")
        if self.kind == "pixel":
            if self.patch < 1 or self.patch % 2 == 0:
                raise ModelError(f"pixel model patch={self.patch}: an odd size >= 1 (the pixel is its centre)")
            if self.layout in ("BC", "B1C") and self.patch != 1:
                raise ModelError(f"layout {self.layout} is a 1-D spectral input: patch must be 1, got {self.patch}")
        elif self.layout in ("BC", "B1C"):
            raise ModelError(f"a dense model needs a spatial layout (BCHW or B1CHW), got {self.layout}")
        rf = self.receptive_field
        if rf is not None and (not isinstance(rf, int) or isinstance(rf, bool) or not 0 <= rf <= 4096):
            raise ModelError(f"model receptive_field={rf!r}: a radius in pixels (0..4096), or null to measure it")
        pre = self.preprocessing
        if pre is not None and pre.out_bands is not None and pre.out_bands != self.bands:
            raise ModelError(f"model takes {self.bands} bands but its preprocessing projects to {pre.out_bands}")

    @property
    def radius(self) -> int | None:
        """Pixels of context each output pixel depends on, each side (``None``: unknown, measure it)."""
        return self.patch // 2 if self.kind == "pixel" else self.receptive_field

    def input_shape(self, batch: int, *, patch: int | None = None, bands: int | None = None,
                    size: int = 64) -> tuple[int, ...]:
        """The input shape for ``batch`` samples (dense models: ``size`` x ``size`` tiles)."""
        p = patch if patch is not None else (self.patch if self.kind == "pixel" else size)
        c = bands if bands is not None else self.bands
        return {"BC": (batch, c), "B1C": (batch, 1, c), "BCHW": (batch, c, p, p), "B1CHW": (batch, 1, c, p, p)}[self.layout]

    def example(self, batch: int, *, patch: int | None = None, bands: int | None = None, size: int = 64,
                dtype: torch.dtype | None = None, device: str = "cpu", seed: int = 0) -> torch.Tensor:
        """A random (standard normal) input of ``batch`` samples."""
        import torch

        g = torch.Generator().manual_seed(seed)
        x = torch.randn(self.input_shape(batch, patch=patch, bands=bands, size=size), generator=g)
        return x.to(device=device, dtype=dtype or torch.float32)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "preprocessing" and v is not None}
        if self.preprocessing is not None:
            d["preprocessing"] = self.preprocessing.to_dict()
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_dict(cls, d: Any, where: str = "model spec") -> ModelSpec:
        if not isinstance(d, dict):
            raise ModelError(f"{where}: expected a JSON object")
        known = {"name", "kind", "layout", "bands", "classes", "patch", "receptive_field", "output", "preprocessing",
                 "pad_to"}
        if set(d) - known:
            raise ModelError(f"{where}: unknown field(s) {sorted(set(d) - known)}")
        missing = {"name", "kind", "layout", "bands", "classes"} - set(d)
        if missing:
            raise ModelError(f"{where}: missing field(s) {sorted(missing)}")
        pre = d.get("preprocessing")
        fields = {k: v for k, v in d.items() if k != "preprocessing"}
        try:
            return cls(**fields, preprocessing=Preprocessing.from_dict(pre, f"{where}.preprocessing") if pre else None)
        except TypeError as exc:
            raise ModelError(f"{where}: {exc}") from None

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "model spec") -> ModelSpec:
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ModelError(f"{where}: not valid JSON ({exc})") from None
        return cls.from_dict(d, where)


def spec_with(spec: ModelSpec, **changes: Any) -> ModelSpec:
    """``spec`` with fields replaced (validated again)."""
    from dataclasses import replace

    return replace(spec, **changes)
