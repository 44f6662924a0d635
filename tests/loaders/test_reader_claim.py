"""A consumer about to wait for a chunk that no reader thread has started decodes it itself.

In a DataLoader worker with one decode thread, the thread cutting batches used to sit idle while the
chunks it needed queued behind others; now it takes the queued group and loads it, and the decode
thread goes on with the rest. Every chunk still ends decoded exactly once, with its own pixels.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from cubelake.loaders import LoaderMetrics, ReaderConfig
from cubelake.loaders.reader import ChunkReader
from cubelake.loaders.sources import open_sources


def test_a_queued_chunk_is_decoded_by_the_consumer_instead_of_waited_for(synth_lake: dict[str, Any]) -> None:
    src = open_sources([synth_lake["scenes"][1]], prefer=("zarr",))[0]  # scene b: every chunk stored
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []
    lock = threading.Lock()

    def decoder(raw: Any, out: Any = None) -> np.ndarray:
        name = threading.current_thread().name
        with lock:
            calls.append(name)
        if name.startswith("cubelake-chunk") and not started.is_set():  # the pool's only thread: held on chunk 0
            started.set()
            assert release.wait(30), "the consumer never came back"
        return src.decoder(raw, out)

    slow = dataclasses.replace(src, decoder=decoder)
    reader = ChunkReader([slow], ReaderConfig(threads=1, group=1), LoaderMetrics())
    keys = [(0, c) for c in range(5)]
    try:
        reader.request(keys)
        assert started.wait(30)
        last = reader.get(keys[-1])  # queued behind three others on a thread that is stuck: decoded here
        me = threading.current_thread().name
        assert calls == ["cubelake-chunk_0", me], calls
        release.set()
        got = {k: reader.get(k) for k in keys[:-1]}
    finally:
        release.set()
        reader.close()
    got[keys[-1]] = last
    cube = synth_lake["b"]
    for (_, chunk), arr in got.items():
        assert arr is not None
        cy, cx = divmod(chunk, src.grid.n_cols)
        want = cube[:, cy * 64:(cy + 1) * 64, cx * 64:(cx + 1) * 64]
        np.testing.assert_array_equal(arr[:, :want.shape[1], :want.shape[2]], want)
    assert sorted(calls) == sorted(["cubelake-chunk_0"] * 4 + [me])  # each chunk decoded once: 4 there, 1 here
    assert reader.metrics.chunks_decoded == 5
