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
