"""Sensor profiles: typed YAML that says how to calibrate and encode a sensor's scenes.

A profile may give per-band gain/offset or a reflectance scale, nodata, bad bands (indices,
names or wavelength windows), wavelengths/FWHM (inline, a band table, or a CSV/YAML sidecar),
the output encoding and the chunk size. Profiles for the sensors in the bundled sample data
ship in ``cubelake/ingest/profiles/`` and are found by name (``cubelake profiles`` lists them);
``match`` rules let ``--profile auto`` pick one from a scene's file name, band count and tags.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import json
import logging
import math
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cubelake.errors import ConfigError, ProfileError
from cubelake.grid import parse_chunk_size
from cubelake.yamlsafe import load_yaml

from .sources import SceneMetadata
from .spectral import DEFAULT_BAD_WINDOWS_NM, unit_factor_to_nm

__all__ = [
    "BadBands",
    "Calibration",
    "Encoding",
    "Match",
    "ProductSettings",
    "SensorProfile",
    "Spectral",
    "StacInfo",
    "TimeRule",
    "builtin_profiles",
    "load_profile",
    "match_profile",
    "near_profiles",
]

log = logging.getLogger(__name__)

_Strict = ConfigDict(extra="forbid", frozen=True)


class Match(BaseModel):
    """When ``--profile auto`` picks this profile.

    By name: the ``filename`` globs match and every other given rule holds. By content, whatever
    the file is called: every given content rule holds and there is one beyond the band count
    (``wavelengths_nm`` or ``tags``), since a band count alone is shared by many sensors.
    """

    model_config = _Strict
    filename: list[str] = Field(default_factory=list, description="glob patterns, case-insensitive")
    bands: int | None = None
    tags: dict[str, str] = Field(default_factory=dict, description="scene tags that must equal these values")
    wavelengths_nm: tuple[float, float] | None = Field(
        None, description="the scene's first and last band centre wavelengths (nm), each within tolerance_nm")
    tolerance_nm: float = Field(3.0, gt=0)

    def _wavelengths_fit(self, meta: SceneMetadata) -> bool:
        wl = meta.wavelengths_nm
        if self.wavelengths_nm is None or not wl or wl[0] is None or wl[-1] is None:
            return False
        first, last = self.wavelengths_nm
        return abs(wl[0] - first) <= self.tolerance_nm and abs(wl[-1] - last) <= self.tolerance_nm

    def how(self, meta: SceneMetadata) -> str | None:
        """``"name"`` or ``"content"`` when the rules pick this profile for ``meta``, else ``None``.

        A name match needs the band count and tags (the wavelengths may be missing from such a
        file); a content match needs those and the wavelengths, when the rules give them.
        """
        if self.bands is not None and self.bands != meta.count:
            return None
        if any(meta.tags.get(k, "").strip() != v for k, v in self.tags.items()):
            return None
        name = Path(meta.path).name.lower()
        if self.filename and any(fnmatch.fnmatch(name, pat.lower()) for pat in self.filename):
            return "name"
        if self.wavelengths_nm is not None:
            return "content" if self._wavelengths_fit(meta) else None
        return "content" if self.tags or not self.filename else None


class Calibration(BaseModel):
    """``value = scale × (gain[b] × DN + offset[b])``; ``source`` picks coefficients the file carries."""

    model_config = _Strict
    source: str = Field("file", description="'file' (the file's own coefficients, if any), 'none', or a named set such as 'toa_reflectance'")
    gain: float | list[float] | None = None
    offset: float | list[float] | None = None
    scale: float = Field(1.0, description="reflectance scale factor applied after gain/offset, e.g. 1e-4")
    quantity: str | None = Field(None, description="physical quantity, e.g. 'reflectance', 'radiance'")
    unit: str | None = None

    @field_validator("scale")
    @classmethod
    def _scale_nonzero(cls, v: float) -> float:
        if v == 0 or not math.isfinite(v):
            raise ValueError(f"scale must be finite and non-zero, got {v}")
        return v


class BadBands(BaseModel):
    """Which bands to drop. ``indices`` are 1-based source band numbers."""

    model_config = _Strict
    use_file_bbl: bool = True
    indices: list[int] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)
    wavelength_windows_nm: list[tuple[float, float]] | None = Field(
        None, description="[lo, hi] nm windows; null = the defaults (water vapour, > 2450 nm); [] = none"
    )

    @field_validator("indices")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(i < 1 for i in v):
            raise ValueError(f"bad band indices are 1-based band numbers, got {v}")
        return v

    @field_validator("wavelength_windows_nm")
    @classmethod
    def _ordered(cls, v: list[tuple[float, float]] | None) -> list[tuple[float, float]] | None:
        for lo, hi in v or []:
            if not lo < hi:
                raise ValueError(f"wavelength window [{lo}, {hi}] must have lo < hi")
        return v

    def windows(self) -> list[tuple[float, float]]:
        return list(DEFAULT_BAD_WINDOWS_NM) if self.wavelength_windows_nm is None else list(self.wavelength_windows_nm)


class Spectral(BaseModel):
    """Wavelengths/FWHM (nm) that replace or complete what the file says."""

    model_config = _Strict
    wavelengths_nm: list[float] | None = None
    fwhm_nm: list[float] | None = None
    band_table: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="band name -> (centre wavelength nm, FWHM nm), e.g. Landsat B1..B7"
    )
    sidecar: str | None = Field(None, description="CSV/YAML with wavelength (and fwhm) per band; relative to the profile")
    overlap: Literal["error", "drop", "drop-earlier"] = Field(
        "error",
        description="wavelengths that step back at a spectrometer seam: 'error' rejects the scene, 'drop' removes "
        "the later detector's bands that do not exceed the earlier detector's (EnMAP VNIR/SWIR), 'drop-earlier' "
        "removes the earlier detector's bands that reach the later detector's first (keeps SWIR at PRISMA's seam)",
    )


class Encoding(BaseModel):
    """How calibrated values are stored: float32, or integers with CF scale_factor/add_offset."""

    model_config = _Strict
    dtype: Literal["auto", "source", "float32", "int16", "uint16"] = "auto"
    scale_factor: float = 1.0
    add_offset: float = 0.0
    fill_value: float | None = None

    @model_validator(mode="after")
    def _ints_need_scale(self) -> Encoding:
        if self.scale_factor == 0 or not math.isfinite(self.scale_factor):
            raise ValueError(f"scale_factor must be finite and non-zero, got {self.scale_factor}")
        if self.dtype in ("float32", "auto", "source") and (self.scale_factor != 1.0 or self.add_offset != 0.0):
            raise ValueError(f"scale_factor/add_offset apply to int16/uint16 encodings, not {self.dtype!r}")
        return self


class ProductSettings(BaseModel):
    model_config = _Strict
    chunk: int = 256
    compression: Literal["zstd", "deflate"] = "zstd"
    level: int | None = None
    overviews: bool = False
    shard: int | None = Field(None, description="Zarr shard side in chunks (e.g. 4 -> 4x4 chunks per shard); null = no sharding")

    @field_validator("chunk")
    @classmethod
    def _chunk(cls, v: int) -> int:
        return parse_chunk_size(v)

    @field_validator("shard")
    @classmethod
    def _shard(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"shard must be >= 1 chunks, got {v}")
        return v


class TimeRule(BaseModel):
    """Where the acquisition time comes from when the file's metadata has none."""

    model_config = _Strict
    filename_pattern: str | list[str] | None = Field(
        None,
        description="regex (or list of them, tried in order) searched in the file name, with named groups "
        "year, and month+day or doy, optionally hour, minute, second (UTC); a date alone means that whole day",
    )
    datetime: str | None = Field(None, description="a fixed acquisition time (ISO 8601, UTC if no offset)")
    start_datetime: str | None = None
    end_datetime: str | None = None

    @field_validator("filename_pattern")
    @classmethod
    def _pattern(cls, v: str | list[str] | None) -> str | list[str] | None:
        for p in [v] if isinstance(v, str) else (v or []):
            try:
                rx = regex.compile(p)
            except regex.error as exc:
                raise ValueError(f"{p!r} is not a valid regular expression ({exc})") from exc
            groups = set(rx.groupindex)
            if "year" not in groups or not ({"month", "day"} <= groups or "doy" in groups):
                raise ValueError(f"{p!r} needs named groups year and month+day (or doy); has {sorted(groups) or 'none'}")
        return v

    @property
    def filename_patterns(self) -> list[str]:
        v = self.filename_pattern
        return [v] if isinstance(v, str) else list(v or [])

    @model_validator(mode="after")
    def _range(self) -> TimeRule:
        if (self.start_datetime is None) != (self.end_datetime is None):
            raise ValueError("give both start_datetime and end_datetime, or neither")
        return self


