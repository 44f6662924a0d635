"""Hedged requests: a storage call that is slow to answer gets one duplicate, and the first answer wins.

A few requests to an object store take far longer than the rest (a stalled connection, a slow
node); the epoch waits for the slowest. Issuing the same read again once a request has taken
longer than most do (the ``q`` quantile of the latencies seen, at least a floor) and taking
whichever answer comes first cuts that tail for a few per cent more requests.

This module is the waiting logic only, with no I/O: :func:`hedged` runs a callable through a
``submit`` function (an executor's) and :func:`hedge_delay` picks the delay from a latency
histogram. A synchronous call cannot be cancelled, so the loser is left to finish on its own
thread and its result is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

from .metrics import latency_quantile

__all__ = ["Hedged", "hedge_delay", "hedged"]

T = TypeVar("T")

#: requests recorded before the latency quantile (rather than the floor alone) sets the delay
MIN_SAMPLES = 20


@dataclass(frozen=True, slots=True)
class Hedged(Generic[T]):
    """The result of a hedged call; ``hedged``: a duplicate was issued; ``won``: the duplicate answered first."""

    value: T
    hedged: bool
    won: bool


def hedge_delay(floor_s: float, hist: list[int], q: float, min_samples: int = MIN_SAMPLES) -> float:
    """Seconds to wait before a duplicate: ``floor_s``, or the ``q`` latency quantile of ``hist`` if longer
    (once it holds ``min_samples`` requests; fewer say little about the tail)."""
    if sum(hist) < min_samples:
        return floor_s
    return max(floor_s, latency_quantile(hist, q))


def hedged(call: Callable[[], T], delay_s: float,
           submit: Callable[[Callable[[], T]], Future[T]]) -> Hedged[T]:
    """``call()`` through ``submit``; if it has not finished after ``delay_s``, one duplicate is submitted.

    The first attempt to succeed wins (the primary when both are done). An attempt that fails while
    the other still runs waits for the other; when both fail, the primary's error is raised. The
    loser is not waited for.
    """
    primary = submit(call)
    done, _ = wait([primary], timeout=delay_s)
    if done:
        return Hedged(primary.result(), hedged=False, won=False)
    backup = submit(call)
    pending: set[Future[T]] = {primary, backup}
    while pending:
        _, pending = wait(pending, return_when=FIRST_COMPLETED)
        for f in (primary, backup):
            if f not in pending and f.exception() is None:
                return Hedged(f.result(), hedged=True, won=f is backup)
    return Hedged(primary.result(), hedged=True, won=False)  # both failed: raises the primary's error
