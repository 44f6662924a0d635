"""Scheduled jobs on Dask distributed: ``cubelake jobs run`` against one sequential ``cubelake ingest``.

The same ``--scenes`` synthetic hyperspectral scenes (``bench/synth.py``: int16, ``--bands`` x
``--size`` x ``--size``, uncompressed, 256-tiled, pixel-interleaved) go into a fresh lake each way,
with products cog,zarr and one profile (``bench_profile.yaml``: chunk 256, COG ZSTD 3, no bad
bands, so every way builds the same products):

  sequential   ``cubelake ingest --lake L1 --products cog,zarr --profile P SCENES...`` (one process;
               its ingest uses ``--workers``' default, one thread per CPU)
  jobs_1w      ``cubelake jobs run M2.yaml``: LocalCluster of 1 worker process, threads_per_task 2, lake L2
  jobs_2w      ``cubelake jobs run M3.yaml``: LocalCluster of 2 worker processes, threads_per_task 1, lake L3
  rerun_2w     ``cubelake jobs run M3.yaml`` again after it succeeded (the ledger skips every scene)

Each runs as a subprocess (``--format json``: per-scene seconds from its own report); the script
samples the process tree with psutil every ``--interval`` s for peak RSS per process (the client,
each Dask worker process) and the tree's summed RSS, and reads the machine's busy CPU from
``/proc/stat`` to say how much CPU other processes took meanwhile (less the tree's own CPU and this
script's sampling). Inputs are read once before
every run (warm page cache for all). ``--rounds`` rounds run the four in turn (fresh lakes).

Also: the scheduler's cost per task (a LocalCluster of 2 worker processes x 1 thread, as jobs use,
in its own subprocess: ``--tasks`` no-op ``client.submit(lambda i: i, i, pure=False)`` then
``gather``), and per jobs run the overhead per scene, (wall - sum of per-scene ingest seconds /
workers) / scenes. The ceiling for any 2-worker layout is the sequential wall / 2 cores; a reachable
one, the sequential CPU seconds / 2 cores (the CLI already keeps more than one core busy).

``--notrim`` adds a fifth way: the 2-worker job with Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` for
worker processes (``distributed.nanny.pre-spawn-environ``) unset, into lake L4.

Afterwards every lake must hold the same scene ids, each with the same record ``content_hash``,
``source.content_hash`` and ``config_hash`` (``scenes/<id>/scene.json``).

    .venv/bin/python bench/jobs.py --scenes 16 --bands 128 --size 512 --rounds 2 --nice -10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling helper modules
from synth import cached_scenes  # noqa: E402

BIN = Path(sys.executable).parent
CORES = os.cpu_count() or 1
CONFIGS = ("sequential", "jobs_1w", "jobs_2w", "rerun_2w")
NOTRIM = "jobs_2w_notrim"
LABELS = {
    "sequential": "cubelake ingest (one process, 2 threads)",
    "jobs_1w": "jobs run: 1 worker x 2 threads",
    "jobs_2w": "jobs run: 2 workers x 1 thread",
    "rerun_2w": "jobs run again (2 workers, all done)",
    NOTRIM: "jobs run: 2 workers x 1 thread, no MALLOC_TRIM_THRESHOLD_",
}
WORKERS = {"sequential": 1, "jobs_1w": 1, "jobs_2w": 2, "rerun_2w": 2, NOTRIM: 2}
# Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536 in every worker it spawns (distributed.nanny.pre-spawn-environ);
# a None there unsets it, so the workers get glibc's default (dynamic) trim threshold, like the CLI
NOTRIM_ENV = {"DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON": '{"MALLOC_TRIM_THRESHOLD_": None}'}


# -- the machine ------------------------------------------------------------------------------------
def busy_cpu_seconds() -> float:
    """Non-idle CPU seconds of the whole machine since boot (all cores; iowait counts as idle)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def wait_quiet(max_wait_s: float, below: float = 0.2) -> float:
    """Wait (up to ``max_wait_s``) until other processes use under ``below`` cores for 2 s; seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_wait_s:
        b0 = busy_cpu_seconds()
        time.sleep(2.0)
        if (busy_cpu_seconds() - b0) / 2.0 < below:
            break
    return time.monotonic() - t0


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def own_autogroup(nice: int) -> Callable[[], None] | None:
    """A preexec_fn: a new session (its own scheduler autogroup) of niceness ``nice`` (root for < 0)."""
    if not nice:
        return None

    def setup() -> None:
        os.setsid()
        os.nice(nice)
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(f"{nice}\n")
        except OSError:
            pass

    return setup


def warm(paths: list[Path]) -> None:
    """Read every input once, so every run finds them in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(16 * 1024 * 1024):
                pass


