"""Ctrl-C is never lost: one dropped by a finalizer is raised again at the next progress event."""

from __future__ import annotations

import gc
import signal

import pytest

from cubelake.cli._render import progress_bars
from cubelake.ingest import ProgressEvent


class _InterruptedFinalizer:
    """A finalizer during which Ctrl-C arrives: Python raises it inside ``__del__`` and drops it."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)
        gc.disable()  # any bytecode: the handler runs here, and its KeyboardInterrupt is dropped
        gc.enable()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("enabled", [True, False])
def test_a_dropped_ctrl_c_is_raised_at_the_next_progress_event(enabled: bool) -> None:
    event = ProgressEvent("scene.tif", "scan", 1, 4)
    with progress_bars(enabled) as on_event:
        on_event(event)  # nothing pending
        _InterruptedFinalizer()  # finalized (and the interrupt dropped) right here
        with pytest.raises(KeyboardInterrupt):
            on_event(event)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is restored


def test_a_ctrl_c_outside_a_finalizer_is_raised_where_it_arrives() -> None:
    with progress_bars(False) as on_event, pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        on_event(ProgressEvent("scene.tif", "done"))  # and the ingest would not go on either


# Ctrl-C while distributed's ``sync`` waits for a coroutine its busy event loop has not started yet: the real
# distributed code path whose ``cancel`` callback raises NameError on the loop thread (tornado logs it)
_SYNC_INTERRUPTED = """
import asyncio, os, signal, sys, threading, time
from cubelake.cli._render import configure_output
import distributed
from distributed.utils import LoopRunner, sync
configure_output(int(sys.argv[1]), False)
runner = LoopRunner(asynchronous=False)
runner.start()
runner.loop.add_callback(time.sleep, 0.5)
threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    sync(runner.loop, asyncio.sleep, 5)
except KeyboardInterrupt:
    print("interrupted")
time.sleep(0.8)
runner.stop()
"""


@pytest.mark.integration
@pytest.mark.parametrize("verbose", ["0", "2"])
def test_ctrl_c_in_a_dask_wait_logs_no_error(verbose: str) -> None:
    """The failure seen in ``jobs run``: a traceback from ``sync.<locals>.cancel`` after Ctrl-C, at any -v."""
    import subprocess

    from tests.conftest import python_process

    proc = python_process(_SYNC_INTERRUPTED, verbose, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert out.strip() == "interrupted"
    for needle in ("cancel", "NameError", "Traceback"):
        assert needle not in err, err


_LOGGED = """
import logging, sys
from cubelake.cli._render import configure_output
configure_output(int(sys.argv[1]), False)
try:
    {}["band"]
except KeyError:
    logging.getLogger("cubelake.ingest").exception("scene x.tif: cannot read the header")
"""


@pytest.mark.integration
@pytest.mark.parametrize(("verbose", "traceback"), [("0", False), ("1", False), ("2", True)])
def test_a_logged_exception_is_one_line_unless_vv(verbose: str, traceback: bool) -> None:
    import subprocess

    from tests.conftest import python_process

    proc = python_process(_LOGGED, verbose, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert ("Traceback" in err) is traceback, err
    if not traceback:
        assert " ".join(err.split()).startswith("ERROR cubelake.ingest: scene x.tif: cannot read the header: "
                                                "KeyError: 'band'"), err
