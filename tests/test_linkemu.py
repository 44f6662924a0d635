"""The link emulator: its pure parts table-driven, then the proxy in front of a real moto server,
observed by raw HTTP clients (http.client) and by cubelake's own Store (obstore, SigV4)."""

from __future__ import annotations

import http.client
import http.server
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import h11
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cubelake.errors import ConfigError, LinkEmulatorError
from cubelake.linkemu import (
    FaultKind,
    FaultSpec,
    LinkEmulator,
    LinkSpec,
    TokenBucket,
    decide_fault,
    parse_fault_mix,
    parse_rate_mbps,
)
from cubelake.linkemu._http import client_response, upstream_request, whole_response
from cubelake.linkemu.policy import cut_point, error_response, slice_bytes, ttfb_s
from cubelake.storage import Store

from .conftest import S3Server

MB = 1_000_000

# -- pure parts ----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "mbps"), [
    ("1gbps", 1000.0), ("500mbps", 500.0), ("200mbps", 200.0), ("none", None), ("NONE", None),
    ("300mbps", 300.0), ("2.5gbps", 2500.0), ("800kbps", 0.8), ("100 Mbit/s", 100.0), ("1Gbit", 1000.0),
])
def test_rates_parse_to_megabits(text: str, mbps: float | None) -> None:
    assert parse_rate_mbps(text) == mbps


@pytest.mark.parametrize("text", ["5 bananas", "fast", "0mbps", "-3mbps", "", "mbps", "1e3mbps"])
def test_bad_rates_are_named(text: str) -> None:
    with pytest.raises(ConfigError, match=r"not a link preset or rate|above 0") as err:
        parse_rate_mbps(text)
    assert repr(text) in str(err.value)


def test_presets_default_to_40_ms_and_none_shapes_nothing() -> None:
    link = LinkSpec.preset("500mbps")
    assert (link.rate_mbps, link.ttfb_ms, link.bytes_per_s) == (500.0, 40.0, 62_500_000.0)
    assert LinkSpec.preset("1gbps", ttfb_ms=80).ttfb_ms == 80
    assert LinkSpec.preset("none") == LinkSpec()
    assert not LinkSpec.preset("none").shaped
    assert LinkSpec.preset("none", ttfb_ms=20).describe() == "no bandwidth cap, TTFB 20 ms"
    assert LinkSpec.preset("1gbps", jitter_ms=5).describe() == "1 Gbit/s, TTFB 40 ± 5 ms"
    with pytest.raises(ConfigError, match="ttfb_ms"):
        LinkSpec(ttfb_ms=-1)


