"""``LinkEmulator``: the proxy on its own thread and event loop, as a context manager."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from types import TracebackType

from cubelake.errors import ConfigError, LinkEmulatorError

from ._proxy import Proxy, parse_upstream
from .spec import FaultSpec, LinkSpec, LinkStats

__all__ = ["LinkEmulator"]

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 30.0


class LinkEmulator:
    """An HTTP proxy on ``host:port`` in front of an S3-protocol endpoint that shapes and breaks its traffic.

    ``upstream_url``: ``http://host:port`` of the real endpoint. ``link``: bandwidth and time to
    first byte (:class:`LinkSpec`, e.g. ``LinkSpec.preset("500mbps")``). ``faults``: seeded fault
    injection (:class:`FaultSpec`). ``seed``: fixes jitter and faults (the n-th request gets the
    same outcome in every run). ``port`` 0 picks a free one. Clients use :attr:`endpoint` as their
    S3 endpoint (``AWS_ENDPOINT_URL``) and sign for it; :attr:`stats` counts what happened.

    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, upstream_url: str, link: LinkSpec | None = None, faults: FaultSpec | None = None,
                 seed: int = 0, host: str = "127.0.0.1", port: int = 0) -> None:
        try:
            upstream = parse_upstream(upstream_url)
        except ValueError as exc:
            raise ConfigError(f"upstream {upstream_url!r}: {exc}") from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"port {port}: must be 0 (any free port) to 65535")
        self.upstream_url = upstream_url
        self.link = link or LinkSpec()
        self.faults = faults or FaultSpec()
        self.seed = seed
        self.host = host
        self._port = port
        self._proxy = Proxy(upstream, self.link, self.faults, seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        where = self.endpoint if self.running else "stopped"
        return f"LinkEmulator({where} -> {self.upstream_url}: {self.link.describe()}; {self.faults.describe()})"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._ready.is_set() and self._error is None

    @property
    def port(self) -> int:
        if not self.running:
            raise LinkEmulatorError("the link emulator is not running; start() it or use it as a context manager")
        return self._port

    @property
    def endpoint(self) -> str:
        """``http://host:port``: the S3 endpoint clients should use."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def stats(self) -> LinkStats:
        """A snapshot of the counters (requests, bytes each way, faults by kind)."""
        return self._proxy.stats()

    def check_upstream(self, timeout_s: float = 2.0) -> None:
        """Raise :class:`LinkEmulatorError` if the upstream does not accept a TCP connection now."""
        host, port = self._proxy.upstream
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as exc:
            raise LinkEmulatorError(f"the upstream {self.upstream_url} does not answer: {exc}; requests will get "
                                    "502 Bad Gateway until it does") from None

    def start(self) -> LinkEmulator:
        """Listen and serve on a background thread; returns once the port is open."""
        if self._thread is not None:
            raise LinkEmulatorError("this link emulator was already started; create a new one")
        self._thread = threading.Thread(target=self._run, name="cubelake-linkemu", daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            raise LinkEmulatorError(f"the link emulator did not start within {_START_TIMEOUT_S:g} s")
        if self._error is not None:
            self._thread.join()
            raise LinkEmulatorError(f"cannot listen on {self.host}:{self._port}: {self._error}") from self._error
        log.info("link emulator on %s -> %s: %s; %s", self.endpoint, self.upstream_url, self.link.describe(),
                 self.faults.describe())
        return self

    def close(self) -> None:
        """Stop serving: every connection ends (stalled ones too); idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()

    def __enter__(self) -> LinkEmulator:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            try:
                self._port = loop.run_until_complete(self._proxy.start(self.host, self._port))
            except OSError as exc:
                self._error = exc
                return
            finally:
                self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self._proxy.shutdown())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
