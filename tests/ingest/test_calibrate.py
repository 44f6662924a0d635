"""Calibration coders and the plan built from metadata + profile (pure)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cubelake.cube import CFEncoder
from cubelake.ingest.calibrate import BandSelection, CalibrationPlan, LinearCoder
from cubelake.ingest.plan import build_plan, effective_chunk
from cubelake.ingest.profile import BadBands, Calibration, Encoding, SensorProfile, Spectral
from cubelake.ingest.report import Code
from cubelake.ingest.sources import BandInfo, FileCalibration, SceneMetadata


def meta(n: int = 4, dtype: str = "uint16", **kw: object) -> SceneMetadata:
    bands = kw.pop("bands", tuple(BandInfo(i + 1, wavelength_nm=500.0 + 100 * i, fwhm_nm=100.0) for i in range(n)))
    return SceneMetadata(path="scene.tif", files=("scene.tif",), format="GTiff", count=n, height=8, width=8,
                         dtype=dtype, bands=bands, **kw)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(
    hnp.arrays(np.float64, (3, 4, 5), elements=st.floats(-1.0, 2.0, allow_nan=False)),
)
def test_cf_int16_roundtrip_within_half_a_step(values: np.ndarray) -> None:
    enc = CFEncoder("int16", scale_factor=1e-4, add_offset=0.0, fill_value=-32768)
    stored, clipped = enc.encode(values)
    assert stored.dtype == np.int16
    assert clipped.sum() == 0
    back = enc.decode(stored)
    assert np.all(np.abs(back - values) <= 0.5e-4 + 1e-12)


def test_cf_encode_masks_nan_and_counts_clipping() -> None:
    enc = CFEncoder("int16", scale_factor=1e-4, fill_value=-32768)
    v = np.array([[[0.5, np.nan, 10.0, -10.0]]])
    stored, clipped = enc.encode(v)
    assert stored.tolist() == [[[5000, -32768, 32767, -32767]]]  # -32768 stays reserved for the fill
    assert clipped.tolist() == [2]
    assert np.isnan(enc.decode(stored)[0, 0, 1])


def test_linear_coder_inverse() -> None:
    lin = LinearCoder((0.5, 2.0), (1.0, -3.0))
    dn = np.arange(2 * 3 * 3).reshape(2, 3, 3)
    assert np.allclose(lin.encode(lin.decode(dn)), dn)
    assert not lin.is_identity
    assert LinearCoder((1.0, 1.0), (0.0, 0.0)).is_identity


def test_plan_apply_selects_masks_and_scales() -> None:
    plan = CalibrationPlan(
        source_dtype="uint16",
        selection=BandSelection(3, (0, 2), {2: "profile index"}),
        nodata=0.0,
        linear=LinearCoder((0.01, 0.02), (0.0, -1.0)),
        encoding=CFEncoder("float32", fill_value=math.nan),
    )
    raw = np.array([[[0, 100]], [[7, 7]], [[50, 0]]], dtype=np.uint16)
    stored, _ = plan.apply(raw)
    expected = np.array([[[np.nan, 1.0]], [[0.0, np.nan]]], dtype=np.float32)
    np.testing.assert_array_equal(stored, expected)


def test_plan_passthrough_keeps_integers_and_replaces_nodata_by_fill() -> None:
    plan = CalibrationPlan("int16", BandSelection(1, (0,)), -9999.0, LinearCoder((1.0,), (0.0,)),
                           CFEncoder("int16", fill_value=-9999.0))
    assert plan.passthrough
    raw = np.array([[[1, -9999, 3]]], dtype=np.int16)
    stored, _ = plan.apply(raw)
    assert stored.dtype == np.int16
    assert stored.tolist() == raw.tolist()


def test_plan_record_roundtrips() -> None:
    plan = CalibrationPlan("float32", BandSelection(4, (0, 1, 3), {3: "file bbl"}), -32768.0,
                           LinearCoder((1e-4, 1e-4, 1e-4), (0.0, 0.0, 0.0), "none x scale 0.0001"),
                           CFEncoder("int16", 1e-4, 0.0, -32768.0), "reflectance", "1")
    assert CalibrationPlan.from_dict(plan.to_dict()) == plan


def test_build_plan_generic_int_is_passthrough() -> None:
    plan, issues = build_plan(meta(4, "uint16", nodata=0.0), SensorProfile())
    assert plan is not None
    assert not [i for i in issues if i.severity == "error"]
    assert plan.calibration.passthrough
    assert plan.calibration.encoding == CFEncoder("uint16", fill_value=0.0)


def test_build_plan_removes_water_bands_by_default_and_records_why() -> None:
    bands = tuple(BandInfo(i + 1, wavelength_nm=w) for i, w in enumerate([1000.0, 1400.0, 1700.0, 1900.0, 2460.0]))
    plan, _ = build_plan(meta(5, "float32", bands=bands), SensorProfile())
    assert plan is not None
    assert [b.number for b in plan.bands] == [1, 3]
    assert plan.calibration.selection.removed == {2: "wavelength window 1400.0 nm", 4: "wavelength window 1900.0 nm",
                                                  5: "wavelength window 2460.0 nm"}


def test_build_plan_profile_gain_scale_and_int16_encoding() -> None:
    prof = SensorProfile(calibration=Calibration(gain=[2.0, 4.0], offset=1.0, scale=0.5),
                         bad_bands=BadBands(wavelength_windows_nm=[]),
                         encoding=Encoding(dtype="int16", scale_factor=0.01))
    plan, _ = build_plan(meta(2), prof)
    assert plan is not None
    assert plan.calibration.linear.gains == (1.0, 2.0)
    assert plan.calibration.linear.offsets == (0.5, 0.5)
    assert plan.calibration.encoding.dtype == "int16"


def test_build_plan_named_file_calibration_missing_is_an_error() -> None:
    prof = SensorProfile(calibration=Calibration(source="toa_reflectance"))
    plan, issues = build_plan(meta(2, calibrations=(FileCalibration("radiance", (1.0, 1.0), (0.0, 0.0)),)), prof)
    assert plan is None
    assert [i.code for i in issues] == [Code.PROFILE_MISMATCH]
    assert "'toa_reflectance'" in issues[0].message
    assert "radiance" in issues[0].message


def test_build_plan_profile_wavelength_count_must_match() -> None:
    prof = SensorProfile(spectral=Spectral(wavelengths_nm=[500.0, 600.0, 700.0]))
    plan, issues = build_plan(meta(4), prof)
    assert plan is None
    assert Code.WAVELENGTH_COUNT in [i.code for i in issues]


def test_build_plan_rejects_complex() -> None:
    plan, issues = build_plan(meta(1, "complex64"), SensorProfile())
    assert plan is None
    assert [i.code for i in issues] == [Code.UNSUPPORTED_DTYPE]


def test_build_plan_all_bands_removed_is_an_error() -> None:
    prof = SensorProfile(bad_bands=BadBands(indices=[1, 2]))
    plan, issues = build_plan(meta(2), prof)
    assert plan is None
    assert Code.NO_BANDS_LEFT in [i.code for i in issues]


@pytest.mark.parametrize(("req", "h", "w", "expected"), [(256, 10, 10, 16), (256, 32, 32, 32), (256, 100, 300, 256),
                                                          (64, 1000, 10, 64), (256, 33, 2, 48)])
def test_effective_chunk_never_exceeds_the_scene(req: int, h: int, w: int, expected: int) -> None:
    assert effective_chunk(req, h, w) == expected


def test_nodata_outside_the_dtype_never_matches() -> None:
    plan = CalibrationPlan("uint16", BandSelection(1, (0,)), -9999.0, LinearCoder((1.0,), (0.0,)),
                           CFEncoder("float32", fill_value=math.nan))
    raw = np.array([[[0, 65535, 7]]], dtype=np.uint16)
    stored, _ = plan.apply(raw)
    assert stored.tolist() == [[[0.0, 65535.0, 7.0]]]


# -- CalibrationPlan against a band-by-band oracle -------------------------------------------------------


@st.composite
def _plans(draw: st.DrawFn) -> tuple[CalibrationPlan, np.ndarray]:
    n = draw(st.integers(1, 40))  # more than one group of 16 bands
    dtype = draw(st.sampled_from(["uint16", "int16", "float32"]))
    keep = tuple(draw(st.permutations(range(n)))[: draw(st.integers(1, n))])  # any subset, in any order
    nodata = draw(st.sampled_from([None, 0.0, 7.0] + ([math.nan, -9999.0] if dtype != "uint16" else [])))
    kind = draw(st.sampled_from(["passthrough", "linear-float", "linear-int16"]))
    gains = tuple(draw(st.floats(0.5, 3.0)) for _ in keep) if kind != "passthrough" else (1.0,) * len(keep)
    offsets = tuple(draw(st.floats(-5.0, 5.0)) for _ in keep) if kind != "passthrough" else (0.0,) * len(keep)
    fill = draw(st.sampled_from([nodata, None, 0.0, 7.0]))  # the stored fill need not be the source's nodata
    enc = {"passthrough": CFEncoder(dtype, fill_value=fill),
           "linear-float": CFEncoder("float32"),
           "linear-int16": CFEncoder("int16", scale_factor=0.05, add_offset=-3.0, fill_value=-32768)}[kind]
    plan = CalibrationPlan(dtype, BandSelection(n, keep), nodata, LinearCoder(gains, offsets), enc)
    raw = draw(hnp.arrays(np.dtype(dtype), (n, 3, 4), elements=st.integers(0, 9) if dtype != "float32" else
                          st.sampled_from([0.0, 1.5, 7.0, -9999.0, math.nan, math.inf, 3.25])))
    return plan, raw


def _oracle(plan: CalibrationPlan, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Band by band, pixel by pixel in float64: mask, gain/offset, then the stored encoding."""
    enc = plan.encoding
    out = np.empty((len(plan.selection.keep), *raw.shape[1:]), np.dtype(enc.dtype))
    clipped = np.zeros(len(plan.selection.keep), np.int64)
    for b, src in enumerate(plan.selection.keep):
        for y, x in np.ndindex(*raw.shape[1:]):
            dn = float(raw[src, y, x])
            bad = not math.isfinite(dn) or (plan.nodata is not None and dn == plan.nodata)
            value = math.nan if bad else plan.linear.gains[b] * dn + plan.linear.offsets[b]
            if plan.passthrough:  # the source values, the fill value where they are missing
                out[b, y, x] = enc.fill_value if bad and enc.fill_value is not None else raw[src, y, x]
            elif enc.dtype == "float32":
                out[b, y, x] = value
            elif bad:
                out[b, y, x] = enc.fill_value
            else:
                q = round((value - enc.add_offset) / enc.scale_factor)
                clipped[b] += not -32767 <= q <= 32767  # -32768 is the fill value
                out[b, y, x] = min(32767, max(-32767, q))
    return out, clipped