# -- sampling a process tree ------------------------------------------------------------------------
def role_of(proc: psutil.Process, root: int) -> str:
    """'client' (the command itself), 'worker' (a spawned Dask worker process) or 'helper'."""
    if proc.pid == root:
        return "client"
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "helper"
    if "resource_tracker" in cmd:
        return "helper"
    return "worker" if "spawn_main" in cmd or "forkserver" in cmd else "helper"


@dataclass
class TreeSampler:
    """Peak RSS per process and of the whole tree of ``pid``, and each process's CPU seconds."""

    pid: int
    interval: float
    peak_rss: dict[int, int] = field(default_factory=dict)
    cpu_s: dict[int, float] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)
    seen: dict[int, list[float]] = field(default_factory=dict)  # pid -> [first, last] seconds after start
    tree_peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = field(default_factory=time.perf_counter)

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            self.sample(root)
            self._stop.wait(self.interval)

    def sample(self, root: psutil.Process) -> None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        total = 0
        for p in procs:
            try:
                rss = p.memory_info().rss
                cpu = p.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            now = round(time.perf_counter() - self._t0, 1)
            if p.pid not in self.roles:
                self.roles[p.pid] = role_of(p, self.pid)
                self.seen[p.pid] = [now, now]
            self.seen[p.pid][1] = now
            total += rss
            self.peak_rss[p.pid] = max(self.peak_rss.get(p.pid, 0), rss)
            self.cpu_s[p.pid] = max(self.cpu_s.get(p.pid, 0.0), cpu.user + cpu.system)
        self.tree_peak = max(self.tree_peak, total)
        self.samples += 1

    def report(self) -> dict[str, Any]:
        mib = 1024**2
        by_role = {r: [round(self.peak_rss[p] / mib) for p in sorted(self.roles) if self.roles[p] == r]
                   for r in ("client", "worker", "helper")}
        return {"tree_peak_rss_mib": round(self.tree_peak / mib), "client_peak_rss_mib": max(by_role["client"], default=0),
                "worker_peak_rss_mib": by_role["worker"], "helper_peak_rss_mib": by_role["helper"],
                "processes": [{"pid": p, "role": self.roles[p], "peak_rss_mib": round(self.peak_rss[p] / mib),
                               "cpu_s": round(self.cpu_s[p], 2), "seen_s": self.seen[p]} for p in sorted(self.roles)],
                "cpu_s": round(sum(self.cpu_s.values()), 2), "samples": self.samples}


