"""How accurate the link emulator is: bandwidth, time to first byte, and retries under faults.

An S3-protocol server (``moto_server``, its own process on 127.0.0.1) holds a 16 MB object.
Through a :class:`cubelake.linkemu.LinkEmulator` (in this process) the run measures:

1. **Bandwidth.** For each preset (1gbps, 500mbps, 200mbps; TTFB 0 so only the rate counts),
   ``--rounds`` single downloads of the object and ``--rounds`` pairs of concurrent downloads of
   its two halves, by http.client on kept-alive connections; rate = body bytes / (time from the
   response head to the last byte), for a pair bytes of both / wall time of both. Error = rate /
   cap - 1.
2. **TTFB.** For TTFB 20, 40 and 80 ms (no cap): 30 GETs of 100 bytes; the median time from
   sending the request to the response head, against 30 direct GETs to the server.
3. **Faults.** cubelake's ``Store`` (obstore, SigV4 signed for the proxy) reads the object 20
   times through a 200 Mbit/s, 40 ms link with 20% of GETs failing (503 and 500, seed 1); the
   bytes must equal a direct read. Reported: requests the link saw, faults injected, wall time.

    python bench/linkemu.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from cubelake.linkemu import FaultSpec, LinkEmulator, LinkSpec
from cubelake.storage import Store

BIN = Path(sys.executable).parent
SIZE = 16_000_000
CREDS = {"key": "testing", "secret": "testing", "region": "us-east-1"}


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def presigned(endpoint: str, key: str = "blob.bin") -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    u = urlsplit(client.generate_presigned_url("get_object", Params={"Bucket": "bench", "Key": key}))
    return f"{u.path}?{u.query}"


def get(endpoint: str, target: str, rng: str | None = None) -> tuple[float, float, int]:
    """``(seconds to the head, seconds of the body, body bytes)`` of one GET on a new connection."""
    u = urlsplit(endpoint)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=60)
    t0 = time.perf_counter()
    conn.request("GET", target, headers={"Range": rng} if rng else {})
    resp = conn.getresponse()
    t1 = time.perf_counter()
    n = len(resp.read())
    conn.close()
    return t1 - t0, time.perf_counter() - t1, n


def bandwidth(upstream: str, preset: str, rounds: int) -> dict[str, object]:
    with LinkEmulator(upstream, link=LinkSpec.preset(preset, ttfb_ms=0)) as emu:
        cap = emu.link.bytes_per_s or 0.0
        target = presigned(emu.endpoint)
        single = []
        for _ in range(rounds):
            _, secs, n = get(emu.endpoint, target)
            single.append(n / secs / cap - 1)
        pair = []
        for _ in range(rounds):
            half = SIZE // 2
            threads = [threading.Thread(target=get, args=(emu.endpoint, target, f"bytes={i * half}-{(i + 1) * half - 1}"))
                       for i in range(2)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            pair.append(SIZE / (time.perf_counter() - t0) / cap - 1)
    return {"preset": preset, "single_error": single, "pair_error": pair}


def ttfb(upstream: str, ttfb_ms: float, n: int = 30) -> dict[str, object]:
    direct_target = presigned(upstream)
    direct = statistics.median(get(upstream, direct_target, "bytes=0-99")[0] for _ in range(n)) * 1000
    with LinkEmulator(upstream, link=LinkSpec(ttfb_ms=ttfb_ms)) as emu:
        target = presigned(emu.endpoint)
        through = statistics.median(get(emu.endpoint, target, "bytes=0-99")[0] for _ in range(n)) * 1000
    return {"ttfb_ms": ttfb_ms, "direct_median_ms": direct, "median_ms": through, "over_ms": through - ttfb_ms}


def faults(upstream: str, data: bytes, reads: int = 20) -> dict[str, object]:
    spec = FaultSpec(rate=0.2, kinds="503,500")
    with LinkEmulator(upstream, link=LinkSpec.preset("200mbps"), faults=spec, seed=1) as emu:
        store = Store("s3://bench", {**CREDS, "endpoint_url": emu.endpoint, "max_retries": 10})
        t0 = time.perf_counter()
        identical = all(store.get("blob.bin") == data for _ in range(reads))
        wall = time.perf_counter() - t0
    s = emu.stats
    return {"reads": reads, "identical": identical, "requests": s.requests, "faults": dict(s.faults),
            "wall_s": wall, "ideal_s": reads * (0.04 + SIZE / 25e6)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    with moto_server() as upstream:
        direct = Store("s3://bench", {**CREDS, "endpoint_url": upstream})
        import boto3

        boto3.client("s3", endpoint_url=upstream, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="bench")
        direct.put("blob.bin", data)
        doc = {"bandwidth": [bandwidth(upstream, p, a.rounds) for p in ("1gbps", "500mbps", "200mbps")],
               "ttfb": [ttfb(upstream, ms) for ms in (20.0, 40.0, 80.0)],
               "faults": faults(upstream, data)}
    for b in doc["bandwidth"]:  # type: ignore[union-attr]
        s, p = b["single_error"], b["pair_error"]
        print(f"{b['preset']:>8}: one stream {statistics.median(s):+.1%} (min {min(s):+.1%}, max {max(s):+.1%}); "
              f"two streams {statistics.median(p):+.1%} (min {min(p):+.1%}, max {max(p):+.1%})")
    for t in doc["ttfb"]:  # type: ignore[union-attr]
        print(f"TTFB {t['ttfb_ms']:.0f} ms: median {t['median_ms']:.1f} ms (+{t['over_ms']:.1f}); "
              f"direct {t['direct_median_ms']:.1f} ms")
    f = doc["faults"]
    print(f"faults: {f['reads']} reads of 16 MB, identical {f['identical']}, {f['requests']} requests, "  # type: ignore[index]
          f"faults {f['faults']}, {f['wall_s']:.1f} s (fault-free {f['ideal_s']:.1f} s)")  # type: ignore[index]
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
