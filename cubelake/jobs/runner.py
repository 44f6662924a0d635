"""Run a job on Dask distributed: a ``LocalCluster`` by default, or an existing scheduler.

The client plans (inputs, filters, the ledger), takes the job's lease, submits one task per
scene with ``retries`` (a task whose worker dies is rerun by the scheduler on another worker),
records each outcome in the ledger as it arrives, then runs the post-ingest steps as tasks.
Killing the client at any moment loses nothing: each scene is published atomically by the
ingest, each ledger object is written whole, and the next run skips what the ledger (or the
scene's own content/config hashes) says is done.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cubelake.errors import ConfigError, CubelakeError
from cubelake.lake import AnyLake

from .inputs import Plan, PlannedInput, plan_inputs
from .ledger import Lease, Ledger, new_run_id, now_iso
from .spec import Manifest
from .tasks import export_task, gc_task, ingest_options, ingest_task, stack_task

__all__ = ["JobEvent", "SchedulerError", "run_job"]

log = logging.getLogger(__name__)

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"


class SchedulerError(CubelakeError):
    """The Dask scheduler cannot be reached (or the local cluster cannot start)."""


@dataclass(frozen=True, slots=True)
class JobEvent:
    """Progress of a run: ``kind`` is 'planned', 'cluster', 'input' or 'step'."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)


Emit = Callable[[JobEvent], None]


