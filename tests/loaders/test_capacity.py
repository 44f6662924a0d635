"""The capacity planner's arithmetic on inputs whose answers are worked out by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cubelake.loaders import LoaderMetrics
from cubelake.loaders.capacity import (
    Link,
    Workload,
    fetch_rate,
    pipeline_rate,
    predict,
    requests_to_fill,
)
from cubelake.loaders.metrics import latency_bucket

LINK = Link(bandwidth_bps=200e6, ttfb_s=0.040)  # 25 MB/s
MIB = 1024 * 1024


def _work(compute_s: float = 0.5, decode: float = 400e6) -> Workload:
    return Workload(bytes_per_sample=1e6, batch_size=8, request_bytes=MIB, decode_bytes_per_s=decode,
                    compute_s=compute_s)


def test_fetch_rate_is_requests_over_their_time_capped_by_the_link() -> None:
    per_request = 0.040 + MIB / 25e6  # 81.9 ms
    assert fetch_rate(LINK, MIB, 1) == pytest.approx(MIB / per_request)  # 12.8 MB/s
    assert fetch_rate(LINK, MIB, 2) == 25e6  # 25.6 MB/s asked: the link's 25 MB/s
    assert requests_to_fill(LINK, MIB) == 2  # ceil(0.95 * (1 + 0.04 * 25e6 / 2**20)) = ceil(1.856)
    assert requests_to_fill(Link(1e9, 0.080), 256 * 1024) == 38  # ceil(0.95 * (1 + 0.08 * 125e6 / 262144)) = ceil(37.2)


def test_too_few_requests_in_flight_is_latency_bound() -> None:
    p = predict(LINK, _work(), concurrency=1)
    assert p.fetch_s == pytest.approx(8e6 / fetch_rate(LINK, MIB, 1))  # 0.625 s
    assert p.decode_s == pytest.approx(0.02)
    assert p.load_s == pytest.approx(p.fetch_s)
    assert p.utilisation == pytest.approx(0.5 / p.fetch_s)  # 0.80
    assert p.stall_fraction == pytest.approx(1 - 0.5 / p.fetch_s)
    assert p.samples_per_s == pytest.approx(8 / p.fetch_s)
    assert p.required_bps == pytest.approx(128e6)
    assert p.bandwidth_ok
    assert p.binding == "latency"
    assert p.recommended_concurrency == 2
    assert "keep 2 in flight" in p.explanation


def test_enough_requests_make_it_compute_bound() -> None:
    p = predict(LINK, _work(), concurrency=2)
    assert (p.binding, p.utilisation, p.stall_fraction) == ("compute", 1.0, 0.0)
    assert p.samples_per_s == pytest.approx(16.0)  # 8 samples per 0.5 s
    assert p.recommended_prefetch == 2  # ceil(0.32 / 0.5) + 1
    assert p.recommended_cache_bytes == int(2 * MIB + 3 * 8e6)
    assert "compute-bound: the model takes 500 ms per batch" in p.explanation
    assert "(the link needs 128 of its 200 Mbit/s)" in p.explanation  # 8 MB a batch every 0.5 s


def test_a_model_faster_than_the_link_is_bandwidth_bound() -> None:
    p = predict(LINK, _work(compute_s=0.2), concurrency=4)
    assert p.binding == "bandwidth"
    assert p.required_bps == pytest.approx(320e6)
    assert not p.bandwidth_ok
    assert p.load_s == pytest.approx(0.32)  # 8 MB at 25 MB/s
    assert p.utilisation == pytest.approx(0.2 / 0.32)
    assert p.recommended_prefetch == 3  # ceil(0.32 / 0.2) + 1
    assert "320 Mbit/s and the link carries 200" in p.explanation


def test_slow_decoding_is_decode_bound_and_the_cache_budget_caps_concurrency() -> None:
    p = predict(LINK, _work(decode=10e6), concurrency=4)
    assert p.binding == "decode"
    assert p.load_s == pytest.approx(0.8)
    far = Link(1e9, 0.080)
    assert predict(far, _work(), concurrency=1).recommended_concurrency == 11  # ceil(0.95*(1+0.08*125e6/2**20))
    assert predict(far, _work(), concurrency=1, cache_budget_bytes=8 * MIB).recommended_concurrency == 4


@pytest.mark.parametrize(("kw", "match"), [({"bandwidth_bps": 0, "ttfb_s": 0.01}, "bandwidth"),
                                           ({"bandwidth_bps": 1e9, "ttfb_s": -1}, "first byte")])
def test_impossible_links_are_refused(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Link(**kw)
    with pytest.raises(ValueError, match="compute_s"):
        _work(compute_s=0)


def test_metrics_explain_a_stall_with_hand_worked_numbers() -> None:
    m = LoaderMetrics(samples=64, batches=4, bytes_fetched=8_000_000, fetch_s=1.6, decode_s=0.4, assemble_s=0.1,
                      wait_s=0.3, wall_s=0.8, threads=2)
    assert m.bytes_per_sample == 125_000
    assert m.throughput_bps == pytest.approx(80e6)  # 64 Mbit in 0.8 s
    assert m.load_s_per_batch == pytest.approx((1.6 + 0.4) / 2 / 4)  # 0.25 s: fetch + decode over 2 threads
    assert m.compute_s_per_batch == pytest.approx((0.8 - 0.3) / 4)  # 0.125 s
    assert m.utilisation_bound == pytest.approx(0.5)
    assert m.to_dict()["utilisation"] == pytest.approx(1 - 0.3 / 0.8)
    for s in (0.003, 0.040, 0.041, 0.045, 0.050, 0.9):
        m.request_started()
        m.request_done(s)
    assert m.inflight_peak == 1
    assert 40 <= m.latency_ms(0.5) <= 40 * 1.19  # the bucket holding 40-45 ms, 19 % wide
    assert 900 <= m.latency_ms(0.99) <= 900 * 1.19
    merged = LoaderMetrics.merge([m, LoaderMetrics.from_dict(json.loads(json.dumps(m.to_dict())))])
    assert sum(merged.request_hist) == 12
    assert merged.latency_ms(0.5) == m.latency_ms(0.5)
    assert "utilisation bound 50%, measured 62%" in m.report()
    assert [latency_bucket(s) for s in (0, 1e-4, 2e-4, 100.0, 1e6)] == [0, 0, 4, 80, 95]  # the last holds the rest


def test_the_first_batch_waits_for_its_chunks_and_the_epoch_counts_it() -> None:
    """Compute-bound (T_c 0.5 s, T_d 0.34 s at 2 in flight) with a 25 MB first round: the fill is
    0.04 + 25e6/25e6 + 25e6/400e6 = 1.1025 s, the epoch of 100 batches 1.1025 + 100·0.5 = 51.1025 s."""
    work = dataclasses.replace(_work(), first_batch_bytes=25e6, epoch_batches=100)
    p = predict(LINK, work, concurrency=2)
    assert p.binding == "compute"
    assert p.stall_fraction == 0.0  # the steady state does not stall
    assert p.fill_s == pytest.approx(1.1025)
    assert p.epoch_s == pytest.approx(51.1025)
    assert p.epoch_stall_fraction == pytest.approx(1.1025 / 51.1025)
    assert p.epoch_samples_per_s == pytest.approx(800 / 51.1025)
    assert "first batch waits 1.1 s" in p.explanation
    assert "chunks_per_round" in p.explanation


def test_a_supply_bound_epoch_is_paced_by_the_supply_not_the_fill() -> None:
    """Bandwidth-bound (T_d 0.32 s > T_c 0.2 s): the fill overlaps the supply; 100·0.32 + 0.2 = 32.2 s."""
    work = dataclasses.replace(_work(compute_s=0.2), first_batch_bytes=25e6, epoch_batches=100)
    p = predict(LINK, work, concurrency=4)
    assert p.epoch_s == pytest.approx(32.2)
    assert p.epoch_samples_per_s == pytest.approx(800 / 32.2)
    assert p.epoch_stall_fraction == pytest.approx(1 - 20 / 32.2)
    assert "first batch waits" not in p.explanation


def test_without_an_epoch_length_the_epoch_figures_are_the_steady_state() -> None:
    p = predict(LINK, _work(compute_s=0.2), concurrency=4)
    assert (p.fill_s, p.epoch_s) == (0.0, 0.0)
    assert p.epoch_samples_per_s == pytest.approx(p.samples_per_s)
    assert p.epoch_stall_fraction == pytest.approx(p.stall_fraction)
    with pytest.raises(ValueError, match="first_batch_bytes"):
        dataclasses.replace(_work(), epoch_batches=-1)


def test_threads_that_fetch_and_decode_in_turn_by_mean_value_analysis() -> None:
    """s = 1 MB on 25 MB/s (0.04 s on the link), r = 0.04 s, 100 MB/s decoded by 2 threads (0.02 s a
    request each): n=1: R 0.04, X 1/0.1 = 10/s, Q 0.4; n=2: R 0.04·1.4 = 0.056, X 2/0.116 = 17.24/s."""
    link = Link(bandwidth_bps=200e6, ttfb_s=0.04)
    assert pipeline_rate(link, 1e6, 1, 0.02) == pytest.approx(1e6 / 0.1)
    assert pipeline_rate(link, 1e6, 2, 0.02) == pytest.approx(2e6 / 0.116)
    assert pipeline_rate(link, 1e6, 200, 0.02) == pytest.approx(25e6, rel=0.01)  # the link, at most
    assert pipeline_rate(link, 1e6, 4, 0.0) <= fetch_rate(link, 1e6, 4)  # never above the bound
    work = Workload(bytes_per_sample=1e6, batch_size=8, request_bytes=1e6, decode_bytes_per_s=100e6, compute_s=0.1,
                    decode_threads=2)
    p = predict(link, work, concurrency=2)
    assert p.fetch_bytes_per_s == pytest.approx(2e6 / 0.116)
    assert p.load_s == pytest.approx(8e6 / (2e6 / 0.116))  # 0.464 s, where the bound says 0.32 s
    assert p.binding == "latency"  # two threads half busy decoding leave the link partly idle
    assert pipeline_rate(link, 1e6, p.recommended_concurrency, 0.02) >= 0.95 * 25e6
    assert pipeline_rate(link, 1e6, p.recommended_concurrency - 1, 0.02) < 0.95 * 25e6
    assert f"keep {p.recommended_concurrency} in flight" in p.explanation
