"""``cubelake link emulate``: help, usage errors (exit 2), and a real run stopped by Ctrl-C."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from cubelake.cli import app
from cubelake.cli.link import _stop_signals
from tests.conftest import S3Server, no_traceback

runner = CliRunner()


def test_help_names_the_options() -> None:
    res = runner.invoke(app, ["link", "emulate", "--help"])
    assert res.exit_code == 0, res.output
    for opt in ("--upstream", "--preset", "--ttfb-ms", "--fault-rate", "--faults", "--seed", "--port"):
        assert opt in res.output


@pytest.mark.parametrize(("args", "needles"), [
    (["--preset", "5gigabananas"], ["--preset", "'5gigabananas'", "1gbps, 500mbps, 200mbps, none"]),
    (["--faults", "503,teapot", "--fault-rate", "0.1"], ["--faults", "'teapot': not a fault kind"]),
    (["--fault-rate", "2"], ["--fault-rate", "between 0 and 1"]),
    (["--fault-methods", "put"], ["--fault-methods", "'put'"]),
    (["--ttfb-ms", "-5", "--preset", "1gbps"], ["--ttfb-ms", "ttfb_ms=-5"]),
    (["--upstream", "https://s3.amazonaws.com"], ["--upstream", "https is not supported"]),
])
def test_bad_arguments_exit_2_naming_them(args: list[str], needles: list[str]) -> None:
    base = [] if "--upstream" in args else ["--upstream", "http://127.0.0.1:9"]
    res = runner.invoke(app, ["link", "emulate", *base, *args])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.replace("│", " ").split())
    for needle in needles:
        assert needle in text, text
    assert "Traceback" not in res.output


@pytest.mark.s3
@pytest.mark.parametrize("interrupts", [1, 2])
def test_runs_until_ctrl_c_then_reports(s3_server: S3Server, s3_bucket: str, interrupts: int) -> None:
    """Ctrl-C stops it and it reports; so do several in a row (``timeout -s INT`` signals twice: the child,
    then its process group): the second lands while the emulator shuts down."""
    s3_server.client().put_object(Bucket=s3_bucket, Key="k", Body=b"hello")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cubelake.cli", "link", "emulate", "--upstream", s3_server.endpoint,
         "--preset", "200mbps", "--ttfb-ms", "20", "--fault-rate", "1", "--faults", "503", "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        assert started["event"] == "started"
        assert "200 Mbit/s, TTFB 20 ms" in started["link"]
        u = urlsplit(started["endpoint"])
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
        conn.request("GET", f"/{s3_bucket}/k")
        resp = conn.getresponse()
        assert resp.status == 503
        assert resp.getheader("Retry-After") == "1"
        for _ in range(interrupts):  # back to back, as ``timeout`` sends them
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    no_traceback(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    stopped = json.loads(out.splitlines()[-1])
    assert stopped["event"] == "stopped"
    assert stopped["stats"]["requests"] == 1
    assert stopped["stats"]["faults"]["503"] == 1


def test_every_stop_signal_is_absorbed_until_the_block_ends() -> None:
    """Ctrl-C and SIGTERM, however many, set the stop event instead of raising (one raised during the
    emulator's shutdown killed the command with exit 130); the previous handlers come back afterwards."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with _stop_signals() as stop:
        assert not stop.is_set()
        for sig in (signal.SIGINT, signal.SIGINT, signal.SIGTERM, signal.SIGINT):
            signal.raise_signal(sig)
        assert stop.is_set()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
