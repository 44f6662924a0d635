"""The catalog's schema: STAC versions, extension URLs, field names, media types and roles. No I/O.

Every field name the catalog writes or queries is spelled here once. ``cubelake:`` fields are
plain prefixed properties (STAC allows them without a published extension schema).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ASSET_MEDIA_TYPES",
    "AZIMUTHS",
    "BANDS",
    "CATALOG_ID",
    "CB_AUX_ARRAYS",
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
    "DATA_TYPES",
    "EXTENSIONS",
    "EXTENSION_PREFIXES",
    "GEOHASH_PRECISION",
    "PROMOTED",
    "PROPERTY_RANGES",
    "STAC_VERSION",
    "source_media_type",
]

STAC_VERSION: Final = "1.1.0"
CATALOG_ID: Final = "cubelake"

EXT_EO: Final = "https://stac-extensions.github.io/eo/v2.0.0/schema.json"
EXT_PROJ: Final = "https://stac-extensions.github.io/projection/v2.0.0/schema.json"
EXT_RASTER: Final = "https://stac-extensions.github.io/raster/v2.0.0/schema.json"
EXT_FILE: Final = "https://stac-extensions.github.io/file/v2.1.0/schema.json"
EXT_VIEW: Final = "https://stac-extensions.github.io/view/v1.1.0/schema.json"
EXTENSIONS: Final = (EXT_EO, EXT_PROJ, EXT_RASTER, EXT_FILE, EXT_VIEW)
#: An object declares exactly the extensions whose field prefixes it uses (each has a bundled schema).
EXTENSION_PREFIXES: Final = {"eo": EXT_EO, "proj": EXT_PROJ, "raster": EXT_RASTER, "file": EXT_FILE, "view": EXT_VIEW}

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
#: STAC 1.1 ``data_type`` values (data-values.json)
DATA_TYPES: Final = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                               "float32", "float64", "cint16", "cint32", "cfloat32", "cfloat64", "other"})
#: properties whose extension bounds their value (a value outside is left out of the item)
PROPERTY_RANGES: Final = {EO_CLOUD: (0.0, 100.0), "eo:snow_cover": (0.0, 100.0), "view:off_nadir": (0.0, 90.0),
                          "view:incidence_angle": (0.0, 90.0), "view:sun_elevation": (-90.0, 90.0),
                          "view:moon_elevation": (0.0, 90.0)}
#: angles the view extension wants in 0..360 (Landsat gives -180..180): taken modulo 360
AZIMUTHS: Final = frozenset({"view:azimuth", "view:sun_azimuth", "view:moon_azimuth"})

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
CB_AUX_ARRAYS: Final = "cubelake:aux_arrays"  # on the Zarr asset: its aux_<name> arrays beside "data"
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
    "png": "image/png",
}
ASSET_ROLES: Final = {
    "source": ["data", "source"],
    "cog": ["data", "cloud-optimized"],
    "zarr": ["data", "zarr"],
    "refs": ["data", "references"],
    "labels": ["labels"],
    # an aux raster warped onto the scene grid: data, but not the cube (STAC roles are free text; the
    # best practices list none for it). Readers of the cube's bands skip "auxiliary" assets.
    "aux": ["data", "auxiliary"],
    "scene": ["metadata"],
    "validation": ["metadata", "validation"],
    "thumbnail": ["thumbnail"],  # the best practices' role for a small preview image
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
