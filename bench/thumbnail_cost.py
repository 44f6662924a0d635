"""What the scene thumbnail adds to an ingest: the same scene ingested with ``IngestOptions(thumbnail=None)``
and with the default thumbnail, each run in a fresh process, alternating, on one or two code trees.

Reported per tree: the median wall time of the ingest without and with the thumbnail (their difference is
the thumbnail's whole cost, binning inside the pixel pass included), and the median time of the 'thumbnail'
stage itself (from the 'thumbnail' progress event to the next one: the work left after the pass, and the scene's records), with the pipeline's own
log line on the thumbnail (after: seconds binning in the pass and after it; before: reading and rendering).

``--before-tree DIR`` runs the package found in DIR too (a folder holding a ``cubelake`` package with its
``ingest``, ``catalog`` and ``loaders`` subpackages inside, e.g. made from ``git archive c9cec77``), put
first on ``PYTHONPATH`` so it shadows the editable install. Example::

    python bench/thumbnail_cost.py --scene /tmp/bench/loader/synth_2048x2048x128.tif \\
        --before-tree /tmp/thumb_before/pkg --repeats 3 --products cog
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def one_run(scene: Path, products: tuple[str, ...], thumbnail: bool, workers: int) -> dict[str, Any]:
    """Ingest ``scene`` into a fresh lake; wall seconds, per-stage seconds, and where the package came from."""
    import cubelake.ingest as ci
    from cubelake.ingest import IngestOptions, Outcome, ingest

    marks: list[tuple[str, float]] = []
    said: list[str] = []  # the pipeline's own account of the thumbnail's seconds (its INFO line)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "thumbnail" in record.getMessage():
                said.append(record.getMessage())

    pipeline_log = logging.getLogger("cubelake.ingest.pipeline")
    pipeline_log.setLevel(logging.INFO)
    pipeline_log.addHandler(Keep())

    def progress(ev: Any) -> None:
        if not marks or marks[-1][0] != ev.stage:
            marks.append((ev.stage, time.perf_counter()))

    work = Path(tempfile.mkdtemp(prefix="thumbcost-", dir=os.environ.get("TMPDIR")))
    try:
        opts = IngestOptions(products=products, workers=workers, **({} if thumbnail else {"thumbnail": None}))
        t0 = time.perf_counter()
        (result,) = ingest([scene], work / "lake", opts, progress=progress)
        wall = time.perf_counter() - t0
        if result.outcome is not Outcome.INGESTED:
            raise RuntimeError(f"{scene}: {result.outcome}: {result.message}")
        has_png = any((work / "lake" / "scenes").glob("*/thumbnail.png"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stages = {a: round(tb - ta, 3) for (a, ta), (_, tb) in itertools.pairwise(marks)}
    return {"wall_s": round(wall, 3), "stages_s": stages, "png": has_png, "package": str(Path(ci.__file__).parent),
            "cpu_s": round(time.process_time(), 2), "log": said}


def run_child(tree: Path | None, args: argparse.Namespace, thumbnail: bool) -> dict[str, Any]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--scene", str(args.scene), "--products",
           args.products, "--workers", str(args.workers), *(["--thumbnail"] if thumbnail else [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    res: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scene", type=Path, required=True, help="a GeoTIFF (e.g. written by bench/synth.py)")
    ap.add_argument("--products", default="cog", help="comma-separated: cog, zarr, refs")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before-tree", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write every run and the summary here")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--thumbnail", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    products = tuple(p.strip() for p in args.products.split(",") if p.strip())
    if args.one:
        print(json.dumps(one_run(args.scene, products, args.thumbnail, args.workers)))
        return
    trees: dict[str, Path | None] = {"after (this tree)": None}
    if args.before_tree is not None:
        trees = {"before": args.before_tree, **trees}
    runs: list[dict[str, Any]] = []
    for r in range(args.repeats):
        for name, tree in trees.items():
            for thumb in (False, True):
                res = run_child(tree, args, thumb) | {"tree": name, "thumbnail": thumb, "repeat": r}
                runs.append(res)
                print(json.dumps(res), flush=True)
    summary: dict[str, Any] = {}
    for name in trees:
        off = [x["wall_s"] for x in runs if x["tree"] == name and not x["thumbnail"]]
        on = [x["wall_s"] for x in runs if x["tree"] == name and x["thumbnail"]]
        stage = [x["stages_s"].get("thumbnail", 0.0) for x in runs if x["tree"] == name and x["thumbnail"]]
        summary[name] = {"off_s": statistics.median(off), "on_s": statistics.median(on),
                         "added_s": round(statistics.median(on) - statistics.median(off), 3),
                         "thumbnail_stage_s": statistics.median(stage), "off_all": off, "on_all": on,
                         "stage_all": stage}
    size = args.scene.stat().st_size
    print(f"\nscene {args.scene} ({size / 1e9:.2f} GB), products {','.join(products)}, workers {args.workers}, "
          f"{args.repeats} repeats, medians:")
    print(f"{'tree':<20} {'no thumbnail':>13} {'thumbnail':>10} {'added':>8} {'thumbnail stage':>16}")
    for name, s in summary.items():
        print(f"{name:<20} {s['off_s']:>12.2f}s {s['on_s']:>9.2f}s {s['added_s']:>7.2f}s {s['thumbnail_stage_s']:>15.3f}s")
    if args.json is not None:
        args.json.write_text(json.dumps({"scene": str(args.scene), "bytes": size, "products": products,
                                         "workers": args.workers, "runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
