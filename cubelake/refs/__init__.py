"""Virtual Zarr: kerchunk references from Zarr chunk keys to the tiles of (cloud-optimized) GeoTIFFs.

Importing this package registers the ``cubelake_tiff`` codec (and imagecodecs' codecs, which
references made by kerchunk/tifffile use) with numcodecs; the ``numcodecs.codecs`` entry point
does the same in processes that never import cubelake.
"""

from __future__ import annotations

from numcodecs.registry import register_codec

from .api import (
    build_refs,
    open_array,
    open_dataset,
    open_store,
    stat_target,
    tiff_layout,
    trusted_roots,
)
from .codec import TiffTileCodec
from .combine import combine_refs
from .formats import PARQUET_THRESHOLD, load_refs, write_refs
from .model import RefSet, Target
from .security import AllowedRoots

register_codec(TiffTileCodec)


def _register_imagecodecs() -> None:
    try:
        from imagecodecs.numcodecs import register_codecs
    except ImportError:  # pragma: no cover - imagecodecs is a dependency
        return
    register_codecs(verbose=False)


_register_imagecodecs()

__all__ = [
    "PARQUET_THRESHOLD",
    "AllowedRoots",
    "RefSet",
    "Target",
    "TiffTileCodec",
    "build_refs",
    "combine_refs",
    "load_refs",
    "open_array",
    "open_dataset",
    "open_store",
    "stat_target",
    "tiff_layout",
    "trusted_roots",
    "write_refs",
]
