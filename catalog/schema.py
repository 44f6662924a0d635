"""The catalog's schema: STAC versions, extension URLs, field names, media types and roles. No I/O.

Every field name the catalog writes or queries is spelled here once. ``cubelake:`` fields are
plain prefixed properties (STAC allows them without a published extension schema).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ASSET_MEDIA_TYPES",
    "BANDS",
    "CATALOG_ID",
    "CB_BAND_COUNT",
    "CB_CALIBRATION",
    "CB_CHUNK_SHAPE",
    "CB_CONFIG_HASH",
    "CB_CONTENT_HASH",
    "CB_COVERAGE",
    "CB_DATETIME_SOURCE",
    "CB_GEOHASH",
    "CB_PROFILE",
    "CB_QUALITY",
    "CB_VALIDATION",
    "EXTENSIONS",
    "GEOHASH_PRECISION",
    "PROMOTED",
    "STAC_VERSION",
    "source_media_type",
]

STAC_VERSION: Final = "1.1.0"
CATALOG_ID: Final = "cubelake"

EXT_EO: Final = "https://stac-extensions.github.io/eo/v2.0.0/schema.json"
EXT_PROJ: Final = "https://stac-extensions.github.io/projection/v2.0.0/schema.json"
EXT_RASTER: Final = "https://stac-extensions.github.io/raster/v2.0.0/schema.json"
EXT_FILE: Final = "https://stac-extensions.github.io/file/v2.1.0/schema.json"
EXT_VIEW: Final = "https://stac-extensions.github.io/view/v1.0.0/schema.json"
EXTENSIONS: Final = (EXT_EO, EXT_PROJ, EXT_RASTER, EXT_FILE)

# STAC 1.1 common metadata and extension fields
BANDS: Final = "bands"
EO_CENTER: Final = "eo:center_wavelength"  # micrometres, as the eo extension says
EO_FWHM: Final = "eo:full_width_half_max"  # micrometres
EO_CLOUD: Final = "eo:cloud_cover"
PROJ_CODE: Final = "proj:code"
PROJ_WKT2: Final = "proj:wkt2"
PROJ_SHAPE: Final = "proj:shape"
PROJ_TRANSFORM: Final = "proj:transform"
PROJ_BBOX: Final = "proj:bbox"
FILE_SIZE: Final = "file:size"
FILE_CHECKSUM: Final = "file:checksum"
RASTER_SCALE: Final = "raster:scale"
RASTER_OFFSET: Final = "raster:offset"

# cubelake fields
CB_PROFILE: Final = "cubelake:profile"
CB_CHUNK_SHAPE: Final = "cubelake:chunk_shape"  # (band, y, x) of one COG tile / Zarr chunk
CB_CALIBRATION: Final = "cubelake:calibration"
CB_VALIDATION: Final = "cubelake:validation"
CB_CONFIG_HASH: Final = "cubelake:config_hash"
CB_CONTENT_HASH: Final = "cubelake:content_hash"
CB_GEOHASH: Final = "cubelake:geohash6"  # compact precision-6 cover of the footprint
CB_COVERAGE: Final = "cubelake:wavelength_coverage_nm"
CB_BAND_COUNT: Final = "cubelake:band_count"
CB_QUALITY: Final = "cubelake:quality"  # mean share of valid pixels over the kept bands, 0..1
CB_DATETIME_SOURCE: Final = "cubelake:datetime_source"
CB_TREE_CHECKSUM: Final = "cubelake:tree_checksum"  # multihash over a directory asset's files
GEOHASH_PRECISION: Final = 6

# properties the index keeps as real (indexed) columns: property name -> column
PROMOTED: Final = {
    EO_CLOUD: "cloud_cover",
    CB_QUALITY: "quality",
    "gsd": "gsd",
    "platform": "platform",
}

ASSET_MEDIA_TYPES: Final = {
    "cog": "image/tiff; application=geotiff; profile=cloud-optimized",
    "zarr": "application/vnd+zarr; version=3",
    "refs_json": "application/json",
    "refs_parquet": "application/vnd.apache.parquet",
    "json": "application/json",
}
ASSET_ROLES: Final = {
    "source": ["data", "source"],
    "cog": ["data", "cloud-optimized"],
    "zarr": ["data", "zarr"],
    "refs": ["data", "references"],
    "labels": ["labels"],
    "scene": ["metadata"],
    "validation": ["metadata", "validation"],
}

_SOURCE_TYPES: Final = {
    "GTiff": "image/tiff; application=geotiff",
    "COG": "image/tiff; application=geotiff; profile=cloud-optimized",
    "ENVI": "application/x-envi",
    "netCDF": "application/netcdf",
    "HDF5": "application/x-hdf5",
    "MAT-v5": "application/x-matlab-data",
    "MAT-v7.3": "application/x-hdf5",
    "Landsat-MTL": "text/plain",  # the MTL file that names the band GeoTIFFs
}


def source_media_type(fmt: str) -> str:
    """Media type of a source by its reader's format name."""
    return _SOURCE_TYPES.get(fmt, "application/octet-stream")


def multihash_blake3(hex_digest: str) -> str:
    """A BLAKE3 hex digest as a multihash (``file:checksum``): code 0x1e, 32 bytes."""
    return "1e20" + hex_digest
