"""Errors raised by cubelake.

Every error names the file it is about, what was received, what was expected and how to
fix it. Domain errors also inherit the matching built-in so callers can catch either.
"""

from __future__ import annotations

__all__ = [
    "CatalogError",
    "CatalogQueryError",
    "ConfigError",
    "ContentMismatchError",
    "CorruptIndexError",
    "CorruptItemError",
    "CorruptRecordError",
    "CubelakeError",
    "GridMismatchError",
    "ItemNotFoundError",
    "LakeError",
    "LakeFullError",
    "LinkEmulatorError",
    "NoCubeError",
    "NotReferenceableError",
    "ProfileError",
    "RecordVersionError",
    "RefsError",
    "SceneNotFoundError",
    "SceneReadError",
    "SceneRejectedError",
    "StaleReferenceError",
    "UnsupportedFormatError",
    "UntrustedTargetError",
]


class CubelakeError(Exception):
    """Base class of every error cubelake raises on purpose."""


class ConfigError(CubelakeError, ValueError):
    """An option or setting has a value cubelake cannot use."""


class ProfileError(ConfigError):
    """A sensor profile (YAML) is malformed or inconsistent."""


class SceneNotFoundError(CubelakeError, FileNotFoundError):
    """An input path does not exist."""


class UnsupportedFormatError(CubelakeError, ValueError):
    """An input exists but is not a format cubelake can read."""


class ContentMismatchError(UnsupportedFormatError):
    """A file's content is not what its name says (e.g. a JPEG named ``.TIF``)."""


class SceneReadError(CubelakeError, OSError):
    """Reading pixels or metadata from a scene failed."""


class NoCubeError(SceneReadError):
    """A container (e.g. a MATLAB file) holds no array that can be read as a cube."""


class SceneRejectedError(CubelakeError, ValueError):
    """Validation found errors; the report is attached as ``report``."""

    def __init__(self, message: str, report: object | None = None) -> None:
        super().__init__(message)
        self.report = report


class LakeError(CubelakeError, OSError):
    """The lake directory is unusable (not writable, foreign layout, newer format)."""


class LakeFullError(LakeError):
    """The device holding the lake has no space left (ENOSPC/EDQUOT); the message says where and how much."""


class CorruptRecordError(LakeError, ValueError):
    """A scene record (``scene.json``) cannot be read or is not a valid record; the message names the file."""


class RecordVersionError(LakeError):
    """A scene record was written by a newer cubelake (its ``format_version`` is higher than this one reads)."""


class NotReferenceableError(CubelakeError):
    """A file's layout or the scene's calibration cannot be served by kerchunk references as it is."""


class RefsError(CubelakeError):
    """A reference set is malformed, or cannot be opened as asked."""


class UntrustedTargetError(RefsError, PermissionError):
    """A reference points outside the allowed roots (the lake, and roots the user allowed)."""


class StaleReferenceError(RefsError, OSError):
    """A referenced file changed (size, mtime or ETag) since the references were made."""


class GridMismatchError(RefsError, ValueError):
    """Scenes cannot be stacked into one cube: their grids, bands or encodings differ."""


class CatalogError(CubelakeError):
    """The catalog (STAC JSON or its SQLite index) cannot do what was asked."""


class CatalogQueryError(CatalogError, ValueError):
    """A search is malformed: bad bbox, datetime, wavelength range, filter, sort key or property."""


class CorruptIndexError(CatalogError):
    """The catalog's SQLite index is damaged, empty or of another schema version: rebuild it from the items."""


class CorruptItemError(CatalogError, ValueError):
    """An item JSON file cannot be read or is not a STAC item."""


class ItemNotFoundError(CatalogError, KeyError):
    """No item with this id in the catalog."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class LinkEmulatorError(CubelakeError, OSError):
    """The link emulator cannot start or is used when not running (port in use, started twice)."""