class StacInfo(BaseModel):
    """What the catalog says about this sensor's scenes (STAC common metadata)."""

    model_config = _Strict
    platform: str | None = None
    constellation: str | None = None
    instruments: list[str] = Field(default_factory=list)
    license: str = Field("other", description="SPDX id, or 'other'")
    keywords: list[str] = Field(default_factory=list)
    providers: list[dict[str, Any]] = Field(default_factory=list)
    properties: dict[str, Any] = Field(default_factory=dict, description="fixed item properties")
    tag_properties: dict[str, str] = Field(
        default_factory=dict, description="item property -> scene metadata tag it is read from (numbers parsed)"
    )


class SensorProfile(BaseModel):
    model_config = _Strict
    name: str = "generic"
    description: str = ""
    match: Match | None = None
    nodata: float | None = Field(None, description="overrides the file's nodata value")
    calibration: Calibration = Field(default_factory=Calibration)
    bad_bands: BadBands = Field(default_factory=BadBands)
    spectral: Spectral = Field(default_factory=Spectral)
    encoding: Encoding = Field(default_factory=Encoding)
    products: ProductSettings = Field(default_factory=ProductSettings)
    time: TimeRule = Field(default_factory=TimeRule)
    stac: StacInfo = Field(default_factory=StacInfo)
    origin: str | None = Field(None, exclude=True, description="where the profile was loaded from")

    def config_dict(self) -> dict[str, Any]:
        """The settings that shape products (for the config hash); excludes name/description/match."""
        return self.model_dump(mode="json", exclude={"name", "description", "match", "origin"})

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.config_dict(), sort_keys=True).encode()).hexdigest()


