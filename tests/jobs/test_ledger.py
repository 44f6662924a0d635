"""The job's lease and ledger in the lake: conditional writes on a local folder and on S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cubelake.jobs import JobBusyError, Ledger
from cubelake.lake import AnyLake, Lake
from cubelake.object_lake import ObjectLake
from tests.conftest import S3Server


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def any_lake(request: pytest.FixtureRequest, tmp_path: Path) -> AnyLake:
    if request.param == "local":
        return Lake(tmp_path / "lake")
    server: S3Server = request.getfixturevalue("s3_server")
    bucket: str = request.getfixturevalue("s3_bucket")
    return ObjectLake(f"s3://{bucket}/lake", options=server.options)


def test_one_lease_at_a_time_names_the_holder(any_lake: AnyLake) -> None:
    ledger = Ledger(any_lake, "nightly")
    lease = ledger.acquire("run-a", ttl=60)
    with pytest.raises(JobBusyError, match=r"job nightly is already running .* run run-a on .* \(pid \d+\)"):
        Ledger(any_lake, "nightly").acquire("run-b", ttl=60)
    assert Ledger(any_lake, "other-job").acquire("run-c", ttl=60)  # another job is not blocked
    lease.release()
    again = ledger.acquire("run-b", ttl=60)
    assert ledger.lease_info()["run_id"] == "run-b"  # type: ignore[index]
    again.release()


def test_an_expired_lease_is_taken_over_and_its_holder_learns_it(any_lake: AnyLake) -> None:
    ledger = Ledger(any_lake, "nightly")
    old = ledger.acquire("run-a", ttl=0.5)
    time.sleep(0.8)
    new = Ledger(any_lake, "nightly").acquire("run-b", ttl=60)
    assert not old.renew()
    assert old.lost
    old.release()  # does not release the new holder's lease
    assert ledger.lease_info()["run_id"] == "run-b"  # type: ignore[index]
    assert new.renew()
    new.release()


@pytest.mark.serial  # time-bound: a starved renewal thread would look like a lapse
def test_a_kept_lease_stays_while_its_holder_lives(any_lake: AnyLake) -> None:
    ttl = 3.0
    ledger = Ledger(any_lake, "nightly")
    lease = ledger.acquire("run-a", ttl=ttl).keep()
    least = ttl
    end = time.time() + 1.5 * ttl  # past a lifetime: only renewals keep it
    while time.time() < end:  # it never comes near lapsing: renewed every third of its life, well before its end
        info = ledger.lease_info()
        assert info is not None
        least = min(least, info["expires"] - time.time())
        time.sleep(0.05)
    assert least > ttl / 2, f"the lease came within {least:.2f} s of lapsing (ttl {ttl} s)"
    with pytest.raises(JobBusyError):
        Ledger(any_lake, "nightly").acquire("run-b", ttl=60)
    lease.release()
    assert ledger.lease_info()["released"]  # type: ignore[index]


def test_of_many_runs_started_at_once_exactly_one_gets_the_lease(any_lake: AnyLake) -> None:
    def attempt(i: int) -> bool:
        try:
            Ledger(any_lake, "race").acquire(f"run-{i}", ttl=60)
            return True
        except JobBusyError:
            return False

    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(attempt, range(16)))
    assert sum(won) == 1


def test_a_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake")
    code = ("import sys; from cubelake.lake import Lake; from cubelake.jobs import Ledger; "
            "Ledger(Lake(sys.argv[1]), 'nightly').acquire('run-dead', ttl=3600)")
    subprocess.run([sys.executable, "-c", code, str(lake.root)], check=True, timeout=120)
    info = Ledger(lake, "nightly").lease_info()
    assert info is not None
    assert info["run_id"] == "run-dead"
    assert info["expires"] > time.time() + 3000
    lease = Ledger(lake, "nightly").acquire("run-next", ttl=60)  # no waiting for the hour
    assert Ledger(lake, "nightly").lease_info()["run_id"] == "run-next"  # type: ignore[index]
    lease.release()


def test_entries_runs_and_steps_round_trip(any_lake: AnyLake) -> None:
    ledger = Ledger(any_lake, "nightly")
    ledger.put_entry("k1", {"input": "/a.tif", "state": "done"})
    ledger.put_entry("k2", {"input": "/b.tif", "state": "failed"})
    ledger.put_run({"run_id": "20260101T000000-aaaaaa", "state": "succeeded", "started": "2026-01-01T00:00:00+00:00"})
    ledger.put_run({"run_id": "20260102T000000-bbbbbb", "state": "failed", "started": "2026-01-02T00:00:00+00:00"})
    ledger.put_step("export", {"state": "done"})
    assert {k: e["state"] for k, e in ledger.entries().items()} == {"k1": "done", "k2": "failed"}
    assert [r["run_id"] for r in ledger.runs()] == ["20260101T000000-aaaaaa", "20260102T000000-bbbbbb"]
    assert ledger.last_success()["run_id"] == "20260101T000000-aaaaaa"  # type: ignore[index]
    assert ledger.step("export") == {"state": "done", "step": "export"}
    key = "jobs/nightly/inputs/k1.json"
    assert json.loads(any_lake.store.get_text(key))["input"] == "/a.tif"  # where the layout says


def test_a_damaged_ledger_object_is_taken_as_absent(tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake")
    ledger = Ledger(lake, "nightly")
    ledger.put_entry("k1", {"input": "/a.tif", "state": "done"})
    (lake.root / "jobs" / "nightly" / "inputs" / "k1.json").write_text("{not json")
    assert ledger.entry("k1") is None
    assert ledger.entries() == {}


def test_run_ids_sort_by_time_and_never_repeat() -> None:
    import re

    from cubelake.jobs.ledger import new_run_id

    before = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    ids = [new_run_id() for _ in range(200)]
    after = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    assert all(re.fullmatch(r"\d{8}T\d{6}-[0-9a-f]{6}", i) for i in ids), ids[:3]
    assert before <= ids[0][:15] <= ids[-1][:15] <= after  # UTC time first: ids sort by when the run started
    assert len(set(ids)) == 200


def test_a_lease_says_until_when_in_utc(tmp_path: Path) -> None:
    from datetime import datetime

    ledger = Ledger(Lake(tmp_path / "lake"), "nightly")
    lease = ledger.acquire("run-a", ttl=600)
    info = ledger.lease_info()
    assert info is not None
    until = datetime.fromisoformat(info["until"]).timestamp()
    assert abs(until - (time.time() + 600)) < 5  # the time it lapses, readable, not when it was taken
    assert abs(info["expires"] - (time.time() + 600)) < 5
    lease.release()
    assert ledger.lease_info()["expires"] <= time.time()  # type: ignore[index]


def _dead_pid_below(limit: int) -> int:
    from cubelake.lake import pid_alive

    return next(p for p in range(limit - 1, 1, -1) if not pid_alive(p))


@pytest.mark.parametrize("where", ["below", "above"])
def test_a_lease_of_any_dead_pid_on_this_host_is_taken_at_once(tmp_path: Path, where: str) -> None:
    import socket

    from cubelake.lake import pid_alive

    pid = _dead_pid_below(os.getpid()) if where == "below" else \
        next(p for p in range(os.getpid() + 10_000, os.getpid() + 20_000) if not pid_alive(p))
    ledger = Ledger(Lake(tmp_path / "lake"), "nightly")
    ledger._write("jobs/nightly/lease.json", {"run_id": "run-dead", "host": socket.gethostname(), "pid": pid,
                                              "expires": time.time() + 3600}, create=True)
    lease = ledger.acquire("run-next", ttl=60)  # its holder is gone: no waiting for the hour
    assert ledger.lease_info()["run_id"] == "run-next"  # type: ignore[index]
    lease.release()


def test_a_renewal_that_meets_a_storage_blip_keeps_the_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    from cubelake.storage import StorageError

    ledger = Ledger(Lake(tmp_path / "lake"), "nightly")
    lease = ledger.acquire("run-a", ttl=60)
    body = dict(lease.body)

    def blip(*_a: object, **_k: object) -> None:
        raise StorageError("the endpoint cannot be reached")

    monkeypatch.setattr(ledger, "_write", blip)
    assert lease.renew()  # a blip: the next renewal tries again
    assert not lease.lost
    assert lease.body == body
    assert "renewing the lease failed" in caplog.text
    monkeypatch.undo()
    assert lease.renew()
    assert lease.body["expires"] > body["expires"] - 1
    lease.release()


@pytest.mark.parametrize(("mib", "readable"), [(7.5, True), (8.5, False)])
def test_a_ledger_object_over_8_mib_is_taken_as_absent(tmp_path: Path, mib: float, readable: bool) -> None:
    lake = Lake(tmp_path / "lake")
    ledger = Ledger(lake, "nightly")
    ledger.put_entry("k1", {"input": "/a.tif", "state": "done", "pad": "x" * int(mib * 1024 * 1024)})
    assert (ledger.entry("k1") is not None) is readable