@pytest.mark.parametrize(("given_", "mix"), [
    ("503,500", ((FaultKind.SLOWDOWN, 1.0), (FaultKind.INTERNAL, 1.0))),
    ("503:3, reset , truncate:0.5", ((FaultKind.SLOWDOWN, 3.0), (FaultKind.RESET, 1.0), (FaultKind.TRUNCATE, 0.5))),
    (["stall", "SlowDown"], ((FaultKind.STALL, 1.0), (FaultKind.SLOWDOWN, 1.0))),
    ({"500": 2, "internal": 1, FaultKind.RESET: 0.5}, ((FaultKind.INTERNAL, 3.0), (FaultKind.RESET, 0.5))),
])
def test_fault_mixes_parse(given_: object, mix: object) -> None:
    assert parse_fault_mix(given_) == mix  # type: ignore[arg-type]
    assert FaultSpec(rate=0.1, kinds=given_).mix == mix  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "needle"), [
    ({"kinds": "503,teapot"}, "'teapot': not a fault kind"), ({"kinds": "503:x"}, "weight 'x'"),
    ({"kinds": ""}, "no fault kinds"), ({"rate": 1.5}, "between 0 and 1"),
    ({"methods": "PUT"}, "methods"), ({"retry_after_s": -1}, "retry_after_s"),
])
def test_bad_fault_specs_say_why(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        FaultSpec(**kw)  # type: ignore[arg-type]


def test_token_bucket_queues_takers_at_the_rate() -> None:
    b = TokenBucket.full(rate=1000.0, burst=100.0, now=0.0)
    assert b.reserve(100, 0.0) == 0.0  # the burst goes at once
    assert b.reserve(100, 0.0) == pytest.approx(0.1)  # then one rate's worth per second
    assert b.reserve(100, 0.0) == pytest.approx(0.2)  # a second taker queues behind the first
    assert b.reserve(50, 0.15) == pytest.approx(0.1)  # 150 bytes of debt left at 0.15 s, and 50 more
    assert b.reserve(10, 10.0) == 0.0  # an idle link refills, but only up to the burst
    assert b.tokens == pytest.approx(90.0)


@given(st.lists(st.tuples(st.integers(1, 5000), st.floats(0, 0.01)), min_size=1, max_size=200))
def test_token_bucket_never_exceeds_rate_plus_burst(takes: list[tuple[int, float]]) -> None:
    """Senders that send when told to: by any time t, at most burst + rate*t bytes have gone."""
    rate, burst = 1e5, 4000.0
    b = TokenBucket.full(rate, burst, 0.0)
    now, sent = 0.0, 0
    for n, think in takes:
        now += think
        now += b.reserve(n, now)
        sent += n
        assert sent <= burst + rate * now + 1e-6


def test_fault_decisions_are_seeded_and_weighted() -> None:
    spec = FaultSpec(rate=0.2, kinds="503:3,reset")
    draws = [decide_fault(spec, 7, i) for i in range(20_000)]
    assert draws == [decide_fault(spec, 7, i) for i in range(20_000)]
    assert draws != [decide_fault(spec, 8, i) for i in range(20_000)]
    hit = [d for d in draws if d is not None]
    assert len(hit) / len(draws) == pytest.approx(0.2, abs=0.01)
    assert hit.count(FaultKind.SLOWDOWN) / len(hit) == pytest.approx(0.75, abs=0.02)
    assert set(hit) == {FaultKind.SLOWDOWN, FaultKind.RESET}
    assert all(decide_fault(FaultSpec(rate=1.0, kinds="stall"), 1, i) is FaultKind.STALL for i in range(100))
    assert all(decide_fault(FaultSpec(rate=0.0), 1, i) is None for i in range(100))


def test_jitter_is_seeded_and_bounded() -> None:
    link = LinkSpec(ttfb_ms=40, jitter_ms=20)
    vals = [ttfb_s(link, 3, i) for i in range(1000)]
    assert vals == [ttfb_s(link, 3, i) for i in range(1000)]
    assert 0.020 <= min(vals) < 0.022
    assert 0.058 < max(vals) <= 0.060
    assert ttfb_s(LinkSpec(ttfb_ms=10, jitter_ms=50), 3, 0) >= 0


def test_slices_cuts_and_error_bodies() -> None:
    assert slice_bytes(None) == 64 * 1024
    assert slice_bytes(25e6) == 50_000  # 200 Mbit/s: 2 ms of the link
    assert slice_bytes(1000.0) == 1024
    assert (cut_point(1000, 0), cut_point(1, 0), cut_point(None, 10), cut_point(None, 1)) == (500, 0, 5, 1)
    err = error_response(FaultKind.SLOWDOWN, "/b/k<&>", "RID1", 3)
    assert (err.status, err.reason) == (503, "Slow Down")
    assert ("Retry-After", "3") in err.headers
    assert ("Content-Type", "application/xml") in err.headers
    assert b"<Code>SlowDown</Code>" in err.body
    assert b"<Resource>/b/k&lt;&amp;&gt;</Resource>" in err.body
    err500 = error_response(FaultKind.INTERNAL, "/", "R", 3)
    assert err500.status == 500
    assert not any(k == "Retry-After" for k, _ in err500.headers)


def _server_got(raw: bytes) -> h11.Request:
    """The request h11 reads from ``raw`` as the proxy's client side does."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    event = conn.next_event()
    assert isinstance(event, h11.Request)
    return event


_SIGNED = (b"GET /bkt/a%20b.bin?x-id=GetObject HTTP/1.1\r\nHost: 127.0.0.1:8123\r\nX-Amz-Date: 20261201T000000Z\r\n"
           b"x-amz-content-sha256: UNSIGNED-PAYLOAD\r\nAuthorization: AWS4-HMAC-SHA256 Credential=k/20261201/us-east-1/s3/"
           b"aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=ab12\r\n"
           b"Range: bytes=0-99\r\nConnection: keep-alive\r\n\r\n")


def test_requests_go_upstream_with_the_fields_the_client_signed() -> None:
    """Names in their case, values and Host unchanged: byte for byte (Host first, as here)."""
    client = h11.Connection(h11.CLIENT)
    assert client.send(upstream_request(_server_got(_SIGNED), ("127.0.0.1", 9000))) == _SIGNED
    # a value's surrounding blanks go (SigV4's canonical form trims them too); an HTTP/1.0 request
    # without a Host goes as HTTP/1.1 with the upstream's
    old = _server_got(b"PUT /b/k HTTP/1.0\r\nx-amz-meta-a:  v  \r\nContent-Length: 3\r\n\r\n")
    out = h11.Connection(h11.CLIENT).send(upstream_request(old, ("10.0.0.1", 9000)))
    assert out == b"PUT /b/k HTTP/1.1\r\nHost: 10.0.0.1:9000\r\nx-amz-meta-a: v\r\nContent-Length: 3\r\n\r\n"


def test_responses_get_the_client_sides_connection_field() -> None:
    up = h11.Response(status_code=200, reason=b"OK", headers=[("Connection", "close"), ("Keep-Alive", "timeout=5"),
                                                              ("x-amz-id", "1"), ("Content-Length", "3")])
    assert client_response(up).headers.raw_items() == [(b"x-amz-id", b"1"), (b"Content-Length", b"3")]
    assert (b"Connection", b"close") in client_response(up, close=True).headers.raw_items()
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    server.next_event()
    assert server.send(client_response(up)) == b"HTTP/1.1 200 OK\r\nx-amz-id: 1\r\nContent-Length: 3\r\n\r\n"
    events = whole_response(502, "Bad Gateway", [("Content-Type", "text/plain")], b"why", head_only=True)
    assert [type(e) for e in events] == [h11.Response, h11.EndOfMessage]  # a HEAD's answer: no body, its length
    assert (b"Content-Length", b"3") in events[0].headers.raw_items()  # type: ignore[union-attr]


def test_bad_upstreams_and_unstarted_use_are_refused() -> None:
    for url in ("https://s3.amazonaws.com", "127.0.0.1:9000", "http://h:1/prefix", "ftp://x"):
        with pytest.raises(ConfigError, match="upstream"):
            LinkEmulator(url)
    emu = LinkEmulator("http://127.0.0.1:9")
    with pytest.raises(LinkEmulatorError, match="not running"):
        _ = emu.endpoint


@pytest.mark.integration
def test_a_port_in_use_is_named() -> None:
    with LinkEmulator("http://127.0.0.1:9") as first:
        taken = first.port
        with pytest.raises(LinkEmulatorError, match=f"cannot listen on 127.0.0.1:{taken}"):
            LinkEmulator("http://127.0.0.1:9", port=taken).start()


# -- through a real S3-protocol server ----------------------------------------------------


@pytest.fixture
def obj(s3_server: S3Server, s3_bucket: str) -> tuple[str, bytes]:
    """A 16 MB object of seeded random bytes: ``(key, data)``."""
    data = np.random.default_rng(0).integers(0, 256, 16 * MB, dtype=np.uint8).tobytes()
    s3_server.client().put_object(Bucket=s3_bucket, Key="blob.bin", Body=data)
    return "blob.bin", data


def _target(endpoint: str, bucket: str, key: str, method: str = "get_object") -> str:
    """A presigned path+query for ``key`` as reached through ``endpoint`` (signed for its host:port)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    u = urlsplit(client.generate_presigned_url(method, Params={"Bucket": bucket, "Key": key}))
    return f"{u.path}?{u.query}"


def _conn(endpoint: str, timeout: float = 30) -> http.client.HTTPConnection:
    u = urlsplit(endpoint)
    return http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout)