@contextlib.contextmanager
def dask_client(manifest: Manifest, scheduler: str | None) -> Iterator[Any]:
    """A client of the scheduler at ``scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``), else of a new LocalCluster."""
    from distributed import Client, LocalCluster

    address = scheduler or os.environ.get(SCHEDULER_ENV) or None
    res = manifest.resources
    if address:
        try:
            client = Client(address, timeout="10s", set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise SchedulerError(f"cannot reach the Dask scheduler at {address} ({exc}); start one with 'dask "
                                 "scheduler' and workers with 'dask worker ADDRESS', or drop --scheduler (and "
                                 f"{SCHEDULER_ENV}) to run on a local cluster") from None
        try:
            yield client
        finally:
            client.close()
        return
    cluster = LocalCluster(n_workers=res.workers, threads_per_worker=1, processes=True,
                           memory_limit=res.memory_per_task, resources={"MEMORY": res.memory_per_task},
                           # CRITICAL: a worker's heartbeat racing the scheduler's shutdown logs an ERROR with a
                           # traceback; task failures reach the runner through their futures, not the log
                           dashboard_address=":0", silence_logs=logging.CRITICAL)
    try:
        with Client(cluster, set_as_default=False) as client:
            yield client
    finally:
        cluster.close()


def _memory_resources(client: Any, need: int) -> dict[str, int] | None:
    """Ask for ``need`` bytes of the workers' MEMORY resource when every worker declares one (else no restriction:
    a task asking for a resource no worker has would wait forever)."""
    workers = client.scheduler_info().get("workers", {}).values()
    if workers and all("MEMORY" in (w.get("resources") or {}) for w in workers):
        if all(w["resources"]["MEMORY"] < need for w in workers):
            raise SchedulerError(f"no worker declares {need} bytes of MEMORY, which resources.memory_per_task asks "
                                 "for; lower it or start workers with more (dask worker --resources MEMORY=...)")
        return {"MEMORY": need}
    return None


def _id_base(p: PlannedInput) -> str:
    from cubelake.ingest.identity import base_name
    from cubelake.lake import safe_scene_id

    return safe_scene_id(base_name(p.scene)).lower()


def _entry(p: PlannedInput, run_id: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"input": p.name, "run_id": run_id, "state": state, "settings_hash": p.settings_hash,
            "files": p.files, "finished": now_iso(), **extra}


def _outcome(p: PlannedInput, run_id: str, fut: Any) -> dict[str, Any]:
    """The ledger entry of a finished task (an exception after the retries is a failed input)."""
    try:
        out = fut.result()
    except Exception as exc:  # the task's own failure, or KilledWorker after the scheduler gave up
        kind = type(exc).__name__
        msg = str(exc) if kind == "TaskFailed" else f"the task failed ({kind}: {exc})"
        if kind == "KilledWorker":
            msg = ("the task killed its worker every time it ran (over memory_per_task? a crash in a codec?); "
                   f"{exc}")
        return _entry(p, run_id, "failed", outcome="failed", message=msg, scene_id=None)
    r = out["result"]
    state = "rejected" if r["outcome"] == "rejected" else "done"
    return _entry(p, run_id, state, outcome=r["outcome"], message=r["message"], scene_id=r["scene_id"],
                  seconds=r["seconds"], worker=out["worker"], max_rss_bytes=out["max_rss_bytes"],
                  content_hash=out["content_hash"], config_hash=out["config_hash"], files=out["files"],
                  errors=r["errors"])


@dataclass
class _Run:
    manifest: Manifest
    lake: AnyLake
    ledger: Ledger
    lease: Lease
    record: dict[str, Any]
    emit: Emit
    entries: dict[str, dict[str, Any]]  # the ledger's input entries, read once; this run's outcomes update it

    def ingest(self, client: Any, plan: Plan) -> list[dict[str, Any]]:
        """One task per scene; outcomes go to the ledger as they arrive.

        Scenes whose names would give the same scene id run one after the other, in input order, as
        ``cubelake ingest`` runs them: the first keeps the plain id, the next gets its path-hash suffix,
        and a rerun gives each the same id again (concurrently, which one wins would be a race).
        """
        from distributed import as_completed

        need = _memory_resources(client, self.manifest.resources.memory_per_task)
        queues: dict[str, list[PlannedInput]] = {}
        for p in plan.todo:
            queues.setdefault(_id_base(p), []).append(p)
        pending: dict[str, tuple[PlannedInput, str]] = {}
        ac = as_completed(loop=client.loop)
        for base, queue in queues.items():
            ac.add(self._submit(client, queue.pop(0), base, pending, need))
        done: list[dict[str, Any]] = []
        for fut in ac:
            p, base = pending.pop(fut.key)
            entry = _outcome(p, self.record["run_id"], fut)
            self.ledger.put_entry(p.key, entry)
            self.entries[p.key] = {**entry, "key": p.key}
            done.append({"key": p.key, **entry})
            self.emit(JobEvent("input", {"key": p.key, **entry}))
            if self.lease.lost:
                client.cancel(list(ac.futures))
                raise CubelakeError(f"job {self.manifest.name}: another run took over its lease; this run stopped "
                                    "(its finished scenes are recorded)")
            if queues[base]:
                ac.add(self._submit(client, queues[base].pop(0), base, pending, need))
        return done

    def _submit(self, client: Any, p: PlannedInput, base: str, pending: dict[str, tuple[PlannedInput, str]],
                need: dict[str, int] | None) -> Any:
        res = self.manifest.resources
        fut = client.submit(ingest_task, self.lake.url, p, res.threads_per_task, key=f"ingest-{p.key}-"
                            f"{self.record['run_id']}", retries=res.retries, pure=False, resources=need)
        pending[fut.key] = (p, base)
        return fut

    def scene_ids(self) -> list[str]:
        return sorted({str(e["scene_id"]) for e in self.entries.values()
                       if e.get("state") == "done" and e.get("scene_id")})

    def pending_steps(self, changed: bool) -> list[tuple[str, Callable[..., Any], tuple[Any, ...], Any]]:
        """The post-ingest steps to run: those whose settings or scenes changed, or that failed or never ran;
        gc also when ``grace`` has passed since it last ran (a periodic job keeps the lake clean)."""
        steps, url, ids = self.manifest.steps, self.lake.url, self.scene_ids()
        out: list[tuple[str, Callable[..., Any], tuple[Any, ...], Any]] = []
        if steps.stack is not None:
            out.append(("stack", stack_task, (url, self.manifest.name, ids, steps.stack), steps.stack))
        if steps.export is not None:
            out.append(("export", export_task, (url, steps.export), steps.export))
        if steps.gc is not None:
            out.append(("gc", gc_task, (url, steps.gc.grace), steps.gc))
        return [s for s in out if changed or self._stale(s[0], s[3], ids)]

    def _stale(self, name: str, cfg: Any, scene_ids: list[str]) -> bool:
        prev = self.ledger.step(name) or {}
        if prev.get("state") != "done" or prev.get("settings") != cfg.model_dump(mode="json"):
            return True
        if name == "gc":
            last = datetime.fromisoformat(str(prev.get("finished", "1970-01-01T00:00:00+00:00")))
            return (datetime.now(UTC) - last).total_seconds() > cfg.grace
        return bool(prev.get("scenes") != scene_ids)

    def run_steps(self, client: Any, todo: list[tuple[str, Callable[..., Any], tuple[Any, ...], Any]]
                  ) -> dict[str, Any]:
        """Run the steps one after the other, each as a task; a failure is recorded, the next step still runs."""
        ids = self.scene_ids()
        out: dict[str, Any] = {}
        for name, fn, args, cfg in todo:
            t0 = time.perf_counter()
            try:
                result = client.submit(fn, *args, key=f"{name}-{self.record['run_id']}", pure=False,
                                       retries=self.manifest.resources.retries).result()
                state = "failed" if result.get("problems") else "done"
            except Exception as exc:  # a step's failure is reported; the ingested scenes stand
                result, state = {"message": f"{type(exc).__name__}: {exc}"}, "failed"
            entry = {"state": state, "run_id": self.record["run_id"], "settings": cfg.model_dump(mode="json"),
                     "scenes": ids, "seconds": round(time.perf_counter() - t0, 3), "result": result,
                     "finished": now_iso()}
            self.ledger.put_step(name, entry)
            self.emit(JobEvent("step", {"step": name, **entry}))
            out[name] = entry
        return out


def preflight(manifest: Manifest) -> None:
    """Everything that can fail before work starts: each input's ingest settings (profiles load)."""
    for i, spec in enumerate(manifest.inputs):
        try:
            ingest_options(manifest.settings_for(spec), 1)
        except (CubelakeError, ValueError) as exc:
            raise ConfigError(f"{manifest.source}: inputs[{i}] ({spec.where}): ingest settings: {exc}") from None


def _since(ledger: Ledger) -> datetime | None:
    last = ledger.last_success()
    return datetime.fromisoformat(last["started"]) if last and last.get("started") else None


def run_job(manifest: Manifest, *, scheduler: str | None = None, force: bool = False,
            emit: Emit | None = None) -> dict[str, Any]:
    """Run ``manifest`` once; the run's record (also written to the ledger). Raises ConfigError, SchedulerError,
    JobBusyError before any work; a scene's failure is in the record, never raised."""
    from cubelake.ingest import prepare_lake

    emit = emit or (lambda event: None)
    preflight(manifest)
    lake = prepare_lake(manifest.lake)
    lake.check_writable()
    ledger = Ledger(lake, manifest.name)
    run_id = new_run_id()
    lease = ledger.acquire(run_id, manifest.resources.lease_ttl).keep()
    record: dict[str, Any] = {"run_id": run_id, "job": manifest.name, "manifest": manifest.source,
                              "manifest_hash": manifest.fingerprint(), "lake": lake.url, "started": now_iso(),
                              "state": "running", "host": socket.gethostname(), "pid": os.getpid()}
    t0 = time.perf_counter()
    try:
        ledger.put_run(record)
        skip = (str(lake.root),) if lake.is_local else ()
        entries = ledger.entries()
        plan = plan_inputs(manifest, entries, skip=skip, since=_since(ledger), force=force)
        _record_plan(record, plan, entries)
        emit(JobEvent("planned", {"todo": len(plan.todo), "skipped": len(plan.skipped),
                                  "filtered": len(plan.filtered), "notes": plan.notes}))
        run = _Run(manifest, lake, ledger, lease, record, emit, entries)
        if plan.todo or run.pending_steps(False):  # nothing to do starts no cluster
            with dask_client(manifest, scheduler) as client:
                record.update(scheduler=client.scheduler.address, dashboard=client.dashboard_link,
                              workers=len(client.scheduler_info().get("workers", {})))
                emit(JobEvent("cluster", {"scheduler": record["scheduler"], "dashboard": record["dashboard"],
                                          "workers": record["workers"]}))
                record["inputs"] = run.ingest(client, plan) if plan.todo else []
                changed = any(e.get("outcome") == "ingested" for e in record["inputs"])
                record["steps"] = run.run_steps(client, run.pending_steps(changed))
        _finish(record, t0)
    except BaseException as exc:
        record.update(state="interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
                      error=f"{type(exc).__name__}: {exc}", finished=now_iso(),
                      seconds=round(time.perf_counter() - t0, 3))
        with contextlib.suppress(Exception):
            ledger.put_run(record)
        raise
    finally:
        lease.release()
    ledger.put_run(record)
    return record


def _record_plan(record: dict[str, Any], plan: Plan, entries: dict[str, dict[str, Any]]) -> None:
    record["skipped"] = [{"input": p.name, "key": p.key, "why": why,
                          "scene_id": entries.get(p.key, {}).get("scene_id")} for p, why in plan.skipped]
    record["filtered"] = [{"input": name, "why": why} for name, why in plan.filtered]
    record["notes"] = plan.notes


def _finish(record: dict[str, Any], t0: float) -> None:
    inputs = record.get("inputs", [])
    counts = {s: sum(e["state"] == s for e in inputs) for s in ("done", "rejected", "failed")}
    counts["ingested"] = sum(e.get("outcome") == "ingested" for e in inputs)
    counts["unchanged"] = sum(e.get("outcome") == "unchanged" for e in inputs)
    counts["skipped"] = len(record.get("skipped", []))
    counts["filtered"] = len(record.get("filtered", []))
    failed_steps = [k for k, v in record.get("steps", {}).items() if v.get("state") == "failed"]
    record.update(counts=counts, finished=now_iso(), seconds=round(time.perf_counter() - t0, 3),
                  state="failed" if counts["failed"] or failed_steps else "succeeded")
