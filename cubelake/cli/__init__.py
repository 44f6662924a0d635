"""The ``cubelake`` command. Command bodies parse, call the library, render; nothing else.

Exit codes: 0 everything ok, 1 some scenes rejected, 2 usage error, 3 a job already running (jobs run),
130 interrupted.

Subcommands load lazily: ``cubelake --help`` lists them from :data:`COMMANDS` (name, module, short help)
without importing any; ``cubelake NAME ...`` imports the one module NAME lives in. The CLI modules import
the library (numpy, rasterio, zarr, ...) inside their command bodies, so a subcommand's ``--help`` is quick too.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

from ._render import QUIET, VERBOSE, configure_output

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter  # typer's own copy of click

__all__ = ["COMMANDS", "app", "main"]


@dataclass(frozen=True, slots=True)
class LazyCommand:
    """Where a subcommand lives (``cubelake.cli.<module>.<attr>``: a command function or a ``typer.Typer``), and
    the first paragraph of its help, shown by ``cubelake --help`` without importing the module."""

    module: str
    attr: str
    help: str

    def load(self, name: str) -> Command:
        """The click command, exactly as ``app.command(name)`` / ``app.add_typer(..., name=name)`` would build it."""
        obj = getattr(importlib.import_module(f"{__name__}.{self.module}"), self.attr)
        if isinstance(obj, typer.Typer):
            group = typer.main.get_group(obj)
            group.name = name
            return group
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        single.command(name)(obj)
        return typer.main.get_command(single)


#: The subcommands in the order ``cubelake --help`` lists them (typer lists commands before groups).
COMMANDS: dict[str, LazyCommand] = {
    "ingest": LazyCommand("ingest", "ingest_cmd",
                          "Validate, calibrate and convert scenes into the lake (COG, Zarr v3 and/or kerchunk "
                          "references)."),
    "validate": LazyCommand("ingest", "validate_cmd",
                            "Run every check (every block is decoded) without writing any product."),
    "profiles": LazyCommand("profiles", "profiles_cmd",
                            "List the bundled sensor profiles (use a name with --profile, or copy a file to adapt "
                            "it)."),
    "predict": LazyCommand("predict", "predict_cmd",
                           "Predict whole scenes tile by tile and publish each map (COG + Zarr + STAC item) in the "
                           "lake."),
    "sweep": LazyCommand("sweep", "sweep_cmd",
                         "Time a model over batch sizes: ms/sample, elasticity, the plateau, the OOM wall and the "
                         "memory model."),
    "lake": LazyCommand("lake", "lake_app", "What a lake holds; gc and copy."),
    "refs": LazyCommand("refs", "refs_app", "Kerchunk references: virtual Zarr over (cloud-optimized) GeoTIFF tiles."),
    "catalog": LazyCommand("catalog", "catalog_app",
                           "The lake's STAC catalog: search by space, time, wavelength and properties."),
    "cube": LazyCommand("cube", "cube_app",
                        "Datacubes: scenes of one sensor reprojected onto one grid, as native Zarr v3 (refs combine "
                        "stacks scenes already on one grid)."),
    "link": LazyCommand("link", "link_app",
                        "Emulated network links: bandwidth, latency and S3 faults in front of an endpoint."),
    "loader": LazyCommand("loader", "loader_app",
                          "The PyTorch loader: capacity planning for training from a lake or object storage."),
    "jobs": LazyCommand("jobs", "jobs_app",
                        "Scheduled preprocessing jobs: run manifests on Dask distributed, idempotently."),
}


class _LazyCommands(MutableMapping[str, "Command"]):
    """A group's commands by name: the names of :data:`COMMANDS` are there from the start (for listings and
    "did you mean" suggestions); a command's module is imported when the command itself is looked up."""

    def __init__(self, loaded: Mapping[str, Command]) -> None:
        self._names = [*COMMANDS, *(n for n in loaded if n not in COMMANDS)]
        self._loaded = dict(loaded)

    def is_loaded(self, name: str) -> bool:
        return name in self._loaded

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded:
            if name not in self._names or name not in COMMANDS:
                raise KeyError(name)
            self._loaded[name] = COMMANDS[name].load(name)
        return self._loaded[name]

    def __setitem__(self, name: str, cmd: Command) -> None:
        if name not in self._names:
            self._names.append(name)
        self._loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


class LazyGroup(TyperGroup):
    """The top-level group: a subcommand's module is imported when that subcommand runs, not for the listing."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = self._lazy = _LazyCommands(self.commands)
        self._listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # the names only (TyperGroup's own walks the items, loading every module)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if self._listing and cmd_name in COMMANDS and not self._lazy.is_loaded(cmd_name):
            # the help's command list needs a name and a line of help, not the module
            return TyperCommand(name=cmd_name, help=COMMANDS[cmd_name].help)
        return self.commands.get(cmd_name)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="cubelake",
    help="Validate, calibrate and convert hyperspectral scenes into a lake of chunk-aligned COG, Zarr v3 and virtual-Zarr (kerchunk) products.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyGroup,
)


@app.callback()
def _global(verbose: int = VERBOSE, quiet: bool = QUIET) -> None:
    configure_output(verbose, quiet)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        from .ingest import INTERRUPTED

        sys.stderr.write(INTERRUPTED + "\n")
        sys.exit(130)