def _timed_get(conn: http.client.HTTPConnection, target: str, headers: dict[str, str] | None = None,
               ) -> tuple[float, float, bytes, http.client.HTTPResponse]:
    """``(time to the response head, time of the body, body, response)`` of one GET."""
    t0 = time.perf_counter()
    conn.request("GET", target, headers=headers or {})
    resp = conn.getresponse()
    t1 = time.perf_counter()
    body = resp.read()
    return t1 - t0, time.perf_counter() - t1, body, resp


@pytest.mark.serial  # a time bound: run alone
@pytest.mark.s3
def test_time_to_first_byte_is_the_configured_one(s3_server: S3Server, s3_bucket: str,
                                                  obj: tuple[str, bytes]) -> None:
    direct = []
    for _ in range(7):  # moto closes every connection: a fresh one each time, as through the proxy
        conn = _conn(s3_server.endpoint)
        direct.append(_timed_get(conn, _target(s3_server.endpoint, s3_bucket, obj[0]), {"Range": "bytes=0-99"})[0])
        conn.close()
    with LinkEmulator(s3_server.endpoint, link=LinkSpec(ttfb_ms=40)) as emu:
        conn = _conn(emu.endpoint)  # one kept-alive connection for all of them
        target = _target(emu.endpoint, s3_bucket, obj[0])
        got = [_timed_get(conn, target, {"Range": "bytes=0-99"}) for _ in range(15)]
    assert all(body == obj[1][:100] and resp.status == 206 for _, _, body, resp in got)
    med = statistics.median(t for t, *_ in got) * 1000
    assert 40 <= med <= 40 + 25, (med, statistics.median(direct) * 1000)
    assert emu.stats.requests == 15


