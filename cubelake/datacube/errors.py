"""What a datacube build raises on purpose (all :class:`~cubelake.errors.CubelakeError`)."""

from __future__ import annotations

from cubelake.errors import CubelakeError

__all__ = ["CubeSettingsError", "DatacubeError", "SensorMismatchError"]


class DatacubeError(CubelakeError, ValueError):
    """A datacube cannot be built from these scenes (missing, unusable, or not on one time axis)."""


class CubeSettingsError(DatacubeError):
    """An option of the build (name, CRS, resolution, bounds, chunking, resampling) cannot be used."""


class SensorMismatchError(DatacubeError):
    """The scenes are not from one sensor: their band counts or centre wavelengths differ."""