@settings(max_examples=80, deadline=None)
@given(_plans())
def test_apply_and_valid_pixels_equal_a_band_by_band_oracle(case: tuple[CalibrationPlan, np.ndarray]) -> None:
    plan, raw = case
    want, want_clipped = _oracle(plan, raw)
    got, clipped = plan.apply(raw)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype
    assert clipped.tolist() == want_clipped.tolist()
    valid = np.zeros(raw.shape[1:], bool)
    for src in plan.selection.keep:
        v = np.isfinite(raw[src].astype(np.float64))
        if plan.nodata is not None and not math.isnan(plan.nodata):
            v &= raw[src] != plan.nodata
        valid |= v
    pixels = plan.valid_pixels(raw)
    if valid.all():
        assert pixels is None
    else:
        np.testing.assert_array_equal(pixels, valid)
    with pytest.raises(ValueError, match=f"expected {raw.shape[0]} source bands, got {raw.shape[0] + 1}"):
        plan.apply(np.concatenate([raw, raw[:1]]))
    with pytest.raises(ValueError, match=f"expected {raw.shape[0]} source bands, got {raw.shape[0] - 1}"):
        plan.apply(raw[:-1])


def _plan(**kw: object) -> CalibrationPlan:
    base: dict[str, object] = {"source_dtype": "int16", "selection": BandSelection(3, (0, 1, 2)), "nodata": -1.0,
                               "linear": LinearCoder((1.0,) * 3, (0.0,) * 3),
                               "encoding": CFEncoder("int16", fill_value=-1.0)}
    return CalibrationPlan(**{**base, **kw})  # type: ignore[arg-type]


