"""Product kinds as the loader sees them, one per module, one interface (:class:`ChunkSource`).

* :mod:`.zarr` — a native Zarr v3 store; * :mod:`.refs` — kerchunk references to TIFF tiles;
* :mod:`.cog` — a tiled GeoTIFF (references built from its header).
"""

from ._base import ChunkSource, Decoder, Piece, ProductError
from .cog import open_cog
from .refs import open_refs
from .zarr import open_zarr

__all__ = ["ChunkSource", "Decoder", "Piece", "ProductError", "open_cog", "open_refs", "open_zarr"]
