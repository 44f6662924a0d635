"""Validation reports: every problem found in a scene, as data (JSON) and as text."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["Code", "Issue", "Severity", "ValidationReport"]


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


class Code(StrEnum):
    """Stable, machine-readable problem codes (kept in reports and the CLI's JSON)."""

    # errors: the scene is rejected
    NOT_FOUND = "not_found"
    UNREADABLE = "unreadable"
    NOT_A_RASTER = "not_a_raster"
    CONTENT_MISMATCH = "content_mismatch"
    DATA_FILE_MISSING = "data_file_missing"
    TRUNCATED = "truncated"
    BLOCK_DECODE = "block_decode"
    BAD_DIMENSIONS = "bad_dimensions"
    TOO_LARGE = "too_large"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    WAVELENGTH_COUNT = "wavelength_count"
    WAVELENGTH_ORDER = "wavelength_order"
    WAVELENGTH_NONPOSITIVE = "wavelength_nonpositive"
    NO_CUBE = "no_cube"
    NO_VALID_DATA = "no_valid_data"
    NO_BANDS_LEFT = "no_bands_left"
    PROFILE_MISMATCH = "profile_mismatch"
    LABELS_MISMATCH = "labels_mismatch"
    BAD_METADATA = "bad_metadata"  # a header field or tag that cannot be parsed or is out of its domain
    # warnings: the scene is ingested, the problem is recorded
    NO_CRS = "no_crs"
    NO_TRANSFORM = "no_transform"
    ROTATED_TRANSFORM = "rotated_transform"
    Y_UP_TRANSFORM = "y_up_transform"
    ALL_NODATA_BAND = "all_nodata_band"
    CONSTANT_BAND = "constant_band"
    NONFINITE_VALUES = "nonfinite_values"
    FWHM_IMPLAUSIBLE = "fwhm_implausible"
    BANDS_FLAGGED_BAD = "bands_flagged_bad"
    NO_WAVELENGTHS = "no_wavelengths"
    WAVELENGTH_UNITS_ASSUMED = "wavelength_units_assumed"
    SPARSE_BLOCKS = "sparse_blocks"
    NOT_GEOREFERENCED = "not_georeferenced"
    ENCODING_CLIPPED = "encoding_clipped"
    LABELS_IGNORED = "labels_ignored"
    UNKNOWN_TIME = "unknown_time"
    SPECTRAL_OVERLAP = "spectral_overlap"
    CALIBRATION_SUSPECT = "calibration_suspect"
    BANDS_MISSING = "bands_missing"
    PROFILE_SUGGESTED = "profile_suggested"
    # aux layers that could not be aligned (the scene is ingested without them)
    AUX_NO_OVERLAP = "aux_no_overlap"
    AUX_NOT_GEOREFERENCED = "aux_not_georeferenced"
    AUX_NO_TIME_MATCH = "aux_no_time_match"
    AUX_UNREADABLE = "aux_unreadable"
    AUX_TOO_LARGE = "aux_too_large"
    AUX_WARP_FAILED = "aux_warp_failed"


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem. ``bands`` are 1-based source band numbers; ``where`` locates it (block, window, key)."""

    severity: Severity
    code: Code
    message: str
    bands: tuple[int, ...] = ()
    where: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = str(self.severity)
        d["code"] = str(self.code)
        d["bands"] = list(self.bands)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Issue:
        return cls(
            severity=Severity(d["severity"]),
            code=Code(d["code"]),
            message=d["message"],
            bands=tuple(d.get("bands", ())),
            where=d.get("where"),
        )


def error(code: Code, message: str, *, bands: Iterable[int] = (), where: str | None = None) -> Issue:
    return Issue(Severity.ERROR, code, message, tuple(bands), where)


def warning(code: Code, message: str, *, bands: Iterable[int] = (), where: str | None = None) -> Issue:
    return Issue(Severity.WARNING, code, message, tuple(bands), where)


@dataclass(slots=True)
class ValidationReport:
    """Everything validation found about one scene, plus what it learnt (shape, bands, stats)."""

    path: str
    issues: list[Issue] = field(default_factory=list)
    format: str | None = None
    shape: tuple[int, int, int] | None = None  # (band, y, x)
    dtype: str | None = None
    band_stats: dict[str, list[float | int | None]] | None = None
    blocks_checked: int = 0

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity is Severity.WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def extend(self, issues: Iterable[Issue]) -> None:
        """Add issues; one that does not say where it is gets the scene's path."""
        for i in issues:
            self.issues.append(i if i.where else Issue(i.severity, i.code, i.message, i.bands, self.path))

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "format": self.format,
            "shape": list(self.shape) if self.shape else None,
            "dtype": self.dtype,
            "blocks_checked": self.blocks_checked,
            "errors": [i.to_dict() for i in self.errors],
            "warnings": [i.to_dict() for i in self.warnings],
            "band_stats": self.band_stats,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ValidationReport:
        issues = [Issue.from_dict(i) for i in d.get("errors", []) + d.get("warnings", [])]
        shape = (int(d["shape"][0]), int(d["shape"][1]), int(d["shape"][2])) if d.get("shape") else None
        return cls(
            path=d["path"],
            issues=issues,
            format=d.get("format"),
            shape=shape,
            dtype=d.get("dtype"),
            band_stats=d.get("band_stats"),
            blocks_checked=d.get("blocks_checked", 0),
        )

    def summary(self) -> str:
        """A readable multi-line summary: a headline, then one line per problem."""
        head = "OK" if self.ok else "REJECTED"
        shape = "x".join(map(str, self.shape)) if self.shape else "?"
        lines = [
            f"{head}: {self.path} ({self.format or 'unknown format'}, (band,y,x)={shape}, {self.dtype or '?'}) "
            f"- {len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        ]
        for i in self.errors + self.warnings:
            loc = f" [{i.where}]" if i.where and i.where != self.path else ""
            lines.append(f"  {i.severity.value}: {i.code.value}: {i.message}{loc}")
        return "\n".join(lines)