@pytest.mark.serial  # a time bound: run alone
@pytest.mark.s3
@pytest.mark.parametrize("preset", ["200mbps", "1gbps"])
def test_bandwidth_is_the_cap(s3_server: S3Server, s3_bucket: str, obj: tuple[str, bytes], preset: str) -> None:
    key, data = obj
    size = 8 * MB if preset == "200mbps" else 16 * MB
    with LinkEmulator(s3_server.endpoint, link=LinkSpec.preset(preset, ttfb_ms=0)) as emu:
        conn = _conn(emu.endpoint)
        _, secs, body, resp = _timed_get(conn, _target(emu.endpoint, s3_bucket, key), {"Range": f"bytes=0-{size - 1}"})
    assert resp.status == 206
    assert body == data[:size]
    want = size / emu.link.bytes_per_s  # type: ignore[operator]
    assert secs == pytest.approx(want, rel=0.15), f"{size * 8 / secs / 1e6:.0f} Mbit/s through {preset}"


@pytest.mark.serial  # a time bound: run alone
@pytest.mark.s3
def test_concurrent_downloads_share_the_cap(s3_server: S3Server, s3_bucket: str, obj: tuple[str, bytes]) -> None:
    key, data = obj
    size = 6 * MB
    results: list[bytes] = []
    with LinkEmulator(s3_server.endpoint, link=LinkSpec.preset("200mbps", ttfb_ms=0)) as emu:
        target = _target(emu.endpoint, s3_bucket, key)

        def fetch(i: int) -> None:
            rng = f"bytes={i * size}-{(i + 1) * size - 1}"
            results.append(_timed_get(_conn(emu.endpoint), target, {"Range": rng})[2])

        threads = [threading.Thread(target=fetch, args=(i,)) for i in range(2)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        secs = time.perf_counter() - t0
    assert sorted(results) == sorted([data[:size], data[size:2 * size]])
    assert secs == pytest.approx(2 * size / 25e6, rel=0.15), f"{2 * size * 8 / secs / 1e6:.0f} Mbit/s for two"


def _faulty(s3_server: S3Server, kind: str, **kw: object) -> LinkEmulator:
    return LinkEmulator(s3_server.endpoint, faults=FaultSpec(rate=1.0, kinds=kind, **kw), seed=1)  # type: ignore[arg-type]


@pytest.mark.s3
@pytest.mark.parametrize(("kind", "status", "code"), [("503", 503, b"SlowDown"), ("500", 500, b"InternalError")])
def test_injected_s3_errors(s3_server: S3Server, s3_bucket: str, obj: tuple[str, bytes], kind: str, status: int,
                            code: bytes) -> None:
    with _faulty(s3_server, kind, retry_after_s=3) as emu:
        conn = _conn(emu.endpoint)
        target = _target(emu.endpoint, s3_bucket, obj[0])
        for _ in range(2):  # the connection stays open after an injected error
            _, _, body, resp = _timed_get(conn, target)
            assert resp.status == status
            assert resp.getheader("Retry-After") == ("3" if kind == "503" else None)
            assert resp.getheader("Content-Type") == "application/xml"
            assert f"<Code>{code.decode()}</Code>".encode() in body
            assert f"<Resource>/{s3_bucket}/{obj[0]}</Resource>".encode() in body
        head = _conn(emu.endpoint)  # faults apply to GET only: a HEAD goes through
        head.request("HEAD", _target(emu.endpoint, s3_bucket, obj[0], "head_object"))
        assert head.getresponse().status == 200
    assert emu.stats.faults == {**dict.fromkeys(["503", "500", "reset", "truncate", "stall"], 0), kind: 2}
    assert emu.stats.requests == 3


@pytest.mark.s3
def test_reset_mid_body(s3_server: S3Server, s3_bucket: str, obj: tuple[str, bytes]) -> None:
    with _faulty(s3_server, "reset") as emu:
        conn = _conn(emu.endpoint)
        conn.request("GET", _target(emu.endpoint, s3_bucket, obj[0]))
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Length") == str(len(obj[1]))
        with pytest.raises(ConnectionResetError):
            resp.read()
    assert emu.stats.faults["reset"] == 1


@pytest.mark.s3
def test_truncated_body_is_shorter_than_promised(s3_server: S3Server, s3_bucket: str, obj: tuple[str, bytes]) -> None:
    with _faulty(s3_server, "truncate") as emu:
        conn = _conn(emu.endpoint)
        conn.request("GET", _target(emu.endpoint, s3_bucket, obj[0]), headers={"Range": "bytes=0-999999"})
        resp = conn.getresponse()
        assert resp.getheader("Content-Length") == "1000000"
        with pytest.raises(http.client.IncompleteRead) as err:
            resp.read()
    assert err.value.partial == obj[1][:500_000]
    assert emu.stats.faults["truncate"] == 1


@pytest.mark.serial  # a time bound: run alone
@pytest.mark.s3
def test_stalled_body_outlasts_a_client_timeout_and_close_ends_it(s3_server: S3Server, s3_bucket: str,
                                                                  obj: tuple[str, bytes]) -> None:
    emu = _faulty(s3_server, "stall").start()  # stall_s: 600 by default
    conn = _conn(emu.endpoint, timeout=0.5)
    conn.request("GET", _target(emu.endpoint, s3_bucket, obj[0]), headers={"Range": "bytes=0-99999"})
    resp = conn.getresponse()
    assert resp.status == 206
    assert resp.read(50_000) == obj[1][:50_000]  # the first half comes, then nothing
    with pytest.raises(TimeoutError):
        resp.read(1)
    t0 = time.perf_counter()
    emu.close()
    assert time.perf_counter() - t0 < 2
    assert emu.stats.faults["stall"] == 1


@pytest.mark.s3
def test_a_short_stall_is_a_hiccup_a_patient_client_survives(s3_server: S3Server, s3_bucket: str,
                                                             obj: tuple[str, bytes]) -> None:
    with _faulty(s3_server, "stall", stall_s=0.3) as emu:
        head, secs, body, resp = _timed_get(_conn(emu.endpoint), _target(emu.endpoint, s3_bucket, obj[0]),
                                            {"Range": "bytes=0-99999"})
    assert resp.status == 206
    assert body == obj[1][:100_000]
    # the whole exchange: the stall starts when the emulator has sent the head, which a busy client may read a
    # few ms later (the body alone measured 0.296 s under load)
    assert head + secs >= 0.3
    assert emu.stats.faults["stall"] == 1


@pytest.mark.s3
def test_faults_on_all_methods_answer_uploads_too(s3_server: S3Server, s3_bucket: str) -> None:
    with LinkEmulator(s3_server.endpoint, faults=FaultSpec(rate=1.0, kinds="503", methods="all")) as emu:
        conn = _conn(emu.endpoint)
        for _ in range(2):  # the upload's body was read: the connection stays usable
            conn.request("PUT", _target(emu.endpoint, s3_bucket, "new.bin", "put_object"), body=b"x" * 100_000)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 503
    assert "Contents" not in s3_server.client().list_objects_v2(Bucket=s3_bucket)  # never reached the upstream


@pytest.mark.s3
def test_same_seed_same_faults(s3_server: S3Server, s3_bucket: str, obj: tuple[str, bytes]) -> None:
    def outcomes(seed: int) -> list[int]:
        with LinkEmulator(s3_server.endpoint, faults=FaultSpec(rate=0.5, kinds="503,500"), seed=seed) as emu:
            conn = _conn(emu.endpoint)
            target = _target(emu.endpoint, s3_bucket, obj[0])
            return [_timed_get(conn, target, {"Range": "bytes=0-9"})[3].status for _ in range(24)]

    first = outcomes(5)
    assert first == outcomes(5)
    assert first != outcomes(6)
    spec = FaultSpec(rate=0.5, kinds="503,500")
    assert first == [{None: 206, FaultKind.SLOWDOWN: 503, FaultKind.INTERNAL: 500}[decide_fault(spec, 5, i)]
                     for i in range(24)]


@pytest.mark.s3
def test_store_reads_through_faults_byte_identical(s3_server: S3Server, s3_bucket: str) -> None:
    """obstore signs for the proxy, retries the injected 503/500s, and gets exactly what a direct read gets."""
    direct = Store(f"s3://{s3_bucket}/lake", s3_server.options)
    rng = np.random.default_rng(3)
    blobs = {f"scenes/s{i}/chunk.bin": rng.integers(0, 256, 300_000 + i, dtype=np.uint8).tobytes() for i in range(6)}
    for key, data in blobs.items():
        direct.put(key, data)
    starts, ends = [0, 1000, 150_000, 299_000], [10, 5000, 200_000, 300_000]
    faults = FaultSpec(rate=0.2, kinds="503,500", retry_after_s=0)
    with LinkEmulator(s3_server.endpoint, link=LinkSpec(ttfb_ms=5), faults=faults, seed=11) as emu:
        via = Store(f"s3://{s3_bucket}/lake", {**s3_server.options, "endpoint_url": emu.endpoint, "max_retries": 10})
        assert sorted(i.key for i in via.list("scenes")) == sorted(blobs)
        for key, data in blobs.items():
            assert via.get(key) == data
            assert [bytes(b) for b in via.get_ranges(key, starts, ends)] == [
                bytes(b) for b in direct.get_ranges(key, starts, ends)]
            assert via.head(key).etag == direct.head(key).etag
        via.put("scenes/new.bin", b"written through the link")
    assert direct.get("scenes/new.bin") == b"written through the link"
    assert emu.stats.faults_total >= 3
    assert emu.stats.faults["503"] + emu.stats.faults["500"] == emu.stats.faults_total


@pytest.mark.s3
def test_store_get_ranges_through_a_200_mbps_link(s3_server: S3Server, s3_bucket: str, obj: tuple[str, bytes]) -> None:
    key, data = obj
    starts = [i * 2 * MB for i in range(4)]
    ends = [s + MB for s in starts]
    with LinkEmulator(s3_server.endpoint, link=LinkSpec.preset("200mbps")) as emu:
        via = Store(f"s3://{s3_bucket}", {**s3_server.options, "endpoint_url": emu.endpoint})
        t0 = time.perf_counter()
        got = via.get_ranges(key, starts, ends)
        secs = time.perf_counter() - t0
    assert [bytes(b) for b in got] == [data[s:e] for s, e in zip(starts, ends, strict=True)]
    assert secs >= 0.85 * 4 * MB / 25e6  # at least 4 MB at 25 MB/s (more if obstore coalesced the gaps)
    assert emu.stats.bytes_sent >= 4 * MB


# -- framings moto does not use: a small local HTTP/1.1 server --------------------------------


class _Framings(http.server.BaseHTTPRequestHandler):
    """``/chunked`` answers in chunks (with a chunk extension and a trailer field), ``/close`` ends its
    body by closing; a PUT echoes its (chunked) body."""

    protocol_version = "HTTP/1.1"
    body = bytes(range(256)) * 10_000

    def do_GET(self) -> None:
        self.send_response(200)
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(self.body), 700_000):
                part = self.body[i:i + 700_000]
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\nx-trailer: t\r\n\r\n")
        else:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(self.body)
            self.close_connection = True

    def do_PUT(self) -> None:
        data = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            data += self.rfile.read(size)
            self.rfile.readline()
        self.rfile.readline()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def framings() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Framings)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_chunked_and_close_delimited_bodies_pass_through_paced(framings: str) -> None:
    with LinkEmulator(framings, link=LinkSpec.preset("200mbps", ttfb_ms=0)) as emu:
        conn = _conn(emu.endpoint)
        _, _, body, resp = _timed_get(conn, "/chunked")
        assert resp.getheader("Transfer-Encoding") == "chunked"
        assert body == _Framings.body
        conn.request("PUT", "/echo", body=iter([b"abc" * 1000, b"def" * 5000]), encode_chunked=True)
        echoed = conn.getresponse()
        assert echoed.read() == b"abc" * 1000 + b"def" * 5000
        conn = _conn(emu.endpoint)
        _, secs, body, resp = _timed_get(conn, "/close")
        assert body == _Framings.body
        # a body the upstream ended by closing reaches an HTTP/1.1 client chunked (h11 re-frames it),
        # so the client's connection carries the next request
        assert resp.getheader("Transfer-Encoding") == "chunked"
        assert resp.getheader("Connection") is None
        assert _timed_get(conn, "/chunked")[2] == _Framings.body
    assert secs >= 0.85 * len(body) / 25e6