def test_as_reference_says_what_a_reference_cannot_express() -> None:
    assert _plan().as_reference() == (CFEncoder("int16", 1.0, 0.0, -1.0), None)
    scaled = _plan(linear=LinearCoder((0.5,) * 3, (2.0,) * 3),
                   encoding=CFEncoder("int16", scale_factor=0.5, add_offset=2.0, fill_value=-1.0))
    assert scaled.as_reference() == (CFEncoder("int16", 0.5, 2.0, -1.0), None)
    for plan, why in [
        (_plan(selection=BandSelection(3, (0, 2), {2: "bbl"})), "removes bands (2)"),
        (_plan(linear=LinearCoder((1.0, 2.0, 1.0), (0.0,) * 3)), "per-band gain/offset"),
        (_plan(linear=LinearCoder((1.0,) * 3, (0.0, 1.0, 0.0))), "per-band gain/offset"),
        (_plan(encoding=CFEncoder("float32")), "stores float32 values from int16"),
        (_plan(linear=LinearCoder((0.5,) * 3, (0.0,) * 3), encoding=CFEncoder("int16", 0.25, 0.0, -1.0)),
         "gain 0.5, offset 0 into scale_factor 0.25"),
        (_plan(linear=LinearCoder((1.0,) * 3, (2.0,) * 3), encoding=CFEncoder("int16", 1.0, 1.0, -1.0)),
         "offset 2 into scale_factor 1, add_offset 1"),
    ]:
        enc, reason = plan.as_reference()
        assert enc is None
        assert reason is not None
        assert why in reason


