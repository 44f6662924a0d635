"""The warm command starts of the tests (``tests/zygote.py``, ``tests/bin/cubelake``) behave as cold ones: the
same output and exit status, a process of its own that signals reach, the caller's streams, folder and
environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import zygote
from tests.conftest import ROOT, cli_process, python_process, run_cli

SHIM = ROOT / "tests" / "bin" / "cubelake"


def _shim_env() -> dict[str, str]:
    return {**os.environ, "CUBELAKE_TEST_ZYGOTE": zygote.socket_path(),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("args", [["--version"], ["catalog", "search", "--lake", "/nonexistent/lake"],
                                  ["ingest", "--no-such-option"]])
def test_a_warm_command_says_and_exits_what_a_cold_one_does(args: list[str]) -> None:
    cold, warm = run_cli(*args, cold=True), run_cli(*args)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)


def test_the_shim_hands_the_command_its_streams_folder_and_environment(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    line = (f"{SHIM} --help > {out}; echo rc=$?; {SHIM} lake --lake {tmp_path}/none 2>&1 | head -1; "
            f"cd {tmp_path} && CUBELAKE_LAKE=./there {SHIM} catalog stats; echo rc=$?")
    res = subprocess.run(["bash", "-c", line], env=_shim_env(), capture_output=True, text=True, timeout=120)
    assert out.read_text() == run_cli("--help", cold=True).stdout  # a redirect of the caller's stdout
    lines = res.stdout.splitlines()
    assert lines[0] == "rc=0", res.stdout + res.stderr
    missing = run_cli("lake", "--lake", f"{tmp_path}/none", cold=True)
    assert lines[1] == (missing.stdout + missing.stderr).splitlines()[0]  # stderr into the caller's pipe
    there = run_cli("catalog", "stats", cwd=tmp_path, env={"CUBELAKE_LAKE": "./there"}, cold=True)
    assert lines[-1] == f"rc={there.returncode}" != "rc=0"
    assert res.stderr == there.stderr  # its folder and environment: the same lake, named the same way


def test_signals_reach_the_command_through_the_shim_and_a_warm_process(tmp_path: Path) -> None:
    code = "import time; print('ready', flush=True); time.sleep(60)"
    sleeper = python_process(code, stdout=subprocess.PIPE, text=True)
    assert sleeper.stdout.readline() == "ready\n"
    sleeper.send_signal(signal.SIGINT)
    sleeper.communicate(timeout=30)
    assert sleeper.returncode == 1  # KeyboardInterrupt, uncaught: as python -c ends
    lake = tmp_path / "lake"
    assert run_cli("ingest", "--lake", str(lake), str(ROOT / "README.md")).returncode in (0, 1)  # a lake to serve
    proc = subprocess.Popen([str(SHIM), "catalog", "serve", "--lake", str(lake), "--port", "0"], env=_shim_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "http://127.0.0.1:" in proc.stdout.readline()  # serving
    proc.send_signal(signal.SIGINT)  # Ctrl-C to the shim reaches the server, which stops cleanly
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # the CLI's exit status for an interruption
    assert "Traceback" not in err


def test_a_warm_process_is_its_own_process_that_sigkill_reaches() -> None:
    sleeper = python_process("import time; time.sleep(60)")
    assert sleeper.pid not in (os.getpid(), os.getppid())
    time.sleep(0.2)
    assert os.getpgid(sleeper.pid) == sleeper.pid  # a session and group of its own, as a new command has
    sleeper.kill()
    assert sleeper.wait(30) == -signal.SIGKILL
    sleeper.kill()  # a process that ended already: nothing happens
    quick = cli_process("--help", stdout=subprocess.PIPE, text=True)
    out, _ = quick.communicate(timeout=60)
    assert quick.returncode == 0
    assert out == run_cli("--help").stdout


@pytest.mark.parametrize("light", [False, True])
def test_the_light_zygote_has_the_commands_imports_and_not_torch(light: bool) -> None:
    """A command forked from the light zygote starts with what ``cubelake ingest`` imports (the corpus measures its
    peak memory against a cold run's budget), and without torch's ~180 MiB."""
    code = "import sys; print(sorted(m for m in ('torch', 'rasterio', 'zarr', 'cubelake.ingest') if m in sys.modules))"
    proc = zygote.WarmProcess([], code=code, stdout=subprocess.PIPE, text=True, light=light)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.split("\n")[0] == str(sorted(["cubelake.ingest", "rasterio", "zarr", *([] if light else ["torch"])]))


def test_communicate_again_after_a_timeout_loses_nothing() -> None:
    """As ``Popen.communicate``: after ``TimeoutExpired`` the caller kills the process and calls it again, and gets
    everything the process wrote (the corpus harness reports a hung command's output)."""
    code = "import sys, time; print('before', flush=True); print('err', file=sys.stderr, flush=True); time.sleep(60)"
    proc = zygote.WarmProcess([], code=code, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, light=True)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=1.5)
    os.killpg(proc.pid, signal.SIGKILL)  # its own session: the whole group, as the harness does
    out, err = proc.communicate(timeout=30)
    assert (out, err) == ("before\n", "err\n")
    assert proc.returncode == -signal.SIGKILL