def test_a_truncated_chunked_body_is_incomplete(framings: str) -> None:
    with LinkEmulator(framings, faults=FaultSpec(rate=1.0, kinds="truncate")) as emu:
        conn = _conn(emu.endpoint)
        conn.request("GET", "/chunked")
        resp = conn.getresponse()
        with pytest.raises(http.client.IncompleteRead):
            resp.read()


@pytest.mark.integration
def test_an_unreachable_upstream_is_a_502() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with LinkEmulator(f"http://127.0.0.1:{port}") as emu:
        with pytest.raises(LinkEmulatorError, match="does not answer"):
            emu.check_upstream()
        _, _, body, resp = _timed_get(_conn(emu.endpoint), "/b/k")
    assert resp.status == 502
    assert b"cannot connect" in body
    assert emu.stats.upstream_errors == 1


@pytest.mark.parametrize(("raw", "status"), [
    (b"GARBAGE\r\n\r\n", b"400"), (b"GET / HTTP/2\r\n\r\n", b"400"), (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", b"400"),
    (b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 1, 2\r\n\r\n", b"400"),
    (b"PUT / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", b"501"),
])
@pytest.mark.integration
def test_malformed_requests_are_refused_with_h11s_status(raw: bytes, status: bytes) -> None:
    with LinkEmulator("http://127.0.0.1:9") as emu, socket.create_connection(("127.0.0.1", emu.port), timeout=10) as s:
        s.sendall(raw)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:80]
    assert b"\r\nConnection: close\r\n" in answer
    assert emu.stats.requests == 0  # nothing was forwarded


@pytest.mark.s3
def test_a_chunked_upload_reaches_s3(s3_server: S3Server, s3_bucket: str) -> None:
    with LinkEmulator(s3_server.endpoint, link=LinkSpec.preset("200mbps", cap_uploads=True)) as emu:
        conn = _conn(emu.endpoint)
        t0 = time.perf_counter()
        conn.request("PUT", _target(emu.endpoint, s3_bucket, "up.bin", "put_object"),
                     body=iter([b"a" * MB, b"b" * MB]), encode_chunked=True)
        resp = conn.getresponse()
        resp.read()
        secs = time.perf_counter() - t0
    assert resp.status == 200
    got = s3_server.client().get_object(Bucket=s3_bucket, Key="up.bin")["Body"].read()
    assert got == b"a" * MB + b"b" * MB
    assert secs >= 0.85 * 2 * MB / 25e6  # the upload was capped too
    assert emu.stats.bytes_received > 2 * MB


def test_faults_can_be_a_burst_at_the_start() -> None:
    spec = FaultSpec(rate=1.0, kinds="500", first=3)
    assert [spec.applies_to("GET", i) for i in range(5)] == [True, True, True, False, False]
    assert not spec.applies_to("PUT", 0)
    assert "the first 3 GET requests" in spec.describe()
    with pytest.raises(ConfigError, match="first=-1"):
        FaultSpec(rate=1.0, first=-1)


@pytest.mark.integration
def test_an_injected_error_is_counted_before_the_client_has_it() -> None:
    """A client that has read an injected 503 finds it in ``stats`` at once (it was counted after the send, and a
    test reading the count right after its last failed request saw one fewer now and then)."""
    with LinkEmulator("http://127.0.0.1:9", faults=FaultSpec(rate=1.0, kinds="503")) as emu:  # never contacted
        conn = _conn(emu.endpoint)
        for n in range(1, 301):
            _, _, _, resp = _timed_get(conn, "/b/k")
            assert resp.status == 503
            assert emu.stats.faults["503"] == n
