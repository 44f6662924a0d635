"""cubelake: a data lake for hyperspectral training data.

Import order (imports point one way; lower layers never import higher ones)::

    cubelake.errors, cubelake.grid      pure core (no I/O)
    cubelake.record                     the typed, versioned scene record (scene.json)
    cubelake.cube                       the cube spec and CF encoding every product shares
    cubelake.yamlsafe                   bounded YAML for untrusted files
    cubelake.linkemu                    an emulated network link (HTTP proxy) for S3 endpoints; errors only
    cubelake.lake                       the lake on disk (layout, atomic publish, locks)
    cubelake.products                   a scene's product as an analysis-ready xarray Dataset
    cubelake.refs                       kerchunk references (the core only; never the ingest, except
                                        build_refs reading a source file's metadata with its GDAL reader)
    cubelake.ingest                     readers, validation, calibration, COG/Zarr writers
    cubelake.catalog, cubelake.loaders  (later) catalog and PyTorch loaders
    cubelake.cli                        the command line (typer/rich live only here)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .products import open_dataset

__all__ = ["__version__", "open_dataset"]


def __getattr__(name: str) -> Any:
    """``cubelake.open_dataset`` is imported on first use: ``import cubelake.<anything>`` (the CLI) stays light."""
    if name == "open_dataset":
        from .products import open_dataset

        return open_dataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
