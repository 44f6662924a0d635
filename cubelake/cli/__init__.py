"""The ``cubelake`` command. Command bodies parse, call the library, render; nothing else.

Exit codes: 0 everything ok, 1 some scenes rejected, 2 usage error, 3 a job already running (jobs run),
130 interrupted.
"""

from __future__ import annotations

import sys

import typer

from . import ingest as _ingest
from . import lake as _lake
from . import predict as _predict
from . import profiles as _profiles
from . import sweep as _sweep
from ._render import QUIET, VERBOSE, configure_output
from .catalog import catalog_app
from .cube import cube_app
from .jobs import jobs_app
from .link import link_app
from .loader import loader_app
from .refs import refs_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="cubelake",
    help="Validate, calibrate and convert hyperspectral scenes into a lake of chunk-aligned COG, Zarr v3 and virtual-Zarr (kerchunk) products.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _global(verbose: int = VERBOSE, quiet: bool = QUIET) -> None:
    configure_output(verbose, quiet)


app.command("ingest")(_ingest.ingest_cmd)
app.command("validate")(_ingest.validate_cmd)
app.add_typer(_lake.lake_app, name="lake")
app.command("profiles")(_profiles.profiles_cmd)
app.add_typer(refs_app, name="refs")
app.add_typer(catalog_app, name="catalog")
app.add_typer(cube_app, name="cube")
app.add_typer(link_app, name="link")
app.add_typer(loader_app, name="loader")
app.add_typer(jobs_app, name="jobs")
app.command("predict")(_predict.predict_cmd)
app.command("sweep")(_sweep.sweep_cmd)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write(_ingest.INTERRUPTED + "\n")
        sys.exit(130)
