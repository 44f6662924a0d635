"""Hedged requests and the SlowDown backoff: the waiting logic with plain callables, then the reader on an
emulated link that stalls or throttles (a real moto server behind a real :class:`LinkEmulator`)."""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from cubelake.linkemu import FaultSpec, LinkEmulator, LinkSpec
from cubelake.linkemu.policy import decide_fault
from cubelake.linkemu.spec import FaultKind
from cubelake.loaders import LoaderMetrics, ReaderConfig
from cubelake.loaders.hedge import hedge_delay, hedged
from cubelake.loaders.metrics import LATENCY_BUCKETS, latency_bucket
from cubelake.loaders.reader import ChunkReader
from cubelake.loaders.sources import ChunkSource, open_sources
from cubelake.storage import S3Options, StorageError, is_throttle, object_at

from ..conftest import S3Server
from .conftest import upload_tiled_tif

# -- the waiting logic ------------------------------------------------------------------------------


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    ex = ThreadPoolExecutor(4)
    yield ex
    ex.shutdown(wait=False)


def _attempts(*plans: tuple[float, str | Exception]) -> tuple[Callable[[], str], list[float]]:
    """A callable whose n-th call sleeps ``plans[n][0]`` s, then returns or raises ``plans[n][1]``; and its start times."""
    starts: list[float] = []
    lock = threading.Lock()

    def call() -> str:
        with lock:
            n = len(starts)
            starts.append(time.perf_counter())
        delay, outcome = plans[n]
        time.sleep(delay)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return call, starts


def test_a_fast_call_is_not_duplicated(pool: ThreadPoolExecutor) -> None:
    call, starts = _attempts((0.0, "a"))
    out = hedged(call, 0.5, pool.submit)
    assert (out.value, out.hedged, out.won) == ("a", False, False)
    assert len(starts) == 1


def test_a_slow_call_gets_one_duplicate_after_the_delay_and_the_first_answer_wins(pool: ThreadPoolExecutor) -> None:
    call, starts = _attempts((2.0, "slow"), (0.05, "quick"))
    t0 = time.perf_counter()
    out = hedged(call, 0.3, pool.submit)
    took = time.perf_counter() - t0
    assert (out.value, out.hedged, out.won) == ("quick", True, True)
    assert len(starts) == 2
    assert starts[1] - starts[0] >= 0.29  # not before the delay
    assert 0.34 <= took < 1.0  # the stalled primary is not waited for


def test_a_primary_that_answers_after_the_duplicate_started_still_wins(pool: ThreadPoolExecutor) -> None:
    call, _ = _attempts((0.4, "primary"), (2.0, "backup"))
    out = hedged(call, 0.2, pool.submit)
    assert (out.value, out.hedged, out.won) == ("primary", True, False)


@pytest.mark.serial  # a time bound: run alone
def test_a_failed_primary_waits_for_the_duplicate(pool: ThreadPoolExecutor) -> None:
    call, _ = _attempts((0.3, OSError("reset")), (0.4, "backup"))
    t0 = time.perf_counter()
    out = hedged(call, 0.2, pool.submit)
    assert (out.value, out.won) == ("backup", True)
    assert time.perf_counter() - t0 >= 0.55  # the duplicate's answer (0.2 + 0.4 s), not the primary's error


def test_a_failed_duplicate_waits_for_the_primary_and_two_failures_raise_the_primarys(
        pool: ThreadPoolExecutor) -> None:
    call, _ = _attempts((0.5, "primary"), (0.0, OSError("reset")))
    assert hedged(call, 0.2, pool.submit).value == "primary"
    call, _ = _attempts((0.4, OSError("primary failed")), (0.0, OSError("backup failed")))
    with pytest.raises(OSError, match="primary failed"):
        hedged(call, 0.2, pool.submit)


def test_the_delay_is_the_floor_until_enough_latencies_then_their_quantile() -> None:
    hist = [0] * LATENCY_BUCKETS
    hist[latency_bucket(0.8)] = 19
    assert hedge_delay(0.3, hist, 0.95) == 0.3  # too few requests (under 20) to say what slow is
    hist[latency_bucket(0.8)] += 1
    assert 0.8 <= hedge_delay(0.3, hist, 0.95) < 0.8 * 1.2  # the p95 bucket's upper edge
    hist[latency_bucket(0.8)] += 5
    assert 0.8 <= hedge_delay(0.3, hist, 0.95) < 0.8 * 1.2  # more than enough: still the quantile
    hist[latency_bucket(0.01)] += 1000
    assert hedge_delay(0.3, hist, 0.95) == 0.3  # never below the floor


