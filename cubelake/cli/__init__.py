"""The ``cubelake`` command. Command bodies parse, call the library, render; nothing else.

Exit codes: 0 everything ok, 1 some scenes rejected, 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import logging
import sys

import typer
from rich.logging import RichHandler

from . import ingest as _ingest
from . import lake as _lake
from . import profiles as _profiles

__all__ = ["app", "main"]

app = typer.Typer(
    name="cubelake",
    help="Validate, calibrate and convert hyperspectral scenes into a lake of chunk-aligned COG and Zarr v3 products.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _global(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (-v info, -vv debug)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only errors; no progress bars."),
) -> None:
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(
        level=level,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(show_time=False, show_path=False, console=_ingest.err_console())],
        force=True,
    )
    # GDAL's own warnings about odd TIFF tags are noise next to our reports; show them with -vv
    logging.getLogger("rasterio").setLevel(logging.DEBUG if verbose >= 2 else logging.ERROR)
    _ingest.STATE.quiet = quiet


app.command("ingest")(_ingest.ingest_cmd)
app.command("validate")(_ingest.validate_cmd)
app.command("lake")(_lake.lake_cmd)
app.command("profiles")(_profiles.profiles_cmd)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write(_ingest.INTERRUPTED + "\n")
        sys.exit(130)
