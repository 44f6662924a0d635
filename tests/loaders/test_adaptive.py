"""Adaptive concurrency: the AIMD controller on a modelled link, then the reader on an emulated one."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cubelake.linkemu import LinkEmulator, LinkSpec
from cubelake.loaders import LoaderMetrics, ReaderConfig
from cubelake.loaders.adaptive import AimdController, Gate
from cubelake.loaders.capacity import Link, fetch_rate, requests_to_fill
from cubelake.loaders.reader import ChunkReader
from cubelake.loaders.sources import open_sources
from cubelake.storage import S3Options

from ..conftest import S3Server
from .conftest import upload_tiled_tif


def _run(ctl: AimdController, link: Link, size: float, requests: int) -> float:
    """Feed the controller completions at the rate its limit gets on ``link``; the time it all took."""
    now = 0.0
    for _ in range(requests):
        now += size / fetch_rate(link, size, ctl.limit)
        ctl.completed(int(size), now)
    return now


@pytest.mark.parametrize(("bps", "ttfb", "size"), [(200e6, 0.040, 2**20), (1e9, 0.080, 256 * 1024),
                                                    (500e6, 0.020, 64 * 1024)])
def test_the_controller_climbs_to_the_knee_and_stays_near_it(bps: float, ttfb: float, size: int) -> None:
    link = Link(bps, ttfb)
    knee = requests_to_fill(link, size)
    ctl = AimdController(lo=1, hi=64, limit=1)
    _run(ctl, link, size, 3000)
    assert knee <= ctl.limit <= knee + 2  # it stops within a request or two past the knee
    assert fetch_rate(link, size, ctl.limit) >= 0.95 * link.bytes_per_s
    assert ctl.history == sorted(ctl.history)  # only increases without throttling


def test_throttling_halves_the_limit_and_the_cap_holds() -> None:
    ctl = AimdController(lo=1, hi=6, limit=1)
    _run(ctl, Link(1e9, 0.080), 256 * 1024, 3000)
    assert ctl.limit == 6  # the knee (38) is past the cap
    assert ctl.throttled() == 3
    assert ctl.throttled() == 1
    assert ctl.throttled() == 1  # never below lo


def test_the_gate_admits_at_most_its_limit() -> None:
    gate = Gate(2)
    held, peak, lock = [0], [0], threading.Lock()

    def work() -> None:
        with gate:
            with lock:
                held[0] += 1
                peak[0] = max(peak[0], held[0])
            time.sleep(0.02)
            with lock:
                held[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set_limit(3)
    for t in threads:
        t.join(10)
    assert 2 <= peak[0] <= 3


@pytest.fixture
def big_cog(tmp_path: Path, s3_server: S3Server, s3_bucket: str) -> str:
    """A 24 x 768 x 768 int16 tiled GeoTIFF (27 MiB, 144 tiles of 64 x 64) on the test server."""
    return upload_tiled_tif(tmp_path / "big.tif", s3_server, s3_bucket, (24, 768, 768), 64, seed=5)


def _read_all(url: str, opts: S3Options, config: ReaderConfig) -> tuple[float, LoaderMetrics, list[int], Any]:
    src = open_sources([url], storage_options=opts, prefer=("cog",))[0]
    metrics = LoaderMetrics()
    reader = ChunkReader([src], config, metrics)
    keys = [(0, k) for k in range(src.grid.n_chunks)]
    t0 = time.perf_counter()
    reader.request(keys)
    first = reader.get(keys[0])
    for k in keys[1:]:
        assert reader.get(k) is not None
    elapsed = time.perf_counter() - t0
    history = reader.concurrency_history
    reader.close()
    return elapsed, metrics, history, first


def test_the_reader_finds_the_concurrency_an_emulated_link_needs(big_cog: str, s3_server: S3Server) -> None:
    with LinkEmulator(s3_server.endpoint, link=LinkSpec.preset("500mbps", ttfb_ms=40)) as emu:
        opts = S3Options.coerce({**s3_server.options, "endpoint_url": emu.endpoint})
        fixed_s, fixed_m, _, a = _read_all(big_cog, opts, ReaderConfig(threads=1, group=1, cache_bytes=1 << 30))
        adapt_s, adapt_m, history, b = _read_all(big_cog, opts, ReaderConfig(threads=1, group=1, adaptive=True,
                                                                               max_threads=16, cache_bytes=1 << 30))
    np.testing.assert_array_equal(a, b)
    assert fixed_m.inflight_peak == 1
    assert max(history) >= 4  # it grew well past the one request it started with
    assert adapt_m.inflight_peak >= 4
    assert adapt_s < fixed_s / 2  # and the scene arrived more than twice as fast


def test_an_adaptive_dataset_keeps_enough_chunks_requested_ahead(big_cog: str, s3_server: S3Server) -> None:
    from cubelake.loaders import CubeDataset, PlanSpec, Sampling

    with LinkEmulator(s3_server.endpoint, link=LinkSpec.preset("500mbps", ttfb_ms=40)) as emu:
        opts = S3Options.coerce({**s3_server.options, "endpoint_url": emu.endpoint})
        ds = CubeDataset([big_cog], storage_options=opts, prefer=("cog",), prefetch=2,
                         sampling=Sampling(size=64, stride=64, labels="none"), plan=PlanSpec(batch_size=16),
                         reader=ReaderConfig(threads=1, group=1, adaptive=True, max_threads=16))
        n = sum(len(b["scene"]) for b in ds)
    m = ds.metrics()
    assert n == ds.n_samples() == 144
    assert m.inflight_limit >= 3  # the limit grew, and the plan kept that many chunks requested (prefetch=2 alone)
    assert m.inflight_peak >= 3
    assert "adaptive limit" in m.report()


def test_an_epoch_through_faults_serves_the_same_batches(big_cog: str, s3_server: S3Server) -> None:
    """10 % of GETs answered 503/500, reset, truncated or stalled: the batches equal a fault-free epoch's, byte
    for byte (a stalled body is abandoned after the request timeout and asked again)."""
    import hashlib

    from cubelake.linkemu import FaultSpec
    from cubelake.loaders import CubeDataset, PlanSpec, Sampling

    def epoch(endpoint: str) -> list[str]:
        opts = S3Options.coerce({**s3_server.options, "endpoint_url": endpoint, "request_timeout_s": 2})
        ds = CubeDataset([big_cog], storage_options=opts, prefer=("cog",), sampling=Sampling(size=64, stride=64,
                         labels="none"), plan=PlanSpec(batch_size=16, order="local"), prefetch_batches=0,
                         reader=ReaderConfig(threads=2, adaptive=True, max_threads=8, strict=True))
        return [hashlib.sha256(b["image"].numpy().tobytes()).hexdigest() for b in ds]

    clean = epoch(s3_server.endpoint)
    faults = FaultSpec(rate=0.10, kinds="503,500,reset,truncate,stall", retry_after_s=0)
    with LinkEmulator(s3_server.endpoint, link=LinkSpec.preset("1gbps", ttfb_ms=20), faults=faults, seed=3) as emu:
        faulty = epoch(emu.endpoint)
    assert faulty == clean
    assert len(clean) == 9
    assert sum(emu.stats.faults.values()) >= 3  # faults were injected and survived (retried by the client)
    assert emu.stats.faults["stall"] >= 1


def _window(ctl: AimdController, rate: float, start: float, nbytes: int = 1000) -> float:
    """One measurement window of completions at ``rate`` bytes/s from ``start``; the time it ended."""
    now = start
    for _ in range(ctl.window):
        now += nbytes / rate
        ctl.completed(nbytes, now)
    return now


def test_the_limit_starts_inside_its_bounds_and_decides_once_a_window() -> None:
    assert AimdController(lo=3, hi=5, limit=1).limit == 3
    assert AimdController(lo=3, hi=5, limit=9).limit == 5
    ctl = AimdController(lo=1, hi=8, limit=1, window=4)
    for i in range(3):
        assert ctl.completed(100, 1.0 + i) == 1
    assert ctl.history == []  # not a full window yet
    assert ctl.completed(100, 4.0) == 2  # the first window: nothing to compare with, one more
    assert ctl.history == [2]
    same = AimdController(window=2)
    same.completed(100, 5.0)
    same.completed(100, 5.0)  # no time passed: no rate to judge by
    assert same.history == []


def test_one_more_request_is_kept_only_while_it_pays() -> None:
    ctl = AimdController(lo=1, hi=8, limit=1, window=4)
    t = _window(ctl, 1e6, 0.0)  # 1 in flight (a first window counts from its first completion: 1.33 MB/s)
    assert ctl.limit == 2
    t = _window(ctl, 3e6, t)  # 2: more than twice as fast
    assert ctl.limit == 3
    t = _window(ctl, 3.6e6, t)  # 3: +20 %, less than half of the +50 % a third request could bring (3.75)
    assert ctl.limit == 3
    t = _window(ctl, 3.7e6, t)  # still below 3.75 MB/s
    assert ctl.limit == 3
    _window(ctl, 3.9e6, t)  # now it pays
    assert ctl.limit == 4
    assert ctl.history == [2, 3, 3, 3, 4]


def test_throttling_forgets_what_was_measured_above_the_new_limit_and_measures_anew() -> None:
    ctl = AimdController(lo=1, hi=8, limit=1, window=4)
    t = 0.0
    for rate in (1e6, 3e6, 4e6, 5e6):
        t = _window(ctl, rate, t)
    assert ctl.limit == 5
    assert sorted(ctl._best) == [1, 2, 3, 4]
    assert ctl.throttled() == 2
    assert ctl.history[-1] == 2
    assert sorted(ctl._best) == [1, 2]  # what 3 and 4 did is no guide after a throttle
    for i in range(3):
        ctl.completed(1000, t + 50.0 + i)  # a new window, counted from after the throttle
    assert ctl.history[-1] == 2
    ctl.completed(1000, t + 53.0)
    assert len(ctl.history) == 6  # decided after exactly one window
    at_hi = AimdController(lo=1, hi=2, limit=2, window=4)
    _window(at_hi, 1e9, 0.0)
    assert at_hi.limit == 2  # never past hi
    assert at_hi.history == [2]


def test_a_gate_of_zero_still_admits_one_and_a_raised_limit_admits_the_waiting() -> None:
    gate = Gate(0)
    entered = threading.Event()

    def second() -> None:
        with gate:
            entered.set()

    with gate:  # one holder even with limit 0
        t = threading.Thread(target=second)
        t.start()
        assert not entered.wait(0.2)  # the limit is 1: the second waits
        gate.set_limit(0)
        assert not entered.wait(0.1)
        gate.set_limit(2)
        assert entered.wait(5)  # raising the limit wakes it
    t.join(5)


def test_the_controller_keeps_an_increase_that_pays_exactly_its_share_also_after_a_throttle() -> None:
    ctl = AimdController(lo=1, hi=8, limit=1, window=2, efficiency=0.5)
    ctl.completed(1000, 0.0)
    ctl.completed(1000, 1.0)  # 1 in flight: 2000 B/s
    assert ctl.limit == 2
    ctl.completed(1500, 1.5)
    ctl.completed(1500, 2.0)  # 2: 3000 B/s, exactly 2000 x (1 + 0.5 x 1): it pays
    assert ctl.limit == 3
    ctl.completed(2000, 2.5)
    ctl.completed(2000, 3.0)  # 3: 4000 B/s, past 3000 x 1.25
    assert ctl.limit == 4
    assert ctl.throttled() == 2
    ctl.completed(1500, 10.0)  # the first completion after the throttle starts the window, bytes and all
    ctl.completed(1500, 11.0)  # 3000 B/s at 2: exactly what paid before
    assert ctl.limit == 3


def test_a_gate_lowered_to_zero_with_no_holder_still_admits_one() -> None:
    gate = Gate(3)
    gate.set_limit(0)
    done = threading.Event()

    def enter() -> None:
        with gate:
            done.set()

    t = threading.Thread(target=enter, daemon=True)
    t.start()
    assert done.wait(5)
    t.join(5)
