"""The suite's own rules, loaded by ``-p tests.plugin`` (pyproject's addopts).

- **Tests that start a process or a server are marked ``integration``**: ``make check`` leaves them out.
  A test is marked when it uses a fixture of :data:`SPAWNING_FIXTURES`, when it is marked ``s3`` (the S3
  server), when its own code (or a helper of its module) calls one of :data:`SPAWNING_CALLS`, or by hand. Whatever the marks say, an audit hook sees every process started
  (``subprocess``, ``fork``, ``posix_spawn``, ``exec``) and every socket bound while a test runs: a test that
  does either unmarked fails, naming what it started, so the fast set stays fast and honest.
- **The collected count does not fall unnoticed**: with ``--check-count`` (``make test``), a run that
  collects fewer tests than ``tests/COLLECTED`` records fails; merging tests on purpose is recorded there
  with a line saying which and why (``make record-count REASON=...``).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

#: fixtures that start a process or a server (directly or through the fixtures they use)
SPAWNING_FIXTURES = frozenset({"s3_server", "auth_s3", "repo", "s3_env", "api", "aux_lake", "browser", "cli_results",
                               "corpus_root", "corpus_runs", "framings", "server", "abc"})
#: calls in a test's own code that start a process
SPAWNING_CALLS = re.compile(r"\b(?:run_cli|cli_process|python_process|run_python|WarmProcess|subprocess\.\w+|Popen|"
                            r"run_transcript|run_shell_block|sh)\(")
#: the audit events of starting a process or binding a socket
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
                          "os.system", "socket.bind"})
#: programs the standard library runs for a lookup, on behalf of whatever library imports or loads first
#: (``platform.architecture()`` runs ``file -b`` when croniter is imported, ``platform.processor()`` runs
#: ``uname -p``, ``ctypes.util.find_library`` runs ``ldconfig -p``): not processes the test starts
LOOKUPS = frozenset({"file", "uname", "ldconfig"})
COUNT_FILE = Path(__file__).with_name("COLLECTED")


@dataclass
class _Watch:
    """What the audit hook saw during the current test (its fixtures included)."""

    item: pytest.Item | None = None
    fixture: str | None = None
    seen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in SPAWN_EVENTS or self.item is None or _is_lookup(event, args):
            return
        what = _describe(event, args)
        where = f" (in fixture {self.fixture!r})" if self.fixture else ""
        with self.lock:
            if len(self.seen) < 5:
                self.seen.append(what + where)


def _is_lookup(event: str, args: tuple[Any, ...]) -> bool:
    if event != "subprocess.Popen" or len(args) < 2:
        return False
    cmd = args[1]
    first = cmd[0] if isinstance(cmd, list | tuple) and cmd else cmd
    return isinstance(first, str | bytes | os.PathLike) and os.path.basename(os.fsdecode(first)) in LOOKUPS


def _describe(event: str, args: tuple[Any, ...]) -> str:
    if event == "subprocess.Popen" and args:
        cmd = args[1] if len(args) > 1 else args[0]
        text = " ".join(map(str, cmd)) if isinstance(cmd, list | tuple) else str(cmd)
        return f"a process: {' '.join(text.split())}"[:160]
    if event == "socket.bind":
        return f"a server socket bound to {args[1] if len(args) > 1 else '?'}"
    return f"a process ({event})"


_WATCH = _Watch()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--check-count", action="store_true",
                     help="fail if fewer tests are collected than tests/COLLECTED records")


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_WATCH.audit)


def _source(func: Any) -> str:
    try:
        return inspect.getsource(func)
    except (OSError, TypeError):
        return ""


@functools.cache
def _spawning_helpers(module: ModuleType) -> frozenset[str]:
    """The module's own functions that start processes: directly, or through one another."""
    funcs = {name: _source(f) for name, f in vars(module).items()
             if inspect.isfunction(f) and f.__module__ == module.__name__ and not name.startswith("test_")}
    found = {name for name, src in funcs.items() if SPAWNING_CALLS.search(src)}
    while True:
        calls = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(found))) + r")\(") if found else None
        more = {name for name, src in funcs.items() if name not in found and calls and calls.search(src)}
        if not more:
            return frozenset(found)
        found |= more


def _spawns_by_code(item: pytest.Item) -> bool:
    """Whether the test's own code calls a process-starting function (its module's helpers included)."""
    func, module = getattr(item, "function", None), getattr(item, "module", None)
    source = _source(func) if func is not None else ""
    if SPAWNING_CALLS.search(source):
        return True
    helpers = _spawning_helpers(module) if module is not None else frozenset()
    return any(re.search(rf"\b{re.escape(name)}\(", source) for name in helpers)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (SPAWNING_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("s3")
                or _spawns_by_code(item)):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _WATCH.item, _WATCH.seen = item, []
    yield
    _WATCH.item = None


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, None]:
    outer, _WATCH.fixture = _WATCH.fixture, fixturedef.argname
    try:
        yield
    finally:
        _WATCH.fixture = outer


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    rep = outcome.get_result()
    if call.when != "teardown" or not _WATCH.seen or item.get_closest_marker("integration"):
        return
    started = "; ".join(_WATCH.seen)
    rep.outcome = "failed"
    rep.longrepr = (f"{item.nodeid} started {started}, but is not marked integration (make check would run it): "
                    "mark it @pytest.mark.integration, or add a fixture that starts servers to "
                    "SPAWNING_FIXTURES in tests/plugin.py")


# -- the collected count --------------------------------------------------------------------------
# Every process counts what it collected before -m/-k deselected any (an xdist worker reports it to the
# controller), so the phases of make test, split by markers, each check the whole count.

_DESELECTED: list[int] = [0]
_TOTALS: list[int] = []


def recorded_count(path: Path = COUNT_FILE) -> int:
    """The count on the last line of ``tests/COLLECTED`` (``<count> <date> <reason>``)."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return int(lines[-1].split()[0])


def pytest_deselected(items: list[pytest.Item]) -> None:
    _DESELECTED[0] += len(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    _TOTALS.append(len(session.items) + _DESELECTED[0])


def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: what a worker collected."""
    if "collected_total" in getattr(node, "workeroutput", {}):
        _TOTALS.append(node.workeroutput["collected_total"])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["collected_total"] = _TOTALS[-1] if _TOTALS else 0
        return
    if not session.config.getoption("--check-count") or not _TOTALS:
        return
    collected, recorded = max(_TOTALS), recorded_count()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
    if collected < recorded:
        if reporter is not None:
            reporter.write_line(f"collected {collected} tests, fewer than the {recorded} tests/COLLECTED records: "
                                "if tests were merged or removed on purpose, record it with "
                                "`make record-count REASON='which tests, and why'`", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif reporter is not None:
        reporter.write_line(f"collected {collected} tests (tests/COLLECTED records {recorded})")
