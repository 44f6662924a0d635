"""The CLI starts light: ``--help`` imports none of the heavy libraries, and the lazily loaded subcommands are
exactly the commands the eager registration built (same names, options, defaults and help)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import cubelake.cli as cli

HEAVY = ("numpy", "rasterio", "zarr", "xarray", "torch", "dask")


def _modules_after(argv: list[str]) -> tuple[int, str, set[str]]:
    """Exit code, stdout and the imported top-level module names of ``cubelake ARGV`` in a fresh interpreter."""
    code = (
        "import sys\n"
        f"sys.argv = ['cubelake', *{argv!r}]\n"
        "from cubelake.cli import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    rc = exc.code or 0\n"
        "else:\n"
        "    rc = 0\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)) + '\\nRC ' + str(rc) + '\\n')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    modules = set(next(ln for ln in lines if ln.startswith("MODULES ")).split()[1:])
    rc = int(next(ln for ln in lines if ln.startswith("RC ")).split()[1])
    return rc, res.stdout, modules


@pytest.mark.parametrize(("argv", "expect"), [
    ([], "Usage: cubelake"),
    (["--help"], "Usage: cubelake"),
    (["ingest", "--help"], "--refs-format"),
    (["catalog", "search", "--help"], "--wavelength"),
    (["loader", "--help"], "plan"),
    (["lake", "--help"], "--lake"),
    (["jobs", "run", "--help"], "--scheduler"),
])
def test_help_imports_no_heavy_library(argv: list[str], expect: str) -> None:
    rc, out, modules = _modules_after(argv)
    assert rc == (2 if not argv else 0)  # no arguments: the help, as a usage error
    assert expect in out
    imported = sorted(h for h in HEAVY if h in modules)
    assert imported == [], f"cubelake {' '.join(argv)} imported {imported}"


def test_top_level_help_imports_no_subcommand_module() -> None:
    rc, out, modules = _modules_after(["--help"])
    assert rc == 0
    for name in cli.COMMANDS:  # every subcommand is listed with its line of help...
        assert f" {name} " in out
    loaded = sorted(m for m in modules if m.startswith("cubelake.") and m != "cubelake.cli"
                    and m != "cubelake.cli._render" and m != "cubelake.errors")
    assert loaded == [], f"cubelake --help imported {loaded}"  # ...and none of their modules is imported


def test_unknown_command_is_a_usage_error() -> None:
    res = CliRunner().invoke(cli.app, ["ingst"])
    assert res.exit_code == 2
    assert "No such command 'ingst'" in res.output
    assert "ingest" in res.output  # the suggestion, from the names alone


# -- the lazy tree is the eager tree ---------------------------------------------------------------------------


def _eager_app() -> typer.Typer:
    """The app as it was registered before subcommands loaded lazily: every module imported, every command added."""
    eager = typer.Typer(name="cubelake", help=cli.app.info.help, no_args_is_help=True, add_completion=False,
                        pretty_exceptions_enable=False)
    eager.callback()(cli._global)
    for name, spec in cli.COMMANDS.items():
        obj = getattr(importlib.import_module(f"cubelake.cli.{spec.module}"), spec.attr)
        if isinstance(obj, typer.Typer):
            eager.add_typer(obj, name=name)
        else:
            eager.command(name)(obj)
    return eager


def _describe(cmd: Any) -> Any:
    """What a command is made of: its help, its parameters (every user-visible attribute), its subcommands."""
    params = [(p.name, tuple(p.opts), tuple(p.secondary_opts), repr(p.default), p.required, p.multiple, p.nargs,
               p.envvar, getattr(p, "help", None), getattr(p, "hidden", False), getattr(p, "count", False),
               getattr(p, "is_flag", False), type(p).__name__, repr(getattr(p, "type", None)))
              for p in cmd.params]
    subs = {name: _describe(sub) for name, sub in getattr(cmd, "commands", {}).items()}
    return (cmd.name, cmd.help, cmd.short_help, cmd.hidden, cmd.deprecated, type(cmd).__name__,
            getattr(cmd, "no_args_is_help", None), getattr(cmd, "invoke_without_command", None), params, subs)


def _paths(cmd: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, sub in getattr(cmd, "commands", {}).items():
        out += _paths(sub, (*prefix, name))
    return out


def test_lazy_commands_equal_the_eager_ones() -> None:
    eager = typer.main.get_group(_eager_app())
    lazy = typer.main.get_group(cli.app)
    assert isinstance(lazy, cli.LazyGroup)
    ctx = typer.Context(lazy)
    assert lazy.list_commands(ctx) == eager.list_commands(typer.Context(eager))
    for name in cli.COMMANDS:
        assert _describe(lazy.get_command(ctx, name)) == _describe(eager.commands[name]), name


def test_every_help_page_is_unchanged() -> None:
    """``--help`` of the top level and of every command and subcommand renders as the eager app rendered it."""
    eager_app = _eager_app()
    runner = CliRunner()
    paths = _paths(typer.main.get_command(eager_app))
    assert len(paths) > len(cli.COMMANDS)
    for path in paths:
        want = runner.invoke(eager_app, [*path, "--help"], terminal_width=100)
        got = runner.invoke(cli.app, [*path, "--help"], terminal_width=100)
        assert got.exit_code == want.exit_code == 0, (path, got.output)
        assert got.output == want.output, path
