"""CLI start-up: wall time of ``cubelake --help`` and some subcommands' ``--help`` in fresh processes.

Each command runs ``--runs`` times in a new process (round-robin over the commands, so a change in the
machine's load hits them all alike); the median is reported beside two references:

- the floor, ``python -c pass`` (the interpreter alone), and
- ``python -c "import click"`` (the least any click-based CLI can do: the ceiling this machine allows).

Ratios are against both. Real commands on a one-scene lake (a small EnMAP tile of the real test data) show the
fixed start-up cost where it adds to work: re-ingesting the unchanged scene (the command's start-up plus a check),
ingesting it again with ``--force`` (a whole small ingest), a catalog search and the lake listing.

Run one benchmark at a time::

    flock /tmp/bench.lock .venv/bin/python bench/cli_startup.py --runs 15 --json /tmp/bench/cli_startup.json

``--cubelake`` measures another build of the command (e.g. another checkout's ``.venv/bin/cubelake``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
REAL = Path(os.environ.get("CUBELAKE_REAL_DATA", Path(__file__).resolve().parents[2] / "shared/data/real"))
SCENE = REAL / "hsi_enmap_potsdam" / "enmap_potsdam_tile_96_0.tif"

REFERENCES: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    'python -c "import click"': [sys.executable, "-c", "import click"],
}
HELP: dict[str, list[str]] = {
    "cubelake --help": ["--help"],
    "cubelake ingest --help": ["ingest", "--help"],
    "cubelake catalog search --help": ["catalog", "search", "--help"],
    "cubelake loader --help": ["loader", "--help"],
    "cubelake jobs run --help": ["jobs", "run", "--help"],
    "cubelake profiles": ["profiles"],
}


def real_commands(lake: Path) -> dict[str, list[str]]:
    """Real commands on ``lake`` (holding :data:`SCENE`, see :func:`setup_lake`)."""
    return {
        "cubelake ingest SCENE (unchanged)": ["ingest", str(SCENE), "--lake", str(lake), "-q"],
        "cubelake ingest SCENE --force": ["ingest", str(SCENE), "--lake", str(lake), "--force", "-q"],
        "cubelake catalog search": ["catalog", "search", "--lake", str(lake)],
        "cubelake lake": ["lake", "--lake", str(lake)],
    }


def setup_lake(cubelake: list[str], lake: Path) -> None:
    """A lake holding :data:`SCENE`, ingested by the measured command."""
    if not SCENE.is_file():
        raise SystemExit(f"{SCENE}: the real test scene is missing; set CUBELAKE_REAL_DATA or use --no-real")
    wall_s([*cubelake, "ingest", str(SCENE), "--lake", str(lake), "-q"])


def wall_s(argv: list[str]) -> float:
    """Wall seconds of one fresh process running ``argv``; raises, with its output, if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout.decode()[-3000:]}")
    return elapsed


def measure(cases: dict[str, list[str]], runs: int, warmup: int) -> dict[str, list[float]]:
    """``runs`` wall times per case, round-robin; ``warmup`` unrecorded rounds first (page cache, .pyc)."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(warmup + runs):
        for name, argv in cases.items():
            t = wall_s(argv)
            if i >= warmup:
                times[name].append(t)
    return times


def summarise(times: dict[str, list[float]], floor: str, ceiling: str) -> list[dict[str, object]]:
    """Median, min and max per case, and the median's ratios to the floor's and the ceiling's medians."""
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return [{
        "command": name,
        "median_s": round(med[name], 4),
        "min_s": round(min(ts), 4),
        "max_s": round(max(ts), 4),
        "runs": len(ts),
        "x_floor": round(med[name] / med[floor], 2),
        "x_click": round(med[name] / med[ceiling], 2),
    } for name, ts in times.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15, help="fresh processes per command (the median is reported)")
    ap.add_argument("--warmup", type=int, default=2, help="unrecorded rounds first")
    ap.add_argument("--label", default="", help="a name for this state of the code, kept in the JSON")
    ap.add_argument("--cubelake", default=str(VENV_BIN / "cubelake"),
                    help="the command to measure, split like a shell line (default: this venv's cubelake)")
    ap.add_argument("--no-real", action="store_true", help="only the --help commands (no lake, no ingest)")
    ap.add_argument("--json", type=Path, default=None, help="write all results here")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error(f"--runs must be at least 1, got {a.runs}")
    cubelake = shlex.split(a.cubelake)
    with tempfile.TemporaryDirectory(prefix="cubelake-cli-startup-") as tmp:
        commands = {**HELP}
        if not a.no_real:
            lake = Path(tmp) / "lake"
            setup_lake(cubelake, lake)
            commands |= real_commands(lake)
        cases = {**REFERENCES, **{name: [*cubelake, *args] for name, args in commands.items()}}
        load_before = os.getloadavg()
        times = measure(cases, a.runs, a.warmup)
        load_after = os.getloadavg()
    floor, ceiling = list(REFERENCES)
    rows = summarise(times, floor, ceiling)
    print(f"{'command':36} {'median s':>9} {'min s':>7} {'max s':>7} {'x floor':>8} {'x click':>8}")
    for r in rows:
        print(f"{r['command']:36} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} "
              f"{r['x_floor']:8.2f} {r['x_click']:8.2f}")
    print(f"median of {a.runs} fresh processes each; load average (1/5/15 min) before "
          f"{'/'.join(f'{v:.2f}' for v in load_before)}, after {'/'.join(f'{v:.2f}' for v in load_after)}; "
          f"{os.cpu_count()} cores")
    if a.json:
        doc = {"label": a.label, "cubelake": a.cubelake, "runs": a.runs, "warmup": a.warmup, "python": platform.python_version(),
               "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after,
               "results": rows, "times_s": times}
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
