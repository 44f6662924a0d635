"""Resolve a scene's metadata and a sensor profile into what will be written. Pure, no I/O.

The result says which bands are kept (and why others are dropped), their wavelengths and
FWHM, the calibration coefficients and the stored encoding — or the errors that reject the
scene before any pixel is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cubelake.cube import CFEncoder, default_fill

from .calibrate import (
    SUPPORTED_DTYPES,
    BandSelection,
    CalibrationPlan,
    LinearCoder,
    broadcast,
)
from .profile import SensorProfile
from .report import Code, Issue, error, warning
from .sources import BandInfo, SceneMetadata
from .spectral import (
    bands_in_windows,
    check_fwhm,
    check_wavelengths,
    format_band_ranges,
    overlap_drops,
)

__all__ = ["ScenePlan", "build_plan"]


@dataclass(frozen=True, slots=True)
class ScenePlan:
    calibration: CalibrationPlan
    bands: tuple[BandInfo, ...]  # the product's bands; ``number`` is the 1-based source band number
    chunk: int
    profile: SensorProfile


def _spectral(meta: SceneMetadata, profile: SensorProfile, issues: list[Issue]) -> tuple[list[float | None], list[float | None]]:
    n = meta.count
    wl = meta.wavelengths_nm
    fw = meta.fwhm_nm
    sp = profile.spectral
    where = profile.origin or f"profile {profile.name}"
    if sp.band_table:
        for i, b in enumerate(meta.bands):
            if b.name in sp.band_table:
                wl[i], fw[i] = sp.band_table[b.name]
    if sp.wavelengths_nm is not None:
        if len(sp.wavelengths_nm) != n:
            issues.append(
                error(
                    Code.WAVELENGTH_COUNT,
                    f"the profile gives {len(sp.wavelengths_nm)} wavelengths for a {n}-band scene; "
                    "give exactly one per band",
                    where=sp.sidecar or where,
                )
            )
        else:
            wl = list(sp.wavelengths_nm)
            fw = list(sp.fwhm_nm) if sp.fwhm_nm is not None and len(sp.fwhm_nm) == n else [None] * n
    return wl, fw


def _explicit_removals(meta: SceneMetadata, profile: SensorProfile) -> set[int]:
    """1-based bands removed by index, name or the file's bbl (everything not wavelength-based)."""
    bb = profile.bad_bands
    out = {i for i in bb.indices if i <= meta.count}
    out |= {b.number for b in meta.bands if b.name in bb.names}
    if bb.use_file_bbl:
        out |= {b.number for b in meta.bands if b.flagged_bad}
    return out


def _selection(meta: SceneMetadata, profile: SensorProfile, wl: list[float | None], issues: list[Issue],
               seam: dict[int, str]) -> BandSelection:
    removed: dict[int, str] = dict(seam)
    bb = profile.bad_bands
    flagged = [b.number for b in meta.bands if b.flagged_bad]
    if flagged:
        issues.append(
            warning(
                Code.BANDS_FLAGGED_BAD,
                f"the file flags band(s) {format_band_ranges(flagged)} as bad (bbl=0)"
                + ("; they are removed" if bb.use_file_bbl else "; kept because the profile says use_file_bbl: false"),
                bands=flagged,
            )
        )
        if bb.use_file_bbl:
            for n in flagged:
                removed.setdefault(n, "file bbl")
    for i in bb.indices:
        if i > meta.count:
            issues.append(
                error(Code.PROFILE_MISMATCH, f"bad_bands.indices names band {i} but the scene has {meta.count} bands")
            )
        else:
            removed.setdefault(i, "profile index")
    names = {b.name: b.number for b in meta.bands if b.name}
    for name in bb.names:
        if name in names:
            removed.setdefault(names[name], f"profile name {name}")
    if all(w is not None for w in wl) and wl:
        windows = bb.windows()
        for i in bands_in_windows([float(w) for w in wl if w is not None], windows):
            removed.setdefault(i + 1, f"wavelength window {wl[i]:.1f} nm")
    keep = tuple(i for i in range(meta.count) if (i + 1) not in removed)
    if not keep:
        issues.append(
            error(
                Code.NO_BANDS_LEFT,
                f"bad-band removal drops all {meta.count} bands ({format_band_ranges(sorted(removed))}); "
                "relax bad_bands in the profile",
            )
        )
    return BandSelection(meta.count, keep, removed)


