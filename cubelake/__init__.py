"""cubelake: a data lake for hyperspectral training data.

Import order (imports point one way; lower layers never import higher ones)::

    cubelake.errors, cubelake.grid      pure core (no I/O)
    cubelake.lake                       the lake on disk (layout, atomic publish, locks)
    cubelake.ingest                     readers, validation, calibration, COG/Zarr writers
    cubelake.catalog, cubelake.loaders  (later) catalog and PyTorch loaders
    cubelake.cli                        the command line (typer/rich live only here)
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
