"""Acquisition time: metadata, then the profile's file-name pattern, then the profile's fixed time."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from cubelake.errors import ProfileError
from cubelake.ingest.acqtime import (
    UNKNOWN_START,
    AcquisitionTime,
    acquisition_time,
    format_time,
    parse_time,
)
from cubelake.ingest.profile import TimeRule, load_profile

AVIRIS = load_profile("aviris-ng-radiance").time
LANDSAT8 = load_profile("landsat8-oli").time
DATE_ONLY = TimeRule(filename_pattern=r"_(?P<year>\d{4})(?P<month>\d{2})(?P<day>\d{2})_")
INGESTED = datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def test_bundled_profiles_carry_the_patterns() -> None:
    assert AVIRIS.filename_pattern is not None
    assert "(?P<hour>" in AVIRIS.filename_pattern
    assert any("(?P<doy>" in p for p in LANDSAT8.filename_patterns)  # pre-collection scene ids
    assert any("(?P<month>" in p for p in LANDSAT8.filename_patterns)  # collection product ids


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("LC81060712016134LGN00_MTL.txt", "2016-05-13T00:00:00Z"),
        ("LC08_L1TP_106071_20160513_20200907_02_T1_MTL.txt", "2016-05-13T00:00:00Z"),
        ("LT05_L1TP_224063_19880814_20200917_02_T1_MTL.txt", None),  # a Landsat 5 name: not this profile's
    ],
)
def test_landsat8_names_of_both_id_schemes(name: str, start: str | None) -> None:
    found = acquisition_time(None, name, LANDSAT8)
    assert found.start == start if start else found.source == "unknown"


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ("2022-07-24T10:45:26Z", "2022-07-24T10:45:26Z"),
        ("2022-07-24T10:45:26", "2022-07-24T10:45:26Z"),  # naive = UTC
        ("2022-07-24T12:45:26+02:00", "2022-07-24T10:45:26Z"),
        ("2022-07-24T10:45:26.5z", "2022-07-24T10:45:26.500000Z"),
        ("2022-07-24", "2022-07-24T00:00:00Z"),
        (" 2022-07-24T10:45:26Z ", "2022-07-24T10:45:26Z"),
    ],
)
def test_metadata_wins_over_file_name_and_profile(metadata: str, expected: str) -> None:
    rule = TimeRule(filename_pattern=AVIRIS.filename_pattern, datetime="2000-01-01T00:00:00Z")
    got = acquisition_time(metadata, "/data/ang20160910t185702_rdn_v2", rule, INGESTED)
    assert got == AcquisitionTime(expected, None, None, "metadata")


def test_unparseable_metadata_falls_through_to_the_file_name() -> None:
    got = acquisition_time("sometime in July", "ang20160910t185702_rdn", AVIRIS, INGESTED)
    assert got == AcquisitionTime("2016-09-10T18:57:02Z", None, None, "filename")


@pytest.mark.parametrize("metadata", [None, ""])
def test_no_metadata_uses_the_file_name(metadata: str | None) -> None:
    got = acquisition_time(metadata, "/flights/2016/ang20160910t185702_rdn_v1.img", AVIRIS, INGESTED)
    assert got == AcquisitionTime("2016-09-10T18:57:02Z", None, None, "filename")
    assert got.source == "filename"


def test_only_the_file_name_is_searched_not_the_directories() -> None:
    got = acquisition_time(None, "/flights/ang20160910t185702/radiance.img", AVIRIS, INGESTED)
    assert got.source == "unknown"


@pytest.mark.parametrize(
    ("name", "start", "end"),
    [
        ("S2_20220724_T33UUP.tif", "2022-07-24T00:00:00Z", "2022-07-24T23:59:59Z"),
        ("scene_20241231_x.tif", "2024-12-31T00:00:00Z", "2024-12-31T23:59:59Z"),
        ("scene_20240229_x.tif", "2024-02-29T00:00:00Z", "2024-02-29T23:59:59Z"),
    ],
)
def test_date_only_pattern_means_that_whole_day(name: str, start: str, end: str) -> None:
    got = acquisition_time(None, name, DATE_ONLY, INGESTED)
    assert got == AcquisitionTime(None, start, end, "filename")


@pytest.mark.parametrize(
    ("name", "start", "end"),
    [
        # 2016 is a leap year: day 134 is 13 May
        ("LC81060712016134LGN00_B1.TIF", "2016-05-13T00:00:00Z", "2016-05-13T23:59:59Z"),
        ("LC81060712016134LGN00_MTL.txt", "2016-05-13T00:00:00Z", "2016-05-13T23:59:59Z"),
        ("LC80440342017001LGN00", "2017-01-01T00:00:00Z", "2017-01-01T23:59:59Z"),
        ("LC80440342016366LGN00", "2016-12-31T00:00:00Z", "2016-12-31T23:59:59Z"),
        ("LC80440342015365LGN00", "2015-12-31T00:00:00Z", "2015-12-31T23:59:59Z"),
    ],
)
def test_day_of_year_pattern(name: str, start: str, end: str) -> None:
    got = acquisition_time(None, name, LANDSAT8, INGESTED)
    assert got == AcquisitionTime(None, start, end, "filename")


@pytest.mark.parametrize(
    ("rule", "name"),
    [
        (DATE_ONLY, "scene_20221345_x.tif"),  # month 13
        (DATE_ONLY, "scene_20220230_x.tif"),  # 30 February
        (DATE_ONLY, "scene_20220700_x.tif"),  # day 0
        (AVIRIS, "ang20160910t255702_rdn"),  # hour 25
        (AVIRIS, "ang20160910t186102_rdn"),  # minute 61
        (LANDSAT8, "LC80440342015366LGN00"),  # 2015 has 365 days
        (LANDSAT8, "LC80440342016400LGN00"),  # day of year 400
        (LANDSAT8, "LC80440342016000LGN00"),  # day of year 0
    ],
)
def test_digits_that_are_no_date_fall_through(rule: TimeRule, name: str) -> None:
    got = acquisition_time(None, name, rule, INGESTED)
    assert got.source == "unknown"
    fixed = rule.model_copy(update={"datetime": "2021-03-04T05:06:07Z"})
    assert acquisition_time(None, name, fixed, INGESTED) == AcquisitionTime(
        "2021-03-04T05:06:07Z", None, None, "profile"
    )


def test_optional_groups_left_unmatched_fall_through() -> None:
    rule = TimeRule(filename_pattern=r"_(?P<year>\d{4})(?:(?P<month>\d{2})(?P<day>\d{2}))?_")
    assert acquisition_time(None, "x_20220724_y", rule, INGESTED).start == "2022-07-24T00:00:00Z"
    assert acquisition_time(None, "x_2022_y", rule, INGESTED).source == "unknown"


def test_pattern_with_hour_only_sets_minutes_and_seconds_to_zero() -> None:
    rule = TimeRule(filename_pattern=r"(?P<year>\d{4})(?P<month>\d{2})(?P<day>\d{2})h(?P<hour>\d{2})")
    got = acquisition_time(None, "img_20220724h09.tif", rule, INGESTED)
    assert got == AcquisitionTime("2022-07-24T09:00:00Z", None, None, "filename")


def test_no_match_falls_through_to_the_profile() -> None:
    rule = TimeRule(filename_pattern=AVIRIS.filename_pattern, datetime="2020-05-01T10:00:00")
    got = acquisition_time(None, "f180601t01p00r02_sc01.img", rule, INGESTED)
    assert got == AcquisitionTime("2020-05-01T10:00:00Z", None, None, "profile")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2020-05-01T10:00:00", "2020-05-01T10:00:00Z"),
        ("2020-05-01T10:00:00Z", "2020-05-01T10:00:00Z"),
        ("2020-05-01T12:00:00+02:00", "2020-05-01T10:00:00Z"),
        ("2020-05-01", "2020-05-01T00:00:00Z"),
    ],
)
def test_profile_fixed_datetime(value: str, expected: str) -> None:
    got = acquisition_time(None, "whatever.tif", TimeRule(datetime=value), INGESTED)
    assert got == AcquisitionTime(expected, None, None, "profile")


def test_profile_start_and_end() -> None:
    rule = TimeRule(start_datetime="2020-05-01", end_datetime="2020-05-31T23:59:59+00:00")
    got = acquisition_time(None, "whatever.tif", rule, INGESTED)
    assert got == AcquisitionTime(None, "2020-05-01T00:00:00Z", "2020-05-31T23:59:59Z", "profile")


def test_profile_fixed_datetime_wins_over_start_and_end() -> None:
    rule = TimeRule(datetime="2020-05-10T00:00:00Z", start_datetime="2020-05-01", end_datetime="2020-05-31")
    assert acquisition_time(None, "x.tif", rule, INGESTED).datetime == "2020-05-10T00:00:00Z"


def test_unknown_time_is_1970_to_ingest() -> None:
    got = acquisition_time(None, "/data/x.tif", TimeRule(), INGESTED)
    assert got == AcquisitionTime(None, "1970-01-01T00:00:00Z", "2024-01-02T03:04:05Z", "unknown")
    assert UNKNOWN_START == "1970-01-01T00:00:00Z"


def test_unknown_time_without_ingest_time_ends_now() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    got = acquisition_time(None, "/data/x.tif", TimeRule())
    after = datetime.now(UTC)
    assert got.source == "unknown"
    assert got.start == UNKNOWN_START
    assert got.end is not None
    assert got.end.endswith("Z")
    assert before <= parse_time(got.end) <= after


def test_to_dict_round_trip() -> None:
    t = AcquisitionTime(None, "2020-05-01T00:00:00Z", "2020-05-31T23:59:59Z", "profile")
    assert t.to_dict() == {"datetime": None, "start_datetime": "2020-05-01T00:00:00Z",
                           "end_datetime": "2020-05-31T23:59:59Z", "source": "profile"}
    assert AcquisitionTime.from_dict(t.to_dict()) == t
    assert AcquisitionTime.from_dict({}) == AcquisitionTime(None, None, None, "unknown")


def test_parse_and_format_time() -> None:
    assert parse_time("2022-07-24T12:45:26+02:00") == datetime(2022, 7, 24, 10, 45, 26, tzinfo=UTC)
    assert format_time(datetime(2022, 7, 24, 10, 45, 26, 5, tzinfo=UTC)) == "2022-07-24T10:45:26.000005Z"
    with pytest.raises(ValueError, match="'July' is not an ISO 8601 date/time"):
        parse_time("July")


# --- TimeRule validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"filename_pattern": "ang(?P<year>\\d{4}"}, "not a valid regular expression"),
        ({"filename_pattern": "(?P<year>\\d{4})"}, "needs named groups year and month+day (or doy)"),
        ({"filename_pattern": "(?P<year>\\d{4})(?P<month>\\d{2})"}, "needs named groups"),
        ({"filename_pattern": "(?P<month>\\d{2})(?P<day>\\d{2})"}, "needs named groups"),
        ({"filename_pattern": "(\\d{4})(\\d{3})"}, "has none"),
        ({"start_datetime": "2020-01-01"}, "give both start_datetime and end_datetime"),
        ({"end_datetime": "2020-01-01"}, "give both start_datetime and end_datetime"),
        ({"unknown_key": 1}, "Extra inputs are not permitted"),
    ],
)
def test_time_rule_validation(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        TimeRule(**kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "pattern",
    [
        "(?P<year>\\d{4})(?P<month>\\d{2})(?P<day>\\d{2})",
        "(?P<year>\\d{4})(?P<doy>\\d{3})",
        "(?P<year>\\d{4})(?:(?P<doy>\\d{3})|(?P<month>\\d{2})(?P<day>\\d{2}))",
    ],
)
def test_time_rule_accepts_valid_patterns(pattern: str) -> None:
    assert TimeRule(filename_pattern=pattern).filename_pattern == pattern


@pytest.mark.parametrize(
    ("time_yaml", "fragments"),
    [
        ("  filename_pattern: '(?P<year>\\d{4'\n", ["time.filename_pattern", "not a valid regular expression"]),
        ("  filename_pattern: '(?P<year>\\d{4})_x'\n", ["time.filename_pattern", "needs named groups"]),
        ("  start_datetime: '2020-01-01'\n", ["time", "give both start_datetime and end_datetime"]),
    ],
)
def test_load_profile_reports_bad_time_rules(tmp_path: Path, time_yaml: str, fragments: list[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ntime:\n" + time_yaml)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message
    assert "invalid profile" in message
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value, ValueError)


def test_load_profile_reads_a_time_rule(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("name: ok\ntime:\n  filename_pattern: '_(?P<year>\\d{4})(?P<doy>\\d{3})_'\n")
    rule = load_profile(path).time
    assert acquisition_time(None, "x_2016134_y.tif", rule, INGESTED).start == "2016-05-13T00:00:00Z"


@pytest.mark.serial  # a time bound: run alone
def test_a_runaway_filename_pattern_is_stopped_not_hung(caplog) -> None:
    import logging
    import time

    from cubelake.ingest.acqtime import acquisition_time
    from cubelake.ingest.profile import TimeRule

    rule = TimeRule(filename_pattern=r"(?P<year>\d{4})(?P<month>\d\d)(?P<day>\d\d)(a|aa)+$")
    name = "20220724" + "a" * 60 + "!.tif"  # exponential backtracking: hours, with re or regex
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="cubelake.ingest.acqtime"):
        acq = acquisition_time(None, f"/d/{name}", rule, datetime(2026, 1, 1, tzinfo=UTC))
    assert time.perf_counter() - t0 < 5
    assert acq.source == "unknown"
    assert "catastrophic backtracking" in caplog.text
