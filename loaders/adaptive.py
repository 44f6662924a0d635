"""How many storage requests to keep in flight: additive increase while throughput rises, halving on throttling.

Over a link with time to first byte ``r`` and bandwidth ``B``, ``c`` requests of ``s`` bytes move
``min(B, c·s/(r + s/B))`` (:mod:`.capacity`): too few leave the link idle between first bytes,
too many only queue (and invite ``503 SlowDown``). :class:`AimdController` finds the knee without
knowing ``r``, ``B`` or ``s``: each measurement window (``window`` completed requests) it compares
the throughput with the one at the next lower limit; below the knee ``c`` requests move ``c/k``
times what ``k`` did, past it no more, so while the last increase brought at least half of that
proportional gain (``efficiency``) it adds one request, and when it did not it keeps the limit; a throttled or failed request halves it
(TCP's AIMD), and it never leaves ``[lo, hi]`` (``hi`` from the cache budget). Pure: the reader
feeds it completions and asks for the limit; :class:`Gate` is the limit as a blocking semaphore.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["AimdController", "Gate"]


@dataclass
class AimdController:
    """The in-flight request limit, from completions (bytes, seconds) and throttling events."""

    lo: int = 1
    hi: int = 32
    limit: int = 2
    window: int = 8  # completions per measurement
    efficiency: float = 0.5  # an increase pays when it adds this share of one more request's fair part
    _bytes: int = 0
    _count: int = 0
    _t0: float | None = None
    _best: dict[int, float] = field(default_factory=dict)  # limit -> best throughput seen at it
    history: list[int] = field(default_factory=list)  # the limit after each decision

    def __post_init__(self) -> None:
        self.limit = max(self.lo, min(self.hi, self.limit))

    def completed(self, nbytes: int, now: float) -> int:
        """A request of ``nbytes`` finished at ``now`` (seconds, monotonic); returns the limit."""
        if self._t0 is None:
            self._t0 = now
        self._bytes += nbytes
        self._count += 1
        if self._count >= self.window and now > self._t0:
            self._decide(self._bytes / (now - self._t0))
            self._bytes, self._count, self._t0 = 0, 0, now
        return self.limit

    def throttled(self) -> int:
        """A request was refused (503, timeout, reset): halve the limit and measure again from there."""
        self.limit = max(self.lo, self.limit // 2)
        self._bytes, self._count, self._t0 = 0, 0, None
        self._best = {k: v for k, v in self._best.items() if k <= self.limit}
        self.history.append(self.limit)
        return self.limit

    def _decide(self, rate: float) -> None:
        self._best[self.limit] = max(rate, self._best.get(self.limit, 0.0))
        lower = [k for k in self._best if k < self.limit]
        if self.limit >= self.hi:
            pass
        elif not lower:
            self.limit += 1  # nothing to compare with yet: try one more
        else:
            # below the knee c requests move c/k times what k did; past it, no more: one more request pays
            # while it adds at least `efficiency` of that proportional share
            k = max(lower)
            expected = (self.limit - k) / k
            if rate >= self._best[k] * (1 + self.efficiency * expected):
                self.limit += 1
        self.history.append(self.limit)


class Gate:
    """A semaphore whose size can change: at most ``limit`` holders at once."""

    def __init__(self, limit: int) -> None:
        self._cond = threading.Condition()
        self._limit = max(1, limit)
        self._held = 0

    def set_limit(self, limit: int) -> None:
        with self._cond:
            self._limit = max(1, limit)
            self._cond.notify_all()

    def __enter__(self) -> Gate:
        with self._cond:
            while self._held >= self._limit:
                self._cond.wait()
            self._held += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._held -= 1
            self._cond.notify()