# -- one measured run -------------------------------------------------------------------------------
def measure(cmd: list[str], log: Path, *, interval: float, nice: int, env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd`` (stdout to ``log``.json, stderr to ``log``.err); wall s, RSS per process, CPU, load."""
    me = psutil.Process()
    load0, busy0, mine0 = loadavg(), busy_cpu_seconds(), sum(me.cpu_times()[:2])
    t0 = time.perf_counter()
    with open(log.with_suffix(".json"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, preexec_fn=own_autogroup(nice))
        sampler = TreeSampler(proc.pid, interval).start()
        rc = proc.wait()
        wall = time.perf_counter() - t0
        sampler.stop()
    busy = busy_cpu_seconds() - busy0
    sampling = sum(me.cpu_times()[:2]) - mine0  # this script's own sampling thread
    r = sampler.report()
    other = max(0.0, busy - r["cpu_s"] - sampling)
    return {"cmd": " ".join(cmd), "rc": rc, "wall_s": round(wall, 3), **r, "sampler_cpu_s": round(sampling, 2),
            "other_cpu_s": round(other, 2),
            "other_cores": round(other / wall, 3) if wall else 0.0, "loadavg_before": load0, "loadavg_after": loadavg()}


def read_report(log: Path) -> dict[str, Any]:
    text = log.with_suffix(".json").read_text()
    try:
        return dict(json.loads(text))
    except json.JSONDecodeError as exc:
        err = log.with_suffix(".err").read_text()[-3000:]
        raise RuntimeError(f"{log}: not a JSON report ({exc}):\n{text[-2000:]}\n{err}") from None


# -- the four ways ----------------------------------------------------------------------------------
def write_profile(path: Path) -> Path:
    path.write_text("name: bench\nproducts: {chunk: 256, level: 3}\nbad_bands: {wavelength_windows_nm: []}\n")
    return path


def write_manifest(path: Path, *, name: str, lake: Path, scenes: list[Path], profile: Path, workers: int,
                   threads: int) -> Path:
    doc = {"version": 1, "name": name, "lake": str(lake), "inputs": [str(s) for s in scenes],
           "steps": {"ingest": {"profile": str(profile), "products": ["cog", "zarr"]}},
           "resources": {"workers": workers, "threads_per_task": threads, "memory_per_task": "4GiB", "retries": 2}}
    path.write_text(json.dumps(doc, indent=1) + "\n")  # JSON is YAML
    return path


def commands(work: Path, scenes: list[Path], profile: Path) -> dict[str, list[str]]:
    cl = str(BIN / "cubelake")
    m4 = write_manifest(work / "jobs_2w_notrim.yaml", name="bench-2w-notrim", lake=work / "L4", scenes=scenes,
                        profile=profile, workers=2, threads=1)
    m2 = write_manifest(work / "jobs_1w.yaml", name="bench-1w", lake=work / "L2", scenes=scenes, profile=profile,
                        workers=1, threads=2)
    m3 = write_manifest(work / "jobs_2w.yaml", name="bench-2w", lake=work / "L3", scenes=scenes, profile=profile,
                        workers=2, threads=1)
    return {
        "sequential": [cl, "ingest", "--lake", str(work / "L1"), "--products", "cog,zarr", "--profile", str(profile),
                       "--format", "json", *map(str, scenes)],
        "jobs_1w": [cl, "jobs", "run", str(m2), "--format", "json"],
        "jobs_2w": [cl, "jobs", "run", str(m3), "--format", "json"],
        "rerun_2w": [cl, "jobs", "run", str(m3), "--format", "json"],
        NOTRIM: [cl, "jobs", "run", str(m4), "--format", "json"],
    }


def scene_seconds(key: str, report: dict[str, Any]) -> list[float]:
    """Per-scene ingest seconds from the command's own JSON report."""
    if key == "sequential":
        return [float(r["seconds"]) for r in report["results"]]
    return [float(e["seconds"]) for e in report["runs"][0].get("inputs", []) if e.get("seconds") is not None]


def job_facts(report: dict[str, Any]) -> dict[str, Any]:
    """What the run record says: its own seconds, counts, workers and each worker's ru_maxrss."""
    rec = report["runs"][0]
    per_worker: dict[str, int] = {}
    for e in rec.get("inputs", []):
        if e.get("worker"):
            per_worker[e["worker"]] = max(per_worker.get(e["worker"], 0), int(e.get("max_rss_bytes") or 0))
    return {"state": rec.get("state"), "record_seconds": rec.get("seconds"), "counts": rec.get("counts"),
            "workers": rec.get("workers"), "scenes_per_worker": _per_worker_counts(rec),
            "worker_maxrss_mib": {w: round(b / 1024**2) for w, b in sorted(per_worker.items())}}


def _per_worker_counts(rec: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in rec.get("inputs", []):
        if e.get("worker"):
            out[e["worker"]] = out.get(e["worker"], 0) + 1
    return out


def run_one(key: str, cmd: list[str], work: Path, scenes: list[Path], a: argparse.Namespace,
            env: dict[str, str]) -> dict[str, Any]:
    warm(scenes)
    waited = wait_quiet(a.quiet_wait)
    env = {**env, **NOTRIM_ENV} if key == NOTRIM else env
    r = measure(cmd, work / key, interval=a.interval, nice=a.nice, env=env)
    r["waited_for_quiet_s"] = round(waited, 1)
    report = read_report(work / key)
    secs = scene_seconds(key, report)
    r.update(scene_seconds=secs, scene_seconds_sum=round(sum(secs), 2))
    if key != "sequential":
        r.update(job_facts(report))
        if secs:
            w = WORKERS[key]
            r["overhead_per_scene_s"] = round((r["wall_s"] - sum(secs) / w) / len(secs), 3)
            r["overhead_per_scene_in_run_job_s"] = round((r["record_seconds"] - sum(secs) / w) / len(secs), 3)
    else:
        r["counts"] = {"ingested": sum(x["outcome"] == "ingested" for x in report["results"])}
    print(f"  {key:<10} {r['wall_s']:7.1f} s  rc {r['rc']}  tree RSS {r['tree_peak_rss_mib']:5d} MiB  client "
          f"{r['client_peak_rss_mib']:5d} MiB  workers {r['worker_peak_rss_mib']}  CPU {r['cpu_s']:6.1f} s  "
          f"others {r['other_cores']:.2f} cores  load {r['loadavg_before'][0]:.2f}->{r['loadavg_after'][0]:.2f}  "
          f"{r.get('counts')}", flush=True)
    return r


# -- scheduler cost per task ------------------------------------------------------------------------
def scheduler_overhead(tasks: int, workers: int) -> dict[str, Any]:
    """Start a LocalCluster as jobs do; time ``tasks`` no-op submits + gather (after a warm-up of 50)."""
    import logging

    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                           silence_logs=logging.ERROR)
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(workers)
    started = time.perf_counter() - t0
    try:
        client.gather([client.submit(lambda i: i, i, pure=False) for i in range(50)])
        t1 = time.perf_counter()
        futures = [client.submit(lambda i: i, i, pure=False) for i in range(tasks)]
        t2 = time.perf_counter()
        out = client.gather(futures)
        t3 = time.perf_counter()
        assert out == list(range(tasks))
    finally:
        t4 = time.perf_counter()
        client.close()
        cluster.close()
        closed = time.perf_counter() - t4
    return {"tasks": tasks, "workers": workers, "cluster_start_s": round(started, 3), "cluster_close_s": round(closed, 3),
            "submit_s": round(t2 - t1, 3), "gather_s": round(t3 - t2, 3), "total_s": round(t3 - t1, 3),
            "s_per_task": (t3 - t1) / tasks}


def measure_overhead(a: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """The microbenchmark in its own process (and autogroup), like the measured commands."""
    wait_quiet(a.quiet_wait)
    log = work / "overhead"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--overhead-only", str(a.tasks)]
    r = measure(cmd, log, interval=a.interval, nice=a.nice, env=env)
    if r["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{log.with_suffix('.err').read_text()[-3000:]}")
    out = read_report(log)
    print(f"  overhead  {out['tasks']} no-op tasks on {out['workers']} workers: {out['s_per_task'] * 1e3:.2f} ms/task "
          f"(cluster start {out['cluster_start_s']:.1f} s)  others {r['other_cores']:.2f} cores", flush=True)
    return {**out, "other_cores": r["other_cores"], "loadavg_before": r["loadavg_before"]}


# -- correctness ------------------------------------------------------------------------------------
def lake_records(lake: Path) -> dict[str, dict[str, Any]]:
    """scene id -> the hashes of its ``scene.json``."""
    out = {}
    for rec in sorted((lake / "scenes").glob("*/scene.json")):
        d = json.loads(rec.read_text())
        out[d["scene_id"]] = {"content_hash": d.get("content_hash"), "config_hash": d.get("config_hash"),
                              "source_content_hash": (d.get("source") or {}).get("content_hash")}
    return out


def check_lakes(lakes: dict[str, Path], n: int) -> list[str]:
    """Every lake holds the same ``n`` scene ids with the same record hashes as the first lake."""
    recs = {k: lake_records(p) for k, p in lakes.items()}
    ref_key = next(iter(recs))
    ref = recs[ref_key]
    problems = [] if len(ref) == n else [f"{ref_key}: {len(ref)} scenes, expected {n}"]
    for k, r in recs.items():
        if set(r) != set(ref):
            problems.append(f"{k}: scene ids differ from {ref_key}: {sorted(set(r) ^ set(ref))}")
        problems += [f"{k}: {sid}: {h} {r[sid][h]} != {ref[sid][h]} ({ref_key})" for sid in sorted(set(r) & set(ref))
                     for h in ref[sid] if r[sid][h] != ref[sid][h] or r[sid][h] is None]
    return problems


# -- summary ----------------------------------------------------------------------------------------
def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    seq = statistics.median(r["wall_s"] for r in runs["sequential"])
    ceiling = seq / CORES
    cpu_ceiling = statistics.median(r["cpu_s"] for r in runs["sequential"]) / CORES
    out = {}
    for key, rs in runs.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        s: dict[str, Any] = {"walls_s": [r["wall_s"] for r in rs], "wall_median_s": wall,
                             "speedup_vs_sequential": seq / wall, "wall_over_ceiling": wall / ceiling,
                             "wall_over_cpu_ceiling": wall / cpu_ceiling,
                             "tree_peak_rss_mib": max(r["tree_peak_rss_mib"] for r in rs),
                             "client_peak_rss_mib": max(r["client_peak_rss_mib"] for r in rs),
                             "worker_peak_rss_mib": max((w for r in rs for w in r["worker_peak_rss_mib"]), default=None),
                             "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
                             "scene_s_median": statistics.median(x for r in rs for x in r["scene_seconds"])
                             if any(r["scene_seconds"] for r in rs) else None,
                             "other_cores_max": max(r["other_cores"] for r in rs)}
        if "overhead_per_scene_s" in rs[0]:
            s["overhead_per_scene_s"] = [r["overhead_per_scene_s"] for r in rs]
            s["overhead_per_scene_in_run_job_s"] = [r["overhead_per_scene_in_run_job_s"] for r in rs]
        out[key] = s
    out["_ceiling"] = {"sequential_median_s": seq, "cores": CORES, "ceiling_s": ceiling,
                       "cpu_ceiling_s": cpu_ceiling}
    return out


def print_table(summary: dict[str, dict[str, Any]], overhead: list[dict[str, Any]], n: int) -> None:
    from rich.console import Console
    from rich.table import Table

    c = summary["_ceiling"]
    t = Table(title=f"{n} scenes; ceiling = sequential wall / {CORES} cores = {c['ceiling_s']:.1f} s; CPU ceiling = "
                    f"sequential CPU s / {CORES} cores = {c['cpu_ceiling_s']:.1f} s")
    for col in ("way", "wall s (rounds)", "median s", "vs sequential", "wall / ceiling", "wall / CPU ceiling",
                "per-scene s (median)",
                "overhead s/scene", "peak RSS MiB: client | max worker | tree", "CPU s", "others (cores)"):
        t.add_column(col, justify="left" if col == "way" else "right")
    for key in (k for k in LABELS if k in summary):
        s = summary[key]
        ov = ", ".join(f"{x:.2f}" for x in s.get("overhead_per_scene_s", [])) or "-"
        scene = f"{s['scene_s_median']:.2f}" if s["scene_s_median"] is not None else "-"
        t.add_row(LABELS[key], ", ".join(f"{w:.1f}" for w in s["walls_s"]), f"{s['wall_median_s']:.1f}",
                  f"{s['speedup_vs_sequential']:.2f}x", f"{s['wall_over_ceiling']:.2f}",
                  f"{s['wall_over_cpu_ceiling']:.2f}", scene, ov,
                  f"{s['client_peak_rss_mib']} | {s['worker_peak_rss_mib'] or '-'} | {s['tree_peak_rss_mib']}",
                  f"{s['cpu_s_median']:.0f}", f"{s['other_cores_max']:.2f}")
    Console(width=220).print(t)
    for o in overhead:
        print(f"scheduler: {o['tasks']} no-op tasks, {o['workers']} workers x 1 thread: {o['s_per_task'] * 1e3:.2f} "
              f"ms/task (submit {o['submit_s']:.2f} s + gather {o['gather_s']:.2f} s); LocalCluster start "
              f"{o['cluster_start_s']:.2f} s, close {o['cluster_close_s']:.2f} s")


# -- main -------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenes", type=int, default=16)
    ap.add_argument("--bands", type=int, default=128)
    ap.add_argument("--size", type=int, default=512, help="scene height = width, pixels")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over the four ways (fresh lakes each)")
    ap.add_argument("--tasks", type=int, default=2000, help="no-op tasks for the scheduler's cost per task")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench/jobs"), help="scenes, lakes and logs go here")
    ap.add_argument("--interval", type=float, default=0.1, help="psutil sampling interval, s")
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="before each run, wait up to this many seconds for other processes to go idle")
    ap.add_argument("--nice", type=int, default=0,
                    help="run every command at this niceness in its own scheduler autogroup (e.g. -10 as root)")
    ap.add_argument("--notrim", action="store_true",
                    help="also run the 2-worker job with Dask's MALLOC_TRIM_THRESHOLD_=65536 for workers unset (lake L4)")
    ap.add_argument("--keep", action="store_true", help="keep the last round's lakes")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "jobs.json")
    ap.add_argument("--overhead-only", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    a = parse_args()
    if a.overhead_only is not None:
        print(json.dumps(scheduler_overhead(a.overhead_only, 2)))
        return
    t_start, load_start = time.time(), loadavg()
    scenes = cached_scenes(a.out / "scenes", "scene", a.scenes, height=a.size, width=a.size, bands=a.bands,
                           block=256, seed=0)
    work = a.out / "work"
    profile = write_profile(a.out / "bench_profile.yaml")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    nbytes = a.scenes * a.bands * a.size * a.size * 2
    print(f"{a.scenes} scenes {a.bands}x{a.size}x{a.size} int16 ({nbytes / 2**20:.0f} MiB in all) in {scenes[0].parent}; "
          f"{CORES} cores; load average {load_start}", flush=True)
    ways = (*CONFIGS, NOTRIM) if a.notrim else CONFIGS
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ways}
    overhead: list[dict[str, Any]] = []
    problems: list[str] = []
    cmds: dict[str, list[str]] = {}
    for rnd in range(a.rounds):
        print(f"round {rnd}", flush=True)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        cmds = commands(work, scenes, profile)
        for key in ways:
            runs[key].append({"round": rnd, **run_one(key, cmds[key], work, scenes, a, env)})
        problems += [f"round {rnd}: {p}" for p in check_round(runs, rnd, work, a.scenes, a.notrim)]
        overhead.append({"round": rnd, **measure_overhead(a, work, env)})
    summary = summarise(runs)
    print_table(summary, overhead, a.scenes)
    print("correctness: " + ("every lake holds the same scene ids with equal content/config hashes"
                             if not problems else "FAILED"))
    for p in problems:
        print("  " + p)
    print(f"load average at start {load_start}, at end {loadavg()}; {time.time() - t_start:.0f} s in all")
    write_json(a, runs, overhead, summary, problems, cmds, load_start, nbytes)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    if problems:
        sys.exit(1)


