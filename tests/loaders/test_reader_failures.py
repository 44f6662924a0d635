"""No failure on a reader thread can leave the consumer waiting: every chunk ends decoded or failed.

Before the fix, an exception outside ``(OSError, ValueError, RuntimeError)`` while fetching, or
outside the codec errors while decoding, escaped on the pool thread and left the chunk's future
unresolved, so ``ChunkReader.get`` waited forever; an exception while planning a request left
futures that were never submitted. Each case runs the consumer on a thread with a deadline, so
a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cubelake.loaders import ChunkReadError, LoaderMetrics, ReaderConfig
from cubelake.loaders.reader import ChunkReader
from cubelake.loaders.sources import ChunkSource, open_sources

DEADLINE_S = 30.0


def _within_deadline(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a daemon thread; fails the test (instead of hanging) when it does not return in time."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised on the test's thread
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(DEADLINE_S)
    assert not t.is_alive(), f"the consumer still waits after {DEADLINE_S} s: a chunk's future was never resolved"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _source(synth_lake: dict[str, Any], prefer: str) -> ChunkSource:
    return open_sources([synth_lake["scenes"][1]], prefer=(prefer,))[0]


def _bad_decoder(data: Any, out: Any) -> np.ndarray:
    # what a hand-parsed header does on garbage: struct.error derives from Exception only
    raise struct.error("unpack requires a buffer of 8 bytes")


def _bad_locate(band_chunk: int, cy: int, cx: int) -> tuple[str, int, int] | None:
    raise KeyError(f"no reference for chunk {band_chunk}.{cy}.{cx}")  # e.g. a reference set missing a key


@pytest.mark.parametrize("prefer", ["zarr", "refs"])
def test_an_unexpected_decode_error_fails_the_chunk_instead_of_hanging(synth_lake: dict[str, Any],
                                                                        prefer: str) -> None:
    src = dataclasses.replace(_source(synth_lake, prefer), decoder=_bad_decoder)
    lenient = ChunkReader([src], ReaderConfig(retries=0), LoaderMetrics())
    with pytest.warns(RuntimeWarning, match=r"chunk \(row 0, col 0\).*error: unpack requires"):
        assert _within_deadline(lambda: lenient.get((0, 0))) is None
    assert lenient.metrics.failed_chunks == 1
    lenient.close()
    strict = ChunkReader([src], ReaderConfig(retries=0, strict=True), LoaderMetrics())
    with pytest.raises(ChunkReadError, match=r"scene_b.*struct.error: unpack requires a buffer"):
        _within_deadline(lambda: strict.get((0, 1)))
    strict.close()


def test_an_unexpected_error_planning_a_request_fails_its_chunks(synth_lake: dict[str, Any]) -> None:
    src = dataclasses.replace(_source(synth_lake, "zarr"), locate=_bad_locate)
    reader = ChunkReader([src], ReaderConfig(retries=0, strict=True), LoaderMetrics())
    with pytest.raises(ChunkReadError, match=r"KeyError: 'no reference for chunk 0.0.2'"):
        _within_deadline(lambda: reader.get((0, 2)))
    reader.request([(0, 3), (0, 4)])  # the prefetch path: its chunks fail too, none is left waiting
    for key in ((0, 3), (0, 4)):
        with pytest.raises(ChunkReadError, match="KeyError"):
            _within_deadline(lambda key=key: reader.get(key))
    reader.close()


def test_a_closed_reader_fails_new_requests_instead_of_queueing_them_forever(synth_lake: dict[str, Any]) -> None:
    reader = ChunkReader([_source(synth_lake, "zarr")], ReaderConfig(retries=0, strict=True), LoaderMetrics())
    assert _within_deadline(lambda: reader.get((0, 0))) is not None
    reader.close()
    with pytest.raises(ChunkReadError, match="RuntimeError: cannot schedule new futures after shutdown"):
        _within_deadline(lambda: reader.get((0, 5)))
