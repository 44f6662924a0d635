"""When a scene was acquired: from its metadata, its file name (profile pattern) or the profile. Pure.

Every time is normalised to UTC ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``. A scene with no known time
gets ``source="unknown"``: its STAC item carries the widest honest interval (1970 to the
ingest time), and the catalog index never matches it to a datetime filter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import regex

from .profile import TimeRule

log = logging.getLogger(__name__)

__all__ = ["UNKNOWN_START", "AcquisitionTime", "acquisition_time", "format_time", "parse_time"]

UNKNOWN_START = "1970-01-01T00:00:00Z"
TimeSource = Literal["metadata", "filename", "profile", "unknown"]


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (date only, ``Z`` or offset, or naive = UTC) as an aware UTC datetime."""
    t = text.strip()
    if t.endswith(("Z", "z")):
        t = t[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(t)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an ISO 8601 date/time (e.g. 2022-07-24 or 2022-07-24T10:45:26Z)") from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class AcquisitionTime:
    """A nominal ``datetime`` and/or a ``start``–``end`` interval (UTC ISO strings), and where it came from."""

    datetime: str | None
    start: str | None
    end: str | None
    source: TimeSource

    def to_dict(self) -> dict[str, Any]:
        return {"datetime": self.datetime, "start_datetime": self.start, "end_datetime": self.end,
                "source": self.source}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AcquisitionTime:
        return cls(d.get("datetime"), d.get("start_datetime"), d.get("end_datetime"), d.get("source", "unknown"))


#: A profile's pattern is untrusted: a nested quantifier such as ``(a+)+$`` backtracks for hours on a
#: long name. The ``regex`` engine (same syntax as ``re``) can stop a search; ``re`` cannot.
PATTERN_TIMEOUT_S = 0.25


def _from_filename(name: str, pattern: str) -> AcquisitionTime | None:
    try:
        m = regex.search(pattern, name, timeout=PATTERN_TIMEOUT_S)
    except TimeoutError:
        log.warning("time.filename_pattern %r took over %.2f s on the name %r (catastrophic backtracking?); "
                    "it is not used for this scene", pattern, PATTERN_TIMEOUT_S, name)
        return None
    if m is None:
        return None
    g = {k: v for k, v in m.groupdict().items() if v is not None}
    try:
        if "doy" in g:
            year, doy = int(g["year"]), int(g["doy"])
            if not 1 <= doy <= (datetime(year + 1, 1, 1) - datetime(year, 1, 1)).days:
                raise ValueError(f"day of year {doy} is not in {year}")  # timedelta would roll into another year
            day = datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=doy - 1)
        else:
            day = datetime(int(g["year"]), int(g["month"]), int(g["day"]), tzinfo=UTC)
        if "hour" not in g:  # a date alone: the acquisition lies somewhere in that day
            return AcquisitionTime(None, format_time(day), format_time(day + timedelta(days=1, seconds=-1)), "filename")
        t = day.replace(hour=int(g["hour"]), minute=int(g.get("minute", 0)), second=int(g.get("second", 0)))
    except (KeyError, ValueError):
        # digits that are no date (month 13, day of year 400), or optional groups left unmatched:
        # the pattern did not really match
        return None
    return AcquisitionTime(format_time(t), None, None, "filename")


def acquisition_time(metadata_datetime: str | None, path: str, rule: TimeRule,
                     ingested_at: datetime | None = None) -> AcquisitionTime:
    """The scene's acquisition time; metadata wins over the file name, which wins over the profile."""
    if metadata_datetime:
        try:
            return AcquisitionTime(format_time(parse_time(metadata_datetime)), None, None, "metadata")
        except ValueError:
            pass  # an unparseable tag: fall through to the other sources
    for pattern in rule.filename_patterns:
        found = _from_filename(Path(path).name, pattern)
        if found is not None:
            return found
    if rule.datetime:
        return AcquisitionTime(format_time(parse_time(rule.datetime)), None, None, "profile")
    if rule.start_datetime and rule.end_datetime:
        return AcquisitionTime(None, format_time(parse_time(rule.start_datetime)),
                               format_time(parse_time(rule.end_datetime)), "profile")
    end = ingested_at or datetime.now(UTC)
    return AcquisitionTime(None, UNKNOWN_START, format_time(end.replace(microsecond=0)), "unknown")