def test_broadcast_gives_one_value_per_band() -> None:
    from cubelake.ingest.calibrate import broadcast

    assert broadcast(None, 3, 1.5, "gain") == [1.5, 1.5, 1.5]
    assert broadcast(2, 2, 1.0, "gain") == [2.0, 2.0]
    assert broadcast([1, 2, 3], 3, 1.0, "gain") == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="gain has 2 values for 3 bands"):
        broadcast([1, 2], 3, 1.0, "gain")


def test_the_calibration_records_are_immutable() -> None:
    import dataclasses

    plan = _plan()
    for obj, field in [(plan, "nodata"), (plan.selection, "keep"), (plan.linear, "gains"), (plan.encoding, "dtype")]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)


def test_valid_pixels_are_valid_in_any_kept_band_across_band_groups() -> None:
    raw = np.zeros((20, 1, 3), np.uint16)  # nodata 0 everywhere, then:
    raw[0, 0, 0] = raw[18, 0, 0] = 5  # valid in the first group of 16 bands and in the second
    raw[18, 0, 1] = 5  # valid in the second group only
    plan = _plan(source_dtype="uint16", selection=BandSelection(20, tuple(range(20))), nodata=0.0,
                 linear=LinearCoder((1.0,) * 20, (0.0,) * 20), encoding=CFEncoder("uint16", fill_value=0.0))
    pixels = plan.valid_pixels(raw)
    assert pixels is not None
    assert pixels.tolist() == [[True, True, False]]


@pytest.mark.parametrize(("nodata", "fill"), [(7.0, 0.0), (0.0, 7.0), (7.0, 7.0), (None, 0.0), (7.0, None)])
def test_passthrough_stores_the_fill_value_where_the_source_has_nodata(nodata: float | None, fill: float | None) -> None:
    raw = np.array([[[0, 7, 3]], [[7, 7, 1]]], np.uint16)
    plan = _plan(source_dtype="uint16", selection=BandSelection(2, (0, 1)), nodata=nodata,
                 linear=LinearCoder((1.0, 1.0), (0.0, 0.0)), encoding=CFEncoder("uint16", fill_value=fill))
    assert plan.passthrough
    want = raw.copy()
    if nodata is not None and fill is not None:
        want[raw == nodata] = fill
    np.testing.assert_array_equal(plan.apply(raw)[0], want)