def check_round(runs: dict[str, list[dict[str, Any]]], rnd: int, work: Path, n: int, notrim: bool) -> list[str]:
    """Exit codes, the rerun did nothing, and the three lakes agree."""
    out = [f"{k}: exit {rs[rnd]['rc']}" for k, rs in runs.items() if rs[rnd]["rc"] != 0]
    c = runs["rerun_2w"][rnd].get("counts") or {}
    if c.get("ingested") or c.get("skipped") != n:
        out.append(f"rerun_2w: expected {n} skipped and none ingested, got {c}")
    for k in ("jobs_1w", "jobs_2w", *((NOTRIM,) if notrim else ())):
        if (runs[k][rnd].get("counts") or {}).get("ingested") != n:
            out.append(f"{k}: expected {n} ingested, got {runs[k][rnd].get('counts')}")
    lakes = {"L1 sequential": work / "L1", "L2 jobs_1w": work / "L2", "L3 jobs_2w": work / "L3"}
    if notrim:
        lakes["L4 jobs_2w_notrim"] = work / "L4"
    return out + check_lakes(lakes, n)


def write_json(a: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], overhead: list[dict[str, Any]],
               summary: dict[str, Any], problems: list[str], cmds: dict[str, list[str]], load_start: list[float],
               nbytes: int) -> None:
    import distributed

    from cubelake import __version__

    doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"cpus": CORES, "platform": platform.platform(), "python": platform.python_version(),
                       "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                       "distributed": distributed.__version__, "cubelake": __version__},
           "argv": sys.argv, "args": {k: str(v) for k, v in vars(a).items() if k != "overhead_only"},
           "scenes": {"count": a.scenes, "shape": [a.bands, a.size, a.size], "dtype": "int16", "bytes": nbytes},
           "commands": {k: " ".join(v) for k, v in cmds.items()},
           "loadavg_start": load_start, "loadavg_end": loadavg(),
           "runs": runs, "scheduler_overhead": overhead, "summary": summary, "problems": problems}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