def _linear(meta: SceneMetadata, profile: SensorProfile, keep: tuple[int, ...], issues: list[Issue]) -> LinearCoder:
    cal = profile.calibration
    n = meta.count
    gains, offsets, source = [1.0] * n, [0.0] * n, "none"
    if cal.source == "file":
        if meta.calibrations:
            fc = meta.calibrations[0]
            gains, offsets, source = list(fc.gains), list(fc.offsets), fc.name
    elif cal.source != "none":
        named = meta.calibration(cal.source)
        if named is None:
            have = [c.name for c in meta.calibrations] or ["none"]
            issues.append(
                error(
                    Code.PROFILE_MISMATCH,
                    f"the profile asks for calibration {cal.source!r} but the file provides {have}",
                )
            )
        else:
            gains, offsets, source = list(named.gains), list(named.offsets), named.name
    try:
        if cal.gain is not None:
            gains, source = broadcast(cal.gain, n, 1.0, "calibration.gain"), "profile"
        if cal.offset is not None:
            offsets, source = broadcast(cal.offset, n, 0.0, "calibration.offset"), "profile"
    except ValueError as exc:
        issues.append(error(Code.PROFILE_MISMATCH, str(exc), where=profile.origin))
    gains = [g * cal.scale for g in gains]
    offsets = [o * cal.scale for o in offsets]
    if cal.scale != 1.0:
        source = f"{source} x scale {cal.scale:g}"
    bad = [i + 1 for i in keep if not (math.isfinite(gains[i]) and math.isfinite(offsets[i]) and gains[i] != 0)]
    if bad:
        names = [meta.bands[b - 1].name or str(b) for b in bad]
        issues.append(
            error(
                Code.PROFILE_MISMATCH,
                f"no usable {source} coefficients for band(s) {', '.join(names)} (missing, NaN or zero gain); "
                "drop them with bad_bands or choose another calibration source",
                bands=bad,
            )
        )
    negative = [i + 1 for i in keep if math.isfinite(gains[i]) and gains[i] < 0]
    if negative and not bad:
        issues.append(
            warning(
                Code.CALIBRATION_SUSPECT,
                f"the {source} gain of band(s) {format_band_ranges(negative)} is negative (first: band "
                f"{negative[0]}, gain {gains[negative[0] - 1]:g}): calibrated values fall as the signal rises, so "
                f"{cal.quantity or 'the values'} will be negative where the data is bright. Check the coefficients",
                bands=negative,
            )
        )
    return LinearCoder(tuple(gains[i] for i in keep), tuple(offsets[i] for i in keep), source)


def _encoding(meta: SceneMetadata, profile: SensorProfile, linear: LinearCoder, nodata: float | None,
              issues: list[Issue]) -> CFEncoder:
    enc = profile.encoding
    src_kind = np.dtype(meta.dtype).kind
    dtype: str = enc.dtype
    if dtype == "auto":
        dtype = meta.dtype if linear.is_identity and src_kind in "iu" else "float32"
    elif dtype == "source":
        if not linear.is_identity and src_kind in "iu":
            issues.append(
                error(
                    Code.PROFILE_MISMATCH,
                    f"encoding 'source' would store calibrated values as {meta.dtype}; use float32, or int16/uint16 "
                    "with a scale_factor",
                )
            )
        dtype = meta.dtype
    if np.dtype(dtype).kind == "f":
        return CFEncoder("float32" if dtype != "float64" else "float64", fill_value=math.nan)
    if dtype == meta.dtype and not (enc.scale_factor != 1.0 or enc.add_offset != 0.0) and linear.is_identity:
        fill = enc.fill_value if enc.fill_value is not None else nodata
        return CFEncoder(dtype, fill_value=fill)
    fill = enc.fill_value if enc.fill_value is not None else default_fill(dtype)
    return CFEncoder(dtype, enc.scale_factor, enc.add_offset, fill)


