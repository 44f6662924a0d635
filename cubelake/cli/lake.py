"""``cubelake lake``: what a lake holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from cubelake.errors import CubelakeError
from cubelake.lake import Lake
from cubelake.record import SceneRecord

from ._render import fail, out_console, print_json, show
from .ingest import OutputFormat


def lake_cmd(
    lake: Path = typer.Option(Path("lake"), "--lake", "-l", help="Lake folder.", envvar="CUBELAKE_LAKE"),
    fmt: OutputFormat = typer.Option(OutputFormat.text, "--format", help="text or json."),
) -> None:
    """List the scenes of a lake, their products, and the rejected inputs."""
    try:
        lk = Lake(lake, create=False)
    except CubelakeError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lake") from exc
    try:
        scenes = [_scene_row(sid, lk.scene_record(sid)) for sid in lk.scene_ids()]
    except CubelakeError as exc:  # a record a newer cubelake wrote
        raise fail(exc) from None
    rejected = []
    for rid in lk.rejected_ids():
        try:
            rec = json.loads(lk.rejected_path(rid).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        rejected.append({"id": rid, "source": rec.get("source", {}).get("path"),
                         "errors": [e["code"] for e in rec.get("report", {}).get("errors", [])]})
    if fmt is OutputFormat.json:
        print_json({"lake": str(lk.root), "scenes": scenes, "rejected": rejected})
        return
    out = out_console()
    out.print(f"lake {show(str(lk.root))}: {len(scenes)} scene(s), {len(rejected)} rejected input(s)")
    for s in scenes:
        prods = ", ".join(f"{k}={v}" for k, v in s["products"].items())
        out.print(f"  {show(s['id'])}: {s['bands']} bands {s['shape'][0]}x{s['shape'][1]} {s['dtype']} "
                  f"{show('[' + str(s['profile']) + ']')} {show(prods)}"
                  + (f" ({s['warnings']} warning(s))" if s["warnings"] else ""))
    for r in rejected:
        out.print(f"  [red]rejected[/red] {show(str(r['source']))}: {', '.join(r['errors'])}")


def _scene_row(sid: str, rec: SceneRecord | None) -> dict[str, Any]:
    """What ``cubelake lake`` shows of a scene (an unreadable record shows as empty)."""
    if rec is None:
        return {"id": sid, "bands": 0, "shape": [None, None], "dtype": None, "profile": None, "products": {},
                "warnings": 0}
    return {
        "id": sid,
        "bands": rec.band_count,
        "shape": [rec.grid.height, rec.grid.width],
        "dtype": rec.encoding.dtype,
        "profile": rec.profile.name,
        "products": {k: v.path for k, v in rec.products.items()},
        "warnings": len(rec.validation.warnings),
    }