def test_a_hedged_result_is_immutable() -> None:
    import dataclasses

    from cubelake.loaders.hedge import Hedged

    h = Hedged(1, hedged=True, won=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.won = True  # type: ignore[misc]


# -- the reader on an emulated link -----------------------------------------------------------------

SEED_SEARCH = range(1, 500)


def _stall_seed(rate: float, chunks: int) -> int:
    """A seed whose first ``chunks`` GETs stall at least twice and whose first ``2 * chunks`` never stall two in a
    row (with one request in flight, a stalled request's duplicate is the next GET: a double stall would take
    the stall time, hedged or not)."""
    faults = FaultSpec(rate=rate, kinds="stall")
    for seed in SEED_SEARCH:
        stalls = [decide_fault(faults, seed, i) is FaultKind.STALL for i in range(2 * chunks)]
        if sum(stalls[:chunks]) >= 2 and not any(a and b for a, b in itertools.pairwise(stalls)):
            return seed
    raise AssertionError("no seed found")  # pragma: no cover


@pytest.fixture
def small_tif(tmp_path: Path, s3_server: S3Server, s3_bucket: str) -> str:
    """A 4 x 256 x 256 int16 tiled GeoTIFF (16 tiles of 64 x 64, 32 KiB each) on the test server."""
    return upload_tiled_tif(tmp_path / "small.tif", s3_server, s3_bucket, (4, 256, 256), 64, seed=7)


@pytest.fixture
def small_cog(small_tif: str, s3_server: S3Server) -> ChunkSource:
    """``small_tif`` opened over the clean endpoint (so the header read never meets a fault: only the chunk
    reads go through the link under test)."""
    return open_sources([small_tif], storage_options=S3Options.coerce(s3_server.options), prefer=("cog",))[0]


def _over(src: ChunkSource, s3_server: S3Server, endpoint: str, **options: object) -> ChunkSource:
    return dataclasses.replace(src, storage_options=S3Options.coerce({**s3_server.options, "endpoint_url": endpoint,
                                                                      **options}))


def _read_all(src: ChunkSource, config: ReaderConfig) -> tuple[float, LoaderMetrics, list[np.ndarray]]:
    metrics = LoaderMetrics()
    reader = ChunkReader([src], config, metrics)
    keys = [(0, k) for k in range(src.grid.n_chunks)]
    t0 = time.perf_counter()
    reader.request(keys)
    chunks = [reader.get(k) for k in keys]
    elapsed = time.perf_counter() - t0
    t1 = time.perf_counter()
    reader.close()
    assert time.perf_counter() - t1 < 1.0  # close() does not wait for a stalled loser
    assert all(c is not None for c in chunks)
    return elapsed, metrics, [np.array(c) for c in chunks]


def _stalled_read(src: ChunkSource, s3_server: S3Server, seed: int, stall_s: float, config: ReaderConfig,
                  clean: list[np.ndarray]) -> tuple[float, LoaderMetrics, int]:
    """Every chunk read through a link where a quarter of the GETs stall ``stall_s``; checked against ``clean``."""
    with LinkEmulator(s3_server.endpoint, link=LinkSpec(ttfb_ms=10), seed=seed,
                      faults=FaultSpec(rate=0.25, kinds="stall", stall_s=stall_s)) as emu:
        took, m, got = _read_all(_over(src, s3_server, emu.endpoint, request_timeout_s=60, max_retries=0), config)
        stalls = emu.stats.faults["stall"]
    for a, b in zip(got, clean, strict=True):
        np.testing.assert_array_equal(a, b)
    return took, m, stalls


@pytest.mark.serial  # a time bound: run alone
def test_hedging_cuts_the_stall_of_a_slow_request(small_cog: ChunkSource, s3_server: S3Server) -> None:
    """A quarter of the GETs stall halfway through their body: hedged, the scene arrives in well under the
    stall time, byte for byte as over a clean link; not hedged, it waits out every stall."""
    n = small_cog.grid.n_chunks
    seed = _stall_seed(0.25, n)
    config = ReaderConfig(threads=1, group=1, retries=0, strict=True)
    _, clean_m, clean = _read_all(small_cog, config)
    assert clean_m.hedges == 0

    took, m, stalls = _stalled_read(small_cog, s3_server, seed, 20, dataclasses.replace(config, hedge_after_s=0.3),
                                    clean)
    assert stalls >= 2
    assert m.hedges >= stalls  # every stalled request was duplicated
    assert m.hedge_wins >= stalls  # and lost to its duplicate
    assert m.hedges <= stalls + 2  # and the quick ones were (nearly) never duplicated
    assert took < 10.0
    assert f"{m.hedges} hedged requests ({m.hedge_wins} won)" in m.report()

    # the same link, not hedged, with a stall of 2 s (not 20: the test stays short)
    plain_took, plain_m, plain_stalls = _stalled_read(small_cog, s3_server, seed, 2, config, clean)
    assert plain_m.hedges == 0
    assert plain_stalls >= 2
    assert plain_took >= plain_stalls * 2  # each stall waited out (one request in flight)
    assert took < plain_took / 2


@pytest.mark.serial  # a time bound: run alone
def test_hedging_is_off_by_default_and_a_quick_link_is_not_duplicated(small_cog: ChunkSource) -> None:
    _, m, _ = _read_all(small_cog, ReaderConfig(threads=2, group=1))
    assert m.hedges == m.hedge_wins == 0
    assert ReaderConfig().hedge_after_s is None
    _, m, _ = _read_all(small_cog, ReaderConfig(threads=2, group=1, hedge_after_s=5.0))
    assert m.requests == small_cog.grid.n_chunks
    assert m.hedges == 0


# -- throttling ---------------------------------------------------------------------------------------


def _real_503(url: str, s3_server: S3Server) -> StorageError:
    """The error a 503 SlowDown from the emulator becomes (obstore's retries off)."""
    with LinkEmulator(s3_server.endpoint, faults=FaultSpec(rate=1.0, kinds="503", retry_after_s=3)) as emu:
        opts = S3Options.coerce({**s3_server.options, "endpoint_url": emu.endpoint, "max_retries": 0})
        store, path = object_at(url, opts)
        with pytest.raises(StorageError) as info:
            store.get_ranges(path, [0], [100])
    return info.value


def test_a_real_503_slowdown_is_a_throttle(small_tif: str, s3_server: S3Server) -> None:
    real = _real_503(small_tif, s3_server)  # the S3 body's <Code>SlowDown</Code> is past obstore's first line
    assert str(real).startswith(f"{small_tif}: cannot read ranges of: ")
    assert "status code: 503 Service Unavailable" in str(real)
    assert is_throttle(real)


@pytest.mark.parametrize(("text", "throttle"), [
    ("Generic S3 error: Error performing GET http://h/b/k in 2ms - Server returned non-2xx status code: "
     "503 Service Unavailable: <?xml version=\"1.0\"?><Error><Code>SlowDown</Code>", True),
    ("s3://b/k: cannot read ranges of: Generic S3 error: ... status code: 429 Too Many Requests: ", True),
    ("HTTP status server error (503 Service Unavailable) for url (https://h/b/k)", True),
    ("<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>", True),
    ("The server is busy: Slow Down", True),
    ("Generic S3 error: ... status code: 500 Internal Server Error: <Code>InternalError</Code>", False),
    ("s3://b/scene_503.tif: cannot read ranges of: the endpoint cannot be reached", False),
    ("s3://b/k: got 503 bytes for range 0-1024", False),
    ("s3://b/slowdown-tests/k: no such object", False),
    ("error decoding response body: connection reset by peer", False),
])
def test_throttles_are_told_from_other_errors(text: str, throttle: bool) -> None:
    assert is_throttle(OSError(text)) is throttle


def _fail_all(src: ChunkSource, config: ReaderConfig, keys: int) -> tuple[float, LoaderMetrics]:
    metrics = LoaderMetrics()
    reader = ChunkReader([src], config, metrics)
    t0 = time.perf_counter()
    tif = src.pieces(0, 0)[0].url
    with pytest.warns(RuntimeWarning, match=rf"chunk \(row 0, col \d\).*failed after 3 attempts: {re.escape(tif)}: "
                      r"cannot read ranges of: .*503 Service Unavailable"):
        assert all(reader.get((0, k)) is None for k in range(keys))
    took = time.perf_counter() - t0
    reader.close()
    return took, metrics


def test_a_throttling_store_is_backed_off_at_least_slowdown_s(small_cog: ChunkSource, s3_server: S3Server) -> None:
    """Every GET answered 503 SlowDown: each chunk fails cleanly after its retries, each backoff drawn up to
    ``slowdown_s`` (not the 0.05 s of ``backoff_s``), and the throttles are counted."""
    keys = 4
    config = ReaderConfig(threads=1, group=1, retries=2, backoff_s=0.01, slowdown_s=0.5)
    with LinkEmulator(s3_server.endpoint, faults=FaultSpec(rate=1.0, kinds="503", retry_after_s=3)) as emu:
        src = _over(small_cog, s3_server, emu.endpoint, max_retries=0)
        slow, m = _fail_all(src, config, keys)
        quick, m0 = _fail_all(src, dataclasses.replace(config, slowdown_s=0.0), keys)
        served_503 = emu.stats.faults["503"]
    assert served_503 == 2 * keys * 3  # obstore did not retry: every attempt is the reader's
    assert m.failed_chunks == m0.failed_chunks == keys
    assert m.retries == m0.retries == keys * 2
    assert m.throttled == m0.throttled == keys * 3
    # 8 backoffs of uniform(0, 0.5 s): 2 s on average, under 0.6 s with odds of 1e-4; without the floor at most
    # 4 x (0.01 + 0.02) s
    assert 0.6 < slow < 10.0
    assert quick < slow
    assert "12 throttled" in m.report()
