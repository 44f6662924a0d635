"""Datacubes on a common grid: scenes of one sensor reprojected onto one target grid, as native Zarr v3.

>>> from cubelake.datacube import CubeSettings, build_cube, open_cube
>>> res = build_cube("lake", "potsdam", ["scene_a", "scene_b"], settings=CubeSettings(crs="EPSG:3035", resolution=30))
>>> ds = open_cube("lake", "potsdam")        # data (time, band, y, x), float32, NaN where no scene has a value

``refs combine`` (:mod:`cubelake.refs.combine`) stacks scenes that already share one grid without
copying a byte; a datacube is for scenes that do not (other CRSs, resolutions or origins): every
scene is warped onto the cube's grid, block by block, and the cube is published in the lake under
``datacubes/<name>/`` with a STAC item (``cubelake cube list`` / ``show``). Policies:

* same sensor: equal band counts and centre wavelengths within a tolerance (1 nm), one unit;
* time axis: one step per acquisition instant; scenes of one instant are mosaicked, the first
  valid value (scenes in id order) winning (:mod:`.scenes`);
* grid: given or derived (:mod:`.grid`); values equal each scene warped alone onto it (:mod:`.warp`);
* atomic and idempotent: staged, then committed by one conditional write of ``item.json``; the same
  inputs and settings again are "up to date" (:mod:`.publish`, :mod:`.build`).

Import order inside the package: ``errors`` <- ``grid`` <- ``scenes`` <- ``warp``, ``writer`` <- ``item``
<- ``publish`` <- ``build``. The package sits above the core and the catalog (it selects scenes
with catalog searches and validates its items with the catalog's offline STAC schemas); nothing
below imports it, and it never imports the ingest.
"""

from __future__ import annotations

from .build import CUBE_FORMAT, CubePlan, CubeResult, CubeSettings, build_cube, plan_cube
from .errors import CubeSettingsError, DatacubeError, SensorMismatchError
from .grid import GridRequest, SceneExtent, TargetGrid, derive_grid, kernel_scale
from .item import EXT_DATACUBE, cube_item
from .publish import cube_zarr_url, list_cube_items, open_cube, read_cube_item, search_cube_items
from .scenes import CubeScene, TimeSlice, time_slices
from .warp import RESAMPLING, TOLERANCE_PX, warp_block

__all__ = [
    "CUBE_FORMAT",
    "EXT_DATACUBE",
    "RESAMPLING",
    "TOLERANCE_PX",
    "CubePlan",
    "CubeResult",
    "CubeScene",
    "CubeSettings",
    "CubeSettingsError",
    "DatacubeError",
    "GridRequest",
    "SceneExtent",
    "SensorMismatchError",
    "TargetGrid",
    "TimeSlice",
    "build_cube",
    "cube_item",
    "cube_zarr_url",
    "derive_grid",
    "kernel_scale",
    "list_cube_items",
    "open_cube",
    "plan_cube",
    "read_cube_item",
    "search_cube_items",
    "time_slices",
    "warp_block",
]
