"""``cubelake profiles``: the bundled sensor profiles."""

from __future__ import annotations

import typer

from ._render import out_console, print_json, show
from .ingest import OutputFormat


def profiles_cmd(
    fmt: OutputFormat = typer.Option(OutputFormat.text, "--format", help="text or json."),
) -> None:
    """List the bundled sensor profiles (use a name with --profile, or copy a file to adapt it)."""
    from cubelake.ingest.profile import builtin_profiles, load_profile

    rows = []
    for name, path in builtin_profiles().items():
        p = load_profile(path)
        rows.append({"name": name, "path": str(path), "description": " ".join(p.description.split())})
    if fmt is OutputFormat.json:
        print_json({"profiles": rows})
        return
    out = out_console()
    for r in rows:
        out.print(f"[bold]{show(r['name'])}[/bold]  {show(r['path'])}\n    {show(r['description'])}")
