"""The arithmetic of a batch-size sweep, pure (no torch, no I/O): elasticity, plateau, OOM search, memory model.

Definitions follow the seed article on hyperspectral inference:

- elasticity between two consecutive batch sizes ``B1 < B2`` measured at ``t1``, ``t2`` ms/sample:
  ``e = (ln t2 - ln t1) / (ln B2 - ln B1)``; ``-1`` is perfect amortisation (the batch costs the same
  however large), ``0`` is no gain at all;
- the plateau starts at the first batch size after which *every* step has ``|e| < threshold``
  (0.05) and runs to the largest measured batch size; ``None`` when the last step is still steeper;
- the OOM wall is found by growing the batch x1.5 from a start until a trial fails, then bisecting
  between the last fitting and the first failing size until ``first_oom - max_fit <= tol * max_fit``;
- memory follows ``M ~ M_param + B * A_per_sample + M_ctx + M_frag``: a least-squares line
  ``M = m0 + B * per_sample`` over the measured peaks, whose intercept ``m0`` lumps the constant terms;
  it predicts the largest batch under a cap, ``floor((cap - m0) / per_sample)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .errors import InferError

__all__ = ["DEFAULT_BATCHES", "MemoryModel", "OomSearch", "Plateau", "SweepSettingsError", "elasticities",
           "find_plateau", "fit_memory", "oom_search", "parse_batches"]

#: The seed article's suggestion: powers of two with half steps above 256.
DEFAULT_BATCHES = (64, 128, 256, 384, 512, 768, 1024)
MAX_BATCH = 1 << 24
_ELLIPSIS = re.compile(r"^\s*\.\.\.\s*$|^\s*…\s*$")


class SweepSettingsError(InferError):
    """A sweep asked with settings that cannot work (a usage error: exit 2 in the CLI)."""


def parse_batches(text: str) -> tuple[int, ...]:
    """Batch sizes from ``"64,128,256"``, or ``"64,128,...,1024"`` (a geometric run: ratio of the first two).

    The run continues the ratio ``b/a`` from ``a`` (each value rounded, strictly increasing) up to the
    last value, which is always included. The result is sorted and has no duplicates.
    """
    parts = [p for p in (s.strip() for s in text.split(",")) if p]
    if not parts:
        raise SweepSettingsError(f"--batches {text!r}: give batch sizes, e.g. 64,128,256 or 64,128,...,1024")
    if any(_ELLIPSIS.match(p) for p in parts):
        return _geometric_run(parts, text)
    return _checked(tuple(_int(p, text) for p in parts), text)


def _int(part: str, text: str) -> int:
    try:
        value = int(part)
    except ValueError:
        raise SweepSettingsError(f"--batches {text!r}: {part!r} is not a whole number; give sizes such as "
                                 "64,128,256 or 64,128,...,1024") from None
    return value


def _checked(values: tuple[int, ...], text: str) -> tuple[int, ...]:
    bad = [v for v in values if not 1 <= v <= MAX_BATCH]
    if bad:
        raise SweepSettingsError(f"--batches {text!r}: {bad[0]} is out of range; batch sizes are 1..{MAX_BATCH}")
    return tuple(sorted(set(values)))


def _geometric_run(parts: list[str], text: str) -> tuple[int, ...]:
    if len(parts) != 4 or not _ELLIPSIS.match(parts[2]):
        raise SweepSettingsError(f"--batches {text!r}: a run is written FIRST,SECOND,...,LAST (e.g. 64,128,...,1024)")
    a, b, last = _int(parts[0], text), _int(parts[1], text), _int(parts[3], text)
    _checked((a, b, last), text)
    if not a < b < last:
        raise SweepSettingsError(f"--batches {text!r}: a run needs FIRST < SECOND < LAST")
    ratio, values, x = b / a, [a], float(a)
    while True:
        x *= ratio
        v = max(round(x), values[-1] + 1)
        if v >= last:
            break
        values.append(v)
    return tuple([*values, last])


def elasticities(batches: Sequence[int], ms_per_sample: Sequence[float]) -> tuple[float, ...]:
    """``e_i = Δln(ms/sample) / Δln(B)`` between ``batches[i]`` and ``batches[i+1]`` (increasing sizes)."""
    if len(batches) != len(ms_per_sample):
        raise ValueError(f"{len(batches)} batch sizes but {len(ms_per_sample)} timings")
    out = []
    for i in range(len(batches) - 1):
        b1, b2, t1, t2 = batches[i], batches[i + 1], ms_per_sample[i], ms_per_sample[i + 1]
        if not 0 < b1 < b2:
            raise ValueError(f"batch sizes must increase and be positive: {b1} then {b2}")
        if not (t1 > 0 and t2 > 0):
            raise ValueError(f"timings must be positive: {t1}, {t2} ms/sample at batch {b1}, {b2}")
        out.append((math.log(t2) - math.log(t1)) / (math.log(b2) - math.log(b1)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Plateau:
    """Batch sizes ``start``..``end`` over which every step's ``|elasticity| < threshold``.

    ``best``: the measured batch with the lowest ms/sample (the curve may rise slightly on the plateau).
    """

    start: int
    end: int
    threshold: float
    best: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_plateau(batches: Sequence[int], ms_per_sample: Sequence[float], threshold: float = 0.05) -> Plateau | None:
    """The plateau of a timing curve (see the module docstring); ``None`` if never reached or < 2 points."""
    if not threshold > 0:
        raise ValueError(f"plateau threshold {threshold}: must be > 0 (0.05 in the seed article)")
    es = elasticities(batches, ms_per_sample)
    if not es or abs(es[-1]) >= threshold:
        return None
    i = len(es) - 1
    while i > 0 and abs(es[i - 1]) < threshold:
        i -= 1
    best = min(range(len(batches)), key=lambda j: ms_per_sample[j])
    return Plateau(start=batches[i], end=batches[-1], threshold=threshold, best=batches[best])


@dataclass(frozen=True, slots=True)
class OomSearch:
    """Where the memory wall is: the largest batch that fitted and the smallest that failed.

    ``max_fit`` is ``None`` when no batch fitted (not even 1); ``first_oom`` is ``None`` when none failed
    (the ceiling or the trial budget was reached while growing). ``trials``: every ``(batch, fitted)``
    in the order run. ``converged``: ``first_oom - max_fit <= tol * max_fit`` (or they are adjacent).
    """

    max_fit: int | None
    first_oom: int | None
    trials: tuple[tuple[int, bool], ...]
    converged: bool
    start: int
    grow: float
    tol: float
    max_trials: int

    @property
    def gap(self) -> float | None:
        """``(first_oom - max_fit) / max_fit``: the precision reached."""
        if self.max_fit is None or self.first_oom is None:
            return None
        return (self.first_oom - self.max_fit) / self.max_fit

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["trials"] = [{"batch": b, "fits": ok} for b, ok in self.trials]
        d["gap"] = self.gap
        return d


def _done(lo: int, hi: int, tol: float) -> bool:
    return hi - lo <= max(tol * lo, 1)


def oom_search(fits: Callable[[int], bool], start: int, grow: float = 1.5, tol: float = 0.05,
               max_trials: int = 15, *, max_batch: int = MAX_BATCH) -> OomSearch:
    """Find the largest batch for which ``fits(batch)`` holds: x``grow`` from ``start``, then bisection.

    ``fits`` runs one trial (True: it ran; False: out of memory). When ``start`` itself fails the
    search shrinks by ``grow`` until a size fits (or 1 fails), then bisects. At most ``max_trials``
    calls; ``max_batch`` caps the growth (reached and fitting: ``first_oom`` stays ``None``).
    """
    if not 1 <= start <= max_batch:
        raise ValueError(f"OOM search start {start}: must be in 1..{max_batch}")
    if not grow > 1 or not tol > 0 or max_trials < 1:
        raise ValueError(f"OOM search needs grow > 1, tol > 0, max_trials >= 1 (got {grow}, {tol}, {max_trials})")
    trials: list[tuple[int, bool]] = []

    def trial(b: int) -> bool:
        ok = bool(fits(b))
        trials.append((b, ok))
        return ok

    lo: int | None = None
    hi: int | None = None
    b = start
    while len(trials) < max_trials:  # bracket: grow while it fits, shrink while it fails
        if trial(b):
            lo = b
            if hi is not None or b >= max_batch:
                break
            b = min(max(math.ceil(b * grow), b + 1), max_batch)
        else:
            hi = b
            if lo is not None or b == 1:
                break
            b = max(min(math.floor(b / grow), b - 1), 1)
    while lo is not None and hi is not None and not _done(lo, hi, tol) and len(trials) < max_trials:
        mid = (lo + hi) // 2
        if trial(mid):
            lo = mid
        else:
            hi = mid
    converged = (lo is not None and hi is not None and _done(lo, hi, tol)) or (lo is None and hi == 1)
    return OomSearch(max_fit=lo, first_oom=hi, trials=tuple(trials), converged=converged, start=start,
                     grow=grow, tol=tol, max_trials=max_trials)


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """``M = m0_bytes + B * per_sample_bytes``, least squares over ``points`` ``(batch, peak bytes)``."""

    m0_bytes: float
    per_sample_bytes: float
    r2: float
    points: tuple[tuple[int, int], ...]

    def predict(self, batch: int) -> float:
        """The predicted peak (bytes) at ``batch``."""
        return self.m0_bytes + batch * self.per_sample_bytes

    def max_batch(self, cap_bytes: float) -> int | None:
        """The largest batch whose predicted peak stays within ``cap_bytes``; ``None`` if memory does not
        grow with the batch (no wall predicted) or not even one sample fits."""
        if self.per_sample_bytes <= 0:
            return None
        b = math.floor((cap_bytes - self.m0_bytes) / self.per_sample_bytes)
        return b if b >= 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {"m0_bytes": self.m0_bytes, "per_sample_bytes": self.per_sample_bytes, "r2": self.r2,
                "points": [{"batch": b, "peak_bytes": m} for b, m in self.points]}


def fit_memory(batches: Sequence[int], peaks: Sequence[float]) -> MemoryModel | None:
    """Least-squares line through ``(batch, peak bytes)``; ``None`` with fewer than two distinct batches."""
    if len(batches) != len(peaks):
        raise ValueError(f"{len(batches)} batch sizes but {len(peaks)} peaks")
    n = len(batches)
    if len(set(batches)) < 2:
        return None
    mx, my = sum(batches) / n, sum(peaks) / n
    sxx = sum((b - mx) ** 2 for b in batches)
    sxy = sum((b - mx) * (m - my) for b, m in zip(batches, peaks, strict=True))
    slope = sxy / sxx
    m0 = my - slope * mx
    ss_res = sum((m - (m0 + slope * b)) ** 2 for b, m in zip(batches, peaks, strict=True))
    ss_tot = sum((m - my) ** 2 for m in peaks)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return MemoryModel(m0_bytes=m0, per_sample_bytes=slope, r2=r2,
                       points=tuple((int(b), int(m)) for b, m in zip(batches, peaks, strict=True)))