def _builtin_dir() -> Path:
    return Path(str(resources.files("cubelake.ingest") / "profiles"))


def builtin_profiles() -> dict[str, Path]:
    """Bundled profiles by name."""
    return {p.stem: p for p in sorted(_builtin_dir().glob("*.yaml"))}


#: A wavelength table of thousands of bands is a few tens of KB.
SIDECAR_MAX_BYTES = 4 * 1024 * 1024


def _confined(profile: Path, name: str) -> Path:
    """A file a profile names, confined to the profile's folder (a profile is untrusted input)."""
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts or "\x00" in name:
        raise ProfileError(
            f"{profile}: spectral.sidecar {name!r} is not a path inside the profile's folder ({profile.parent}); "
            "put the sidecar next to the profile and name it relative to it")
    return profile.parent / rel


def _read_sidecar(path: Path) -> tuple[list[float], list[float] | None]:
    """Wavelengths (and FWHM) in nm from a CSV (header row) or YAML sidecar."""
    if not path.is_file():
        raise ProfileError(f"{path}: wavelength sidecar not found (or not a regular file)")
    if path.stat().st_size > SIDECAR_MAX_BYTES:
        raise ProfileError(f"{path}: {path.stat().st_size} bytes is too large for a wavelength sidecar")
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            doc = load_yaml(path) or {}
        except ConfigError as exc:
            raise ProfileError(str(exc)) from None
        if not isinstance(doc, dict):
            raise ProfileError(f"{path}: a YAML sidecar is a mapping with a 'wavelength' list")
        units = doc.get("wavelength_units", doc.get("units", "nm"))
        factor = unit_factor_to_nm(units) if isinstance(units, str) else None
        if factor is None:
            raise ProfileError(f"{path}: unknown wavelength unit {units!r}; use nm or um")
        try:
            listed: Any = doc.get("wavelength", doc.get("wavelengths", []))
            wl = [float(v) * factor for v in listed]
            fw: Any = doc.get("fwhm")
            return wl, ([float(v) * factor for v in fw] if fw else None)
        except (TypeError, ValueError) as exc:
            raise ProfileError(f"{path}: wavelength/fwhm must be lists of numbers ({exc})") from None
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ProfileError(f"{path}: not a readable CSV wavelength table ({exc})") from None
    if not rows:
        raise ProfileError(f"{path}: empty wavelength sidecar; expected a header row and one row per band")
    cols = {c.strip().lower(): c for c in rows[0]}
    wcol = next((cols[c] for c in ("wavelength_nm", "wavelength", "wavelength_um", "wl") if c in cols), None)
    if wcol is None:
        raise ProfileError(f"{path}: no wavelength column (have {list(rows[0])}); name one 'wavelength_nm' or 'wavelength_um'")
    factor = 1000.0 if wcol.strip().lower().endswith("_um") else 1.0
    fcol = next((cols[c] for c in ("fwhm_nm", "fwhm", "fwhm_um") if c in cols), None)
    ffactor = 1000.0 if fcol and fcol.strip().lower().endswith("_um") else factor
    try:
        wl = [float(r[wcol]) * factor for r in rows]
        fw = [float(r[fcol]) * ffactor for r in rows] if fcol else None
    except (TypeError, ValueError) as exc:  # a short row gives None, a bad cell a ValueError
        raise ProfileError(f"{path}: non-numeric or missing wavelength/FWHM value: {exc}") from exc
    return wl, fw


