"""A job's ledger and lease, kept in the lake itself (a local folder or an object store).

Layout under ``<lake>/jobs/<job>/`` (keys from :func:`cubelake.lake.job_key`)::

    lease.json            who runs the job now, until when (one run of a job at a time)
    inputs/<key>.json     per input: its files' fingerprints, content and settings hash, state, report
    steps/<step>.json     per post-ingest step (stack, export, gc): what it last saw and did
    runs/<run id>.json    per run: start, end, state, counts and per-input outcomes

Every object is written whole (``Store.put`` is atomic on disk and on S3), so a client killed at
any moment leaves each object either old or new. The lease is the only object two runs race
for; it is taken and renewed with conditional writes (create-only, ``If-Match`` on its ETag),
which local folders and S3-compatible stores both honour, so of two runs started at once
exactly one gets it. A lease whose holder is gone is taken over: at once when the holder was
a process on this host that no longer exists, else once it has expired (the holder renews it
every third of its time to live).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cubelake.errors import CubelakeError
from cubelake.lake import AnyLake, job_key, pid_alive
from cubelake.storage import CommitConflict, StorageError, Store, read_json_info

__all__ = ["JobBusyError", "Lease", "Ledger", "input_key", "new_run_id"]

log = logging.getLogger(__name__)

_MAX_JSON = 8 * 1024 * 1024


class JobBusyError(CubelakeError):
    """Another run of the same job holds its lease."""


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus randomness."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + f"-{uuid.uuid4().hex[:6]}"


def input_key(name: str) -> str:
    """The ledger key of an input (its path or URL): a hash, so any name makes a safe key."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Ledger:
    """Read and write one job's ledger objects in ``lake``."""

    def __init__(self, lake: AnyLake, job: str) -> None:
        self.lake = lake
        self.job = job
        self.store: Store = lake.store

    def _key(self, *parts: str) -> str:
        return job_key(self.job, *parts)

    def _read(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        return read_json_info(self.store, key, _MAX_JSON)

    def _write(self, key: str, data: dict[str, Any], **cond: Any) -> str | None:
        return self.store.put(key, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), **cond).etag

    def _all(self, folder: str) -> Iterator[dict[str, Any]]:
        for info in self.store.list(self._key(folder)):
            if info.key.endswith(".json"):
                data, _ = self._read(info.key)
                if data is not None:
                    yield data

    # -- inputs -----------------------------------------------------------------
    def entry(self, key: str) -> dict[str, Any] | None:
        return self._read(self._key("inputs", f"{key}.json"))[0]

    def entries(self) -> dict[str, dict[str, Any]]:
        return {str(e.get("key")): e for e in self._all("inputs")}

    def put_entry(self, key: str, entry: dict[str, Any]) -> None:
        self._write(self._key("inputs", f"{key}.json"), {**entry, "key": key})

    # -- steps ------------------------------------------------------------------
    def step(self, name: str) -> dict[str, Any] | None:
        return self._read(self._key("steps", f"{name}.json"))[0]

    def put_step(self, name: str, data: dict[str, Any]) -> None:
        self._write(self._key("steps", f"{name}.json"), {**data, "step": name})

    # -- runs -------------------------------------------------------------------
    def put_run(self, run: dict[str, Any]) -> None:
        self._write(self._key("runs", f"{run['run_id']}.json"), run)

    def runs(self) -> list[dict[str, Any]]:
        """Every recorded run, oldest first."""
        return sorted(self._all("runs"), key=lambda r: str(r.get("run_id", "")))

    def last_success(self) -> dict[str, Any] | None:
        ok = [r for r in self.runs() if r.get("state") == "succeeded"]
        return ok[-1] if ok else None

    # -- lease ------------------------------------------------------------------
    def lease_info(self) -> dict[str, Any] | None:
        return self._read(self._key("lease.json"))[0]

    def acquire(self, run_id: str, ttl: float) -> Lease:
        """Take the job's lease for ``run_id``, or raise :class:`JobBusyError` naming its holder."""
        key = self._key("lease.json")
        me = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid()}
        for _ in range(20):
            held, etag = self._read(key)
            if held is not None and etag is not None and _alive(held):
                raise JobBusyError(
                    f"job {self.job} is already running in the lake {self.lake.url}: run {held.get('run_id')} on "
                    f"{held.get('host')} (pid {held.get('pid')}), lease renewed until {held.get('until')}. Wait for "
                    "it to finish (cubelake jobs status), or stop that run; a lease whose holder died is taken over "
                    "once it expires")
            body = {**me, "acquired": now_iso(), "expires": time.time() + ttl, "until": _iso_in(ttl)}
            try:
                new = self._write(key, body, create=True) if etag is None else self._write(key, body, if_match=etag)
            except CommitConflict:
                continue  # another run wrote it between our read and write: look again
            if held is not None and not held.get("released"):
                log.warning("job %s: took over the lease of run %s (its holder is gone)", self.job,
                            held.get("run_id"))
            return Lease(self, key, body, new, ttl)
        raise JobBusyError(f"job {self.job}: its lease in {self.lake.url} kept changing under 20 attempts; another "
                           "run is starting; try again")


def _iso_in(seconds: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds, UTC).isoformat(timespec="seconds")


def _alive(held: dict[str, Any]) -> bool:
    """Whether a lease's holder may still be running."""
    if held.get("released"):
        return False
    expires = held.get("expires")
    if not isinstance(expires, int | float) or expires < time.time():
        return False
    pid = held.get("pid")
    if held.get("host") == socket.gethostname() and isinstance(pid, int) and not isinstance(pid, bool):
        return pid == os.getpid() or pid_alive(pid)
    return True


@dataclass
class Lease:
    """A held lease; :meth:`keep` renews it in the background, :meth:`release` gives it up."""

    ledger: Ledger
    key: str
    body: dict[str, Any]
    etag: str | None
    ttl: float
    lost: bool = False

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def renew(self) -> bool:
        """Extend the lease; False (and :attr:`lost`) when another run took it meanwhile."""
        with self._lock:
            if self.lost:
                return False
            body = {**self.body, "expires": time.time() + self.ttl, "until": _iso_in(self.ttl)}
            try:
                self.etag = self.ledger._write(self.key, body, if_match=self.etag)
            except CommitConflict:
                self.lost = True
                log.error("job %s: lost its lease to another run; this run stops submitting work",
                          self.ledger.job)
                return False
            except StorageError as exc:  # a blip: the next renewal tries again before the lease runs out
                log.warning("job %s: renewing the lease failed (%s)", self.ledger.job, exc)
                return True
            self.body = body
            return True

    def keep(self) -> Lease:
        """Renew every third of the time to live until :meth:`release`."""
        def loop() -> None:
            while not self._stop.wait(self.ttl / 3):
                if not self.renew():
                    return

        self._thread = threading.Thread(target=loop, name=f"cubelake-lease-{self.ledger.job}", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            if self.lost:
                return
            try:
                self.ledger._write(self.key, {**self.body, "released": now_iso(), "expires": 0},
                                   if_match=self.etag)
            except (CommitConflict, StorageError) as exc:
                log.warning("job %s: releasing the lease failed (%s); it expires by itself", self.ledger.job, exc)