def build_plan(meta: SceneMetadata, profile: SensorProfile, *, chunk: int | None = None) -> tuple[ScenePlan | None, list[Issue]]:
    """Plan a scene's product from its metadata and a profile; ``None`` plus errors if it cannot be."""
    issues: list[Issue] = []
    if meta.dtype not in SUPPORTED_DTYPES:
        issues.append(
            error(
                Code.UNSUPPORTED_DTYPE,
                f"data type {meta.dtype} is not supported (supported: {', '.join(SUPPORTED_DTYPES)}); convert it, "
                "e.g. gdal_translate -ot Float32",
            )
        )
        return None, issues
    wl, fw = _spectral(meta, profile, issues)
    # bands dropped by name/index/bbl are not part of the spectral axis that must be ordered
    pre = _explicit_removals(meta, profile)
    seam: dict[int, str] = {}
    overlap = profile.spectral.overlap
    if overlap != "error" and wl and all(w is not None for w in wl) and len(wl) == meta.count:
        kept = [i for i in range(meta.count) if (i + 1) not in pre]
        keep = "later" if overlap == "drop-earlier" else "earlier"
        drops = overlap_drops([float(wl[i]) for i in kept], keep=keep)  # type: ignore[arg-type]
        seam = {kept[j] + 1: "spectrometer overlap" for j in drops or ()}
        if seam:
            other = "later" if keep == "later" else "earlier"
            issues.append(warning(
                Code.SPECTRAL_OVERLAP,
                f"band(s) {format_band_ranges(sorted(seam))} repeat wavelengths of the {other} detector at a "
                f"spectrometer seam (spectral.overlap: {overlap}); they are removed",
                bands=sorted(seam)))
    if any(w is not None for w in wl) or len(wl) != meta.count:
        ignore = frozenset(n - 1 for n in (*seam, *pre))
        issues.extend(check_wavelengths(wl, meta.count, where=meta.path, ignore=ignore))
    elif meta.count > 4:
        issues.append(
            warning(
                Code.NO_WAVELENGTHS,
                f"no wavelengths for the {meta.count} bands; spectral queries and wavelength-based bad-band removal "
                "cannot use this scene. Give them with --profile (a YAML profile or a CSV with a wavelength_nm column)",
            )
        )
    if all(w is not None for w in wl) and all(f is not None for f in fw) and wl:
        idx = [i for i in range(meta.count) if (i + 1) not in pre and (i + 1) not in seam]
        found = check_fwhm([float(wl[i]) for i in idx], [float(fw[i]) for i in idx], where=meta.path)  # type: ignore[arg-type]
        # check_fwhm numbers bands within the subset; map them back to source band numbers
        issues.extend(
            type(i)(i.severity, i.code, i.message, tuple(idx[b - 1] + 1 for b in i.bands), i.where) for i in found
        )
    if any(i.severity == "error" for i in issues):
        return None, issues
    selection = _selection(meta, profile, wl, issues, seam)
    linear = _linear(meta, profile, selection.keep, issues)
    nodata = profile.nodata if profile.nodata is not None else meta.nodata
    encoding = _encoding(meta, profile, linear, nodata, issues)
    if any(i.severity == "error" for i in issues):
        return None, issues
    cal = CalibrationPlan(
        source_dtype=meta.dtype,
        selection=selection,
        nodata=nodata,
        linear=linear,
        encoding=encoding,
        quantity=profile.calibration.quantity,
        unit=profile.calibration.unit or next((c.unit for c in meta.calibrations if c.name == linear.source), None),
    )
    bands = tuple(
        BandInfo(i + 1, meta.bands[i].name if meta.bands else None, wl[i], fw[i]) for i in selection.keep
    )
    return ScenePlan(cal, bands, effective_chunk(chunk or profile.products.chunk, meta.height, meta.width), profile), issues


def effective_chunk(requested: int, height: int, width: int) -> int:
    """The chunk (= COG tile) size used: the requested one, but never beyond the scene rounded up to 16.

    Zarr pads edge chunks to the full chunk shape, so a 256-pixel chunk on a 10x10 scene would
    store (and compress) 650x the data.
    """
    return min(requested, max(16, -(-max(height, width) // 16) * 16))
