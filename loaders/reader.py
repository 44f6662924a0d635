"""Fetch and decode chunks concurrently, ahead of the consumer, into a bounded cache of decoded chunks.

This is the loader's engine; it is ours because no library does the part that matters: knowing
the epoch plan, it fetches the chunks the next batches need (coalescing adjacent byte ranges of
one file into one request), decodes them on a thread pool (numcodecs/imagecodecs release the GIL),
keeps each decoded chunk until its last sample has been cut, then lets it go. A byte budget
bounds the decoded chunks held plus those in flight; an optional disk cache keeps the compressed
bytes for later epochs and other processes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from cubelake.errors import ConfigError, CubelakeError
from cubelake.storage import Store, is_throttle, object_at

from .adaptive import AimdController, Gate
from .buffers import ChunkBuffers, root
from .cache import DiskCache, Range, coalesce
from .hedge import hedge_delay, hedged
from .metrics import LoaderMetrics
from .sources import ChunkSource, Piece

__all__ = ["ChunkKey", "ChunkReadError", "ChunkReader", "ReaderConfig"]

log = logging.getLogger(__name__)

ChunkKey = tuple[int, int]  # (scene index, flat chunk id = cy * nx + cx)
T = TypeVar("T")


class ChunkReadError(CubelakeError, OSError):
    """A chunk that could not be fetched or decoded after every retry."""


@dataclass(frozen=True, slots=True)
class ReaderConfig:
    """``cache_bytes``: budget of decoded chunks held plus in flight. ``threads``: fetch/decode threads.

    ``max_gap``: byte gap up to which neighbouring ranges of one file are read in one request.
    ``group``: most chunks per coalesced request. ``retries``/``backoff_s``: attempts after the
    first, with exponential backoff. ``strict``: raise on a failed chunk instead of dropping it.
    ``adaptive``: start with ``threads`` requests in flight and let :class:`~.adaptive.AimdController`
    grow them while throughput rises (up to ``max_threads``, and what the cache budget holds) and
    halve them when the store throttles or fails.

    ``hedge_after_s``: hedged requests (``None``, the default: off). A storage request not answered
    after ``hedge_after_s``, or after the ``hedge_quantile`` of the request latencies seen if longer
    (once 20 are recorded), gets one duplicate; the first answer wins and the other is left to finish
    on its own thread, unread. It cuts the tail a stalled connection adds (counted as ``hedges`` and
    ``hedge_wins`` in the metrics), at the cost of those duplicate requests and their bytes.
    ``slowdown_s``: the least upper bound of the backoff after the store throttles (503 SlowDown,
    429): obstore neither honours nor exposes ``Retry-After``, so this stands in for it.
    """

    cache_bytes: int = 1024 * 1024 * 1024
    threads: int = 2
    max_gap: int = 0
    group: int = 4
    retries: int = 2
    backoff_s: float = 0.05
    strict: bool = False
    adaptive: bool = False  # requests in flight found by AIMD (loaders/adaptive.py), from threads up to max_threads
    max_threads: int = 16
    hedge_after_s: float | None = None
    hedge_quantile: float = 0.95
    slowdown_s: float = 1.0

    def __post_init__(self) -> None:
        if self.hedge_after_s is not None and not self.hedge_after_s >= 0:
            raise ConfigError(f"hedge_after_s={self.hedge_after_s!r}: seconds >= 0, or None (no hedged requests)")
        if not 0 < self.hedge_quantile <= 1:
            raise ConfigError(f"hedge_quantile={self.hedge_quantile!r}: a quantile in (0, 1], e.g. 0.95")
        if not self.slowdown_s >= 0:
            raise ConfigError(f"slowdown_s={self.slowdown_s!r}: seconds >= 0")


def _describe(error: BaseException) -> str:
    """An error for a message: ours say what happened; others get their type (``struct.error: ...``)."""
    if isinstance(error, CubelakeError):
        return str(error)
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{name}: {error}"


class ChunkReader:
    """Concurrent, budgeted chunk fetching and decoding for one process."""

    def __init__(self, sources: Sequence[ChunkSource], config: ReaderConfig, metrics: LoaderMetrics,
                 disk_cache: DiskCache | None = None) -> None:
        self.sources = list(sources)
        self.config = config
        self.metrics = metrics
        metrics.threads = max(1, config.threads)
        self.disk = disk_cache
        self.pid = os.getpid()  # a forked child must not reuse this pool: its threads stay in the parent
        self._aimd: AimdController | None = None
        self._gate: Gate | None = None
        if config.adaptive:
            hi = max(config.threads, min(config.max_threads, self._budget_requests(sources, config)))
            self._aimd = AimdController(lo=1, hi=hi, limit=config.threads)
            self._gate = Gate(self._aimd.limit)
        pool = self._aimd.hi if self._aimd is not None else config.threads
        self._pool = ThreadPoolExecutor(max(1, pool), thread_name_prefix="cubelake-chunk")
        # hedged attempts run here, primary and duplicate; a thread is only made when none is idle, and the
        # headroom is for losers still stalled on a dead connection
        self._hedge_pool: ThreadPoolExecutor | None = None
        if config.hedge_after_s is not None:
            self._hedge_pool = ThreadPoolExecutor(4 * max(1, pool) + 16, thread_name_prefix="cubelake-hedge")
        self._lock = threading.Lock()
        self._mem: OrderedDict[ChunkKey, np.ndarray] = OrderedDict()
        self._pinned: set[ChunkKey] = set()
        self._due: dict[ChunkKey, int] = {}  # pinned chunks' next use in the epoch (see request)
        self._inflight: dict[ChunkKey, Future[np.ndarray]] = {}
        self._held = 0  # bytes of decoded chunks in _mem
        self._reserved = 0  # bytes of chunks in flight
        self._decoded: set[ChunkKey] = set()
        self._failed: dict[ChunkKey, str] = {}
        self._buffers = ChunkBuffers()  # decode buffers: evicted chunks' memory is reused
        self._stores: dict[str, tuple[Store, str]] = {}

    # -- epoch --------------------------------------------------------------------------------------

    def new_epoch(self, metrics: LoaderMetrics) -> None:
        metrics.threads = max(1, self.config.threads)
        with self._lock:
            self.metrics = metrics
            self._decoded.clear()
            self._failed.clear()
            self._pinned.clear()
            self._due.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._hedge_pool is not None:  # a losing attempt may still wait on a stalled connection: not joined
            self._hedge_pool.shutdown(wait=False, cancel_futures=True)

    # -- budget -------------------------------------------------------------------------------------

    def _nbytes(self, key: ChunkKey) -> int:
        return self.sources[key[0]].chunk_nbytes

    def has_room(self, key: ChunkKey, reserve: int = 0) -> bool:
        """Whether prefetching ``key`` fits the budget and leaves ``reserve`` bytes free (released chunks count
        as free)."""
        with self._lock:
            # every chunk still needed counts, held or not: one evicted early will be decoded again
            pinned = sum(self._nbytes(k) for k in self._pinned if k not in self._inflight)
            return pinned + self._reserved + self._nbytes(key) + reserve <= self.config.cache_bytes

    def _evict(self) -> None:
        """Drop released chunks (least recently used first), then, if the budget demands, needed ones: the one
        needed last first (Belady's rule, from the next uses the caller gives), else the least recently used."""
        budget = self.config.cache_bytes
        if self._held + self._reserved <= budget:
            return
        released = [k for k in self._mem if k not in self._pinned]
        pinned = sorted((k for k in self._mem if k in self._pinned), key=lambda k: -self._due.get(k, -1))
        for k in released + pinned:
            if self._held + self._reserved <= budget:
                return
            a = self._mem.pop(k)
            self._held -= a.nbytes
            self._buffers.give(a)

    # -- requests -----------------------------------------------------------------------------------

    def pin(self, key: ChunkKey) -> None:
        with self._lock:
            self._pinned.add(key)

    def release(self, key: ChunkKey) -> None:
        with self._lock:
            self._pinned.discard(key)
            self._due.pop(key, None)
            self._evict()

    def set_due(self, keys: Sequence[ChunkKey], due: Sequence[int]) -> None:
        """Where in the epoch each of ``keys`` is needed next (see :meth:`request`)."""
        with self._lock:
            self._due.update(zip(keys, due, strict=True))

    def request(self, keys: Sequence[ChunkKey], due: Sequence[int] | None = None) -> None:
        """Start loading whichever of ``keys`` are neither held nor in flight. ``due``: for each key, the
        position in the epoch where it is needed next; when the budget is short, the key due last goes first."""
        todo: list[ChunkKey] = []
        with self._lock:
            if due is not None:
                self._due.update(zip(keys, due, strict=True))
            for k in keys:
                self._pinned.add(k)
                if k in self._mem:
                    self._mem.move_to_end(k)
                elif k not in self._inflight and k not in self._failed:
                    fut: Future[np.ndarray] = Future()
                    self._inflight[k] = fut
                    self._reserved += self._nbytes(k)
                    todo.append(k)
        if not todo:
            return
        try:
            groups = self._groups(todo)
        except Exception as e:  # e.g. a product's chunk index failing: the chunks fail, none waits forever
            groups = []
            for k in todo:
                self._fail(k, e)
        for n, group in enumerate(groups):
            try:
                self._pool.submit(self._load_group, group)
            except RuntimeError as e:  # the pool was shut down (the dataset closed): nobody will load the rest
                for k in (k for g in groups[n:] for k in g):
                    self._fail(k, e)
                break

    def get(self, key: ChunkKey) -> np.ndarray | None:
        """The decoded chunk ``(band, y, x)``; ``None`` if it failed (and ``strict`` is off)."""
        for _ in range(2):  # held, failed or in flight; else requested once (which makes it one of those)
            with self._lock:
                arr = self._mem.get(key)
                if arr is not None:
                    self._mem.move_to_end(key)
                    self.metrics.cache_hits += 1
                    return arr
                failed = self._failed.get(key)
                fut = self._inflight.get(key)
            if failed is not None:
                if self.config.strict:
                    raise ChunkReadError(failed)
                return None
            if fut is not None:
                return self._wait(fut)
            self.request([key])
        return None

    def _wait(self, fut: Future[np.ndarray]) -> np.ndarray | None:
        self.metrics.add(cache_misses=1)
        t0 = time.perf_counter()
        try:
            return fut.result()
        except ChunkReadError:
            if self.config.strict:
                raise
            return None
        finally:
            self.metrics.add(chunk_wait_s=time.perf_counter() - t0)

    # -- loading ------------------------------------------------------------------------------------

    def _store(self, url: str, src: ChunkSource) -> tuple[Store, str]:
        hit = self._stores.get(url)
        if hit is None:
            hit = object_at(url, src.storage_options)
            self._stores[url] = hit
        return hit

    def _pieces(self, key: ChunkKey) -> list[Piece]:
        src = self.sources[key[0]]
        cy, cx = divmod(key[1], src.grid.n_cols)
        return src.pieces(cy, cx)

    def _groups(self, keys: Sequence[ChunkKey]) -> list[list[ChunkKey]]:
        """Chunks whose pieces are all ranges of one file within ``max_gap`` of each other load together."""
        if self.config.group <= 1:
            return [[k] for k in keys]
        spans: list[tuple[str, int, int, ChunkKey]] = []
        singles: list[list[ChunkKey]] = []
        for k in keys:
            ps = self._pieces(k)
            if ps and all(p.length >= 0 and p.url == ps[0].url for p in ps):
                spans.append((ps[0].url, min(p.offset for p in ps), max(p.offset + p.length for p in ps), k))
            else:
                singles.append([k])
        groups: list[list[ChunkKey]] = []
        by_url: dict[str, list[tuple[str, int, int, ChunkKey]]] = {}
        for s in spans:
            by_url.setdefault(s[0], []).append(s)
        for items in by_url.values():
            merged = coalesce([Range(s, e, k) for _, s, e, k in items], self.config.max_gap)
            for _, _, members in merged:
                ks = [m.tag for m in members]
                groups.extend(ks[i:i + self.config.group] for i in range(0, len(ks), self.config.group))
        return groups + singles

    def _load_group(self, keys: list[ChunkKey]) -> None:
        """Fetch and decode a group on a pool thread. Whatever goes wrong, every chunk of the group ends
        decoded or failed: a future left unresolved would hang the consumer waiting on it."""
        try:
            self._fetch_and_decode(keys)
        except BaseException as e:  # reported to the consumer through the futures, not lost
            for k in keys:
                with self._lock:
                    pending = k in self._inflight
                if pending:
                    self._fail(k, e)
            if not isinstance(e, Exception):
                raise  # KeyboardInterrupt/SystemExit: after the futures are resolved

    def _fetch_and_decode(self, keys: list[ChunkKey]) -> None:
        attempts = self.config.retries + 1
        for attempt in range(attempts):
            try:
                raw = self._fetch(keys)
                break
            except (OSError, ValueError, RuntimeError) as e:  # storage and transport errors (timeouts too): retried
                self._throttled()
                cap = self._backoff_cap(e, attempt)
                if attempt + 1 < attempts:
                    self.metrics.add(retries=1)
                    # exponential backoff with full jitter: readers hitting one throttled store spread out
                    time.sleep(random.uniform(0, cap))
                    continue
                if len(keys) > 1:  # isolate the bad chunk: retry each on its own
                    for k in keys:
                        self._load_group([k])
                    return
                self._fail(keys[0], e)
                return
        for k, parts in zip(keys, raw, strict=True):
            self._decode(k, parts)

    def _backoff_cap(self, error: BaseException, attempt: int) -> float:
        """The longest backoff after ``attempt`` failed with ``error``; a throttle (counted) waits up to ``slowdown_s``."""
        cap = self.config.backoff_s * 2**attempt
        if not is_throttle(error):
            return cap
        self.metrics.add(throttled=1)
        log.info("throttled by the store (attempt %d), backing off up to %.2f s: %s", attempt + 1,
                 max(cap, self.config.slowdown_s), error)
        return max(cap, self.config.slowdown_s)

    def _call(self, fn: Callable[[], T]) -> T:
        """One storage call, hedged when ``hedge_after_s`` is set: a duplicate once it is slower than the rest."""
        pool = self._hedge_pool
        if pool is None or self.config.hedge_after_s is None:
            return fn()
        delay = hedge_delay(self.config.hedge_after_s, self.metrics.request_hist, self.config.hedge_quantile)
        out = hedged(fn, delay, pool.submit)
        if out.hedged:
            self.metrics.add(hedges=1, hedge_wins=int(out.won))
            log.debug("hedged a request slower than %.3f s; the duplicate %s", delay, "won" if out.won else "lost")
        return out.value

    @staticmethod
    def _budget_requests(sources: Sequence[ChunkSource], config: ReaderConfig) -> int:
        """Requests in flight the cache budget holds: a quarter of it, a chunk each (decoded size, the larger)."""
        largest = max((src.chunk_nbytes for src in sources), default=1)
        return max(1, int(config.cache_bytes / 4 // max(1, largest)))

    @property
    def chunks_ahead(self) -> int:
        """Chunks to request ahead so the adaptive limit's requests can all be in flight (0: not adaptive)."""
        return self._aimd.limit * max(1, self.config.group) if self._aimd is not None else 0

    @property
    def concurrency_history(self) -> list[int]:
        """The adaptive limit after each of its decisions (empty when not adaptive)."""
        return list(self._aimd.history) if self._aimd is not None else []

    @contextlib.contextmanager
    def _request(self) -> Iterator[list[int]]:
        """One storage call: held to the adaptive limit, counted in flight, its latency recorded; the caller
        puts the bytes it got in the yielded list, which feed the adaptive controller."""
        got = [0]
        metrics = self.metrics
        with self._gate if self._gate is not None else contextlib.nullcontext():
            metrics.request_started()
            t0 = time.perf_counter()
            try:
                yield got
            finally:
                metrics.request_done(time.perf_counter() - t0)
        if self._aimd is not None and self._gate is not None and got[0]:
            with self._lock:
                limit = self._aimd.completed(got[0], time.perf_counter())
            self._gate.set_limit(limit)
            metrics.inflight_limit = limit

    def _throttled(self) -> None:
        if self._aimd is not None and self._gate is not None:
            with self._lock:
                limit = self._aimd.throttled()
            self._gate.set_limit(limit)
            self.metrics.inflight_limit = limit

    def _fetch(self, keys: list[ChunkKey]) -> list[list[tuple[Piece, bytes | memoryview]]]:
        """Compressed bytes of each chunk's pieces: from the disk cache, else coalesced range reads."""
        out: list[list[tuple[Piece, bytes | memoryview]]] = []
        missing: dict[str, list[Range]] = {}
        src_of: dict[str, ChunkSource] = {}
        whole: list[tuple[int, int, Piece]] = []
        for ci, k in enumerate(keys):
            parts: list[tuple[Piece, bytes | memoryview]] = []
            src = self.sources[k[0]]
            for pi, p in enumerate(self._pieces(k)):
                data: bytes | memoryview | None = None
                if self.disk is not None:
                    data = self.disk.get(DiskCache.key(p.url, p.offset, p.length, src.version))
                    self.metrics.add(**({"disk_hits": 1} if data is not None else {"disk_misses": 1}))
                parts.append((p, data if data is not None else b""))
                if data is None:
                    if p.length < 0:
                        whole.append((ci, pi, p))
                    else:
                        missing.setdefault(p.url, []).append(Range(p.offset, p.offset + p.length, (ci, pi)))
                        src_of[p.url] = src
            out.append(parts)
        t0 = time.perf_counter()
        fetched = 0
        requests = 0
        for ci, pi, p in whole:
            store, path = self._store(p.url, self.sources[keys[ci][0]])
            with self._request() as got:
                data = self._call(functools.partial(store.get, path))
                got[0] = len(data)
            out[ci][pi] = (p, data)
            fetched += len(data)
            requests += 1
        for url, ranges in missing.items():
            store, path = self._store(url, src_of[url])
            merged = coalesce(ranges, self.config.max_gap)
            with self._request() as got:
                starts, ends = [s for s, _, _ in merged], [e for _, e, _ in merged]
                bufs = self._call(functools.partial(store.get_ranges, path, starts, ends))
                got[0] = sum(len(b) for b in bufs)
            for (s, e, members), buf in zip(merged, bufs, strict=True):
                if len(buf) != e - s:
                    raise OSError(f"{url}: got {len(buf)} bytes for range {s}-{e}")
                view = memoryview(buf)
                for m in members:
                    ci, pi = m.tag
                    out[ci][pi] = (out[ci][pi][0], view[m.start - s: m.end - s])
                fetched += e - s
                requests += 1
        self.metrics.add(fetch_s=time.perf_counter() - t0, bytes_fetched=fetched, requests=requests)
        if self.disk is not None and (missing or whole):
            for k, parts in zip(keys, out, strict=True):
                v = self.sources[k[0]].version
                for p, data in parts:
                    self.disk.put(DiskCache.key(p.url, p.offset, p.length, v), data)
        return out

    def _decode(self, key: ChunkKey, parts: list[tuple[Piece, bytes | memoryview]]) -> None:
        src = self.sources[key[0]]
        t0 = time.perf_counter()
        try:
            if len(parts) == 1 and parts[0][0].band_start == 0 and parts[0][0].band_stop == src.n_bands:
                buf = self._buffers.take(src.chunk_nbytes)
                arr = src.decoder(parts[0][1], buf)
                if root(arr) is not buf:  # the decoder made its own array: the buffer stays free
                    self._buffers.give(buf)
                del buf
            else:
                arr = src.empty_chunk(self._buffers.take(src.chunk_nbytes))
                for p, data in parts:
                    arr[p.band_start:p.band_stop] = src.decoder(data, None)[: p.band_stop - p.band_start]
            if arr.shape != src.chunk_shape:
                raise ValueError(f"decoded shape {arr.shape}, expected {src.chunk_shape}")
        except Exception as e:  # any codec error (blosc, zstd, imagecodecs, struct, zlib) fails the chunk
            self._fail(key, e)
            return
        dt = time.perf_counter() - t0
        with self._lock:
            again = key in self._decoded
            self._decoded.add(key)
            self._mem[key] = arr
            self._held += arr.nbytes
            self._reserved -= self._nbytes(key)
            fut = self._inflight.pop(key)
            self._evict()
        if parts:  # a chunk with no stored bytes is fill, not a decode
            self.metrics.add(decode_s=dt, bytes_decoded=arr.nbytes, chunks_decoded=1, redecodes=int(again))
        fut.set_result(arr)

    def _fail(self, key: ChunkKey, error: BaseException) -> None:
        src = self.sources[key[0]]
        cy, cx = divmod(key[1], src.grid.n_cols)
        msg = (f"{src.url}: chunk (row {cy}, col {cx}) of scene {src.scene_id} failed after "
               f"{self.config.retries + 1} attempts: {_describe(error)}")
        with self._lock:
            self._failed[key] = msg
            self._reserved -= self._nbytes(key)
            fut = self._inflight.pop(key)
        self.metrics.add(failed_chunks=1)
        log.warning("%s", msg)
        if not self.config.strict:
            warnings.warn(msg + "; its samples are dropped (strict=True raises instead)", RuntimeWarning, stacklevel=2)
        fut.set_exception(ChunkReadError(msg))