def load_profile(name_or_path: str | Path) -> SensorProfile:
    """Load a profile by bundled name (``enmap-l2a``) or path (YAML, or a CSV of wavelengths).

    Raises :class:`ProfileError` naming the file and every field that is wrong.
    """
    text = str(name_or_path)
    builtins = builtin_profiles()
    path = builtins.get(text, Path(text))
    if not path.is_file():
        raise ProfileError(
            f"{text}: no such profile file, and not a bundled profile name (bundled: {', '.join(builtins)})"
        )
    if path.suffix.lower() == ".csv":
        wl, fw = _read_sidecar(path)
        return SensorProfile(name=path.stem, spectral=Spectral(wavelengths_nm=wl, fwhm_nm=fw), origin=str(path))
    try:
        doc = load_yaml(path)
    except ConfigError as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ProfileError(f"{path}: a profile is a YAML mapping, got {type(doc).__name__}")
    try:
        profile = SensorProfile.model_validate({**doc, "origin": str(path)})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ProfileError(f"{path}: invalid profile: {problems}") from exc
    if profile.spectral.sidecar:
        side = _confined(path, profile.spectral.sidecar)
        wl, fw = _read_sidecar(side)
        spectral = profile.spectral.model_copy(update={"wavelengths_nm": wl, "fwhm_nm": fw, "sidecar": str(side)})
        profile = profile.model_copy(update={"spectral": spectral})
    return profile


#: The tag a product reader (EMIT, PRISMA, EnMAP, DESIS) sets from the file's own fields
PRODUCT_TAG = "cubelake:product"


def match_profile(meta: SceneMetadata) -> SensorProfile | None:
    """The bundled profile for this scene, if any: the one named by the product its reader recognised from
    the file's content (``cubelake:product``; none when no profile has that name, e.g. EnMAP L1B, whose
    wavelengths would fit the L2A profile's rules), else the first whose ``match`` rules pick it."""
    builtins = builtin_profiles()
    product = meta.tags.get(PRODUCT_TAG)
    if product in builtins:
        log.info("%s: profile %s (the product's own metadata)", meta.path, product)
        return load_profile(builtins[product])
    if product:  # a product the reader knows but no profile serves: another product's rules must not pick it
        log.info("%s: a %s product; no bundled profile for it (give one with --profile)", meta.path, product)
        return None
    for path in builtins.values():
        profile = load_profile(path)
        if profile.match is None:
            continue
        how = profile.match.how(meta)
        if how is not None:
            log.info("%s: profile %s (matched by %s)", meta.path, profile.name, how)
            return profile
    return None


def near_profiles(meta: SceneMetadata) -> list[str]:
    """Bundled profiles that fit the scene's band count but were not picked (for a hint on a rejection)."""
    out = []
    for name, path in builtin_profiles().items():
        m = load_profile(path).match
        if m is not None and m.bands == meta.count and m.how(meta) is None:
            out.append(name)
    return out
