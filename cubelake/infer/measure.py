"""One trial of a batch-size sweep: a model run at one batch size on CPU or CUDA, timed, its peak memory read.

A trial creates a random input of ``batch`` samples on the device (the model spec's
:meth:`~.spec.ModelSpec.input_shape`; :func:`make_input`), runs ``warmup`` untimed then ``iters`` timed forward passes (inference mode) and keeps every time;
the batch's time is the median. Only the model is timed: the input is already on the device.

Timing: on CUDA each pass sits between two ``torch.cuda.Event`` records and the device is synchronised
before the times are read; on CPU ``time.perf_counter`` around each pass.

Peak memory (``Trial.peak_bytes``): on CUDA ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats`` (absolute: the parameters are in it, the CUDA context is not; the caching
allocator's reserved peak is ``reserved_bytes``). On CPU the growth of the process's anonymous memory
(heap and ``mmap``: what the memory cap bounds) over the trial: freed heap pages are first handed back
(``malloc_trim``), the kernel's resident high-water mark (``VmHWM``) is reset by writing ``5`` to
``/proc/self/clear_refs``, and after the trial the peak growth of the resident set less the file pages
it gained (``RssFile``: library code of kernels first used, not data) is kept; the raw resident growth
is in ``extra["rss_peak_bytes"]`` (Linux; elsewhere ``None``).

Out of memory: ``torch.cuda.OutOfMemoryError`` (and allocator failures reported as ``RuntimeError``:
cuDNN, the CPU allocator) make an OOM trial, not an error; the cache is emptied after it.

The CPU memory cap is enforced for real: the trial runs in a fresh process that, once the model is
loaded and has run one sample (so every thread and lazy buffer exists), lowers its own
``RLIMIT_DATA`` to the data segment it has then plus the cap. ``RLIMIT_DATA`` (Linux >= 4.7) bounds
the private writable memory a process maps (heap and anonymous ``mmap``), so torch's CPU allocator
fails ("can't allocate memory") exactly when the trial would need more than the cap; ``RLIMIT_AS``
was tried too and rejected: it also counts the 64 MiB address-space reservations glibc makes per
thread arena, which are never used (a 200 MiB cap failed batches whose resident growth was 95 MiB).
Capped trials also run with a fixed glibc mmap threshold (128 KiB, see :mod:`._fresh`), so that a freed
activation is returned at once instead of lingering in a per-thread heap: without it, identical trials
needed one activation more or less at random. The peak under a cap is thus the memory the model holds;
the gap between the memory model's prediction and the measured wall is what the allocator maps but
the model never touches (the seed's M_frag). A trial process that dies by a signal under a cap (a
library that does not check its allocations) is counted as an OOM trial, with the signal in its ``error``.

Every trial (in process or fresh) follows :func:`prime`: one pass at batch 1 first, so the first
trial's peak does not carry lazy initialisation, and each starts from an emptied cache.

Fresh processes (``fresh_process=True``, and always for a CPU cap): each trial is a process forked
from a trial server that imported torch once (:mod:`._fresh`, which says why not ``multiprocessing``),
with no allocator cache, CUDA context or thread pool of an earlier trial; it loads the model from its
file, primes it and runs the trial.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from .errors import ModelError
from .model import LoadedModel
from .sweep import DEFAULT_BATCHES, MAX_BATCH, SweepSettingsError

__all__ = ["DTYPES", "SweepSettings", "Trial", "cap_cpu_memory", "measure_batch", "prime", "resolve_device", "run_trial"]

log = logging.getLogger(__name__)

DType = Literal["fp32", "fp16", "bf16"]
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
Phase = Literal["sweep", "oom"]
_OOM_TEXT = ("out of memory", "can't allocate memory", "not enough memory", "cannot allocate memory",
             "cudnn_status_alloc_failed", "std::bad_alloc")


@dataclass(frozen=True)
class SweepSettings:
    """How to sweep: batch sizes, device, dtype, iterations, memory cap and OOM search.

    ``patch``/``bands``: the input's patch side and band count (default: the model spec's); ``size``:
    a dense model's tile side (pixels). ``memory_cap``: bytes; on CPU the growth a trial may have
    (enforced with ``RLIMIT_DATA`` in a fresh process), on CUDA ``set_per_process_memory_fraction``
    of the device's memory. ``find_oom`` searches the wall from the largest batch (x``grow``, then
    bisection to ``tol``, at most ``max_trials`` trials of ``oom_warmup`` + ``oom_iters`` passes).
    ``timeout_s``: a fresh-process trial that runs longer is killed (an error).
    """

    batches: tuple[int, ...] = DEFAULT_BATCHES
    device: str = "cpu"
    dtype: DType = "fp32"
    warmup: int = 20
    iters: int = 100
    patch: int | None = None
    bands: int | None = None
    size: int = 64
    fresh_process: bool = False
    memory_cap: int | None = None
    find_oom: bool = False
    threshold: float = 0.05
    grow: float = 1.5
    tol: float = 0.05
    max_trials: int = 15
    oom_warmup: int = 1
    oom_iters: int = 1
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        b = self.batches
        if not b or any(not isinstance(x, int) or isinstance(x, bool) or not 1 <= x <= MAX_BATCH for x in b):
            raise SweepSettingsError(f"batch sizes {b!r}: give whole numbers in 1..{MAX_BATCH}, e.g. 64,128,256")
        if list(b) != sorted(set(b)):
            object.__setattr__(self, "batches", tuple(sorted(set(b))))
        if self.dtype not in DTYPES:
            raise SweepSettingsError(f"dtype {self.dtype!r}: one of {', '.join(DTYPES)}")
        if self.device != "cpu" and not (self.device == "cuda" or self.device.startswith("cuda:")):
            raise SweepSettingsError(f"device {self.device!r}: 'cpu', 'cuda' or 'cuda:N'")
        for name, v, lo in (("warmup", self.warmup, 0), ("iters", self.iters, 1), ("max_trials", self.max_trials, 1),
                            ("oom_warmup", self.oom_warmup, 0), ("oom_iters", self.oom_iters, 1), ("size", self.size, 1)):
            if not isinstance(v, int) or v < lo:
                raise SweepSettingsError(f"{name}={v!r}: a whole number >= {lo}")
        for name, p in (("patch", self.patch), ("bands", self.bands)):
            if p is not None and (not isinstance(p, int) or p < 1):
                raise SweepSettingsError(f"{name}={p!r}: a whole number >= 1 (or leave it to the model spec)")
        if self.memory_cap is not None and not (isinstance(self.memory_cap, int) and self.memory_cap > 0):
            raise SweepSettingsError(f"memory cap {self.memory_cap!r}: a number of bytes > 0, e.g. 2GiB")
        if not (self.threshold > 0 and self.grow > 1 and self.tol > 0 and self.timeout_s > 0):
            raise SweepSettingsError(f"threshold {self.threshold}, grow {self.grow}, tol {self.tol}, timeout "
                                     f"{self.timeout_s}: need threshold > 0, grow > 1, tol > 0, timeout > 0")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def fresh(self) -> bool:
        """Whether trials run in fresh processes (asked, or needed to enforce a CPU memory cap)."""
        return self.fresh_process or (self.memory_cap is not None and self.device == "cpu")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["batches"] = list(self.batches)
        d["fresh"] = self.fresh
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepSettings:
        keep = {k: v for k, v in d.items() if k != "fresh"}
        keep["batches"] = tuple(keep.get("batches", DEFAULT_BATCHES))
        return cls(**keep)


@dataclass(frozen=True)
class Trial:
    """One batch size run once: ``ok`` (ran), ``oom`` (out of memory) or neither (``error``).

    ``ms_per_batch`` is the median of ``times_ms`` (one per timed pass); ``peak_bytes`` see the module
    docstring. ``phase``: ``"sweep"`` (the timing curve) or ``"oom"`` (a step of the OOM search).
    """

    batch: int
    ok: bool
    oom: bool = False
    phase: Phase = "sweep"
    ms_per_batch: float | None = None
    times_ms: tuple[float, ...] = ()
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    fresh_process: bool = False
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ms_per_sample(self) -> float | None:
        return None if self.ms_per_batch is None else self.ms_per_batch / self.batch

    @property
    def samples_per_s(self) -> float | None:
        if self.ms_per_batch is None or self.ms_per_batch <= 0:
            return None
        return 1000.0 * self.batch / self.ms_per_batch

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["times_ms"] = list(self.times_ms)
        d["ms_per_sample"] = self.ms_per_sample
        d["samples_per_s"] = self.samples_per_s
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        keep = {k: v for k, v in d.items() if k not in ("ms_per_sample", "samples_per_s")}
        keep["times_ms"] = tuple(keep.get("times_ms", ()))
        return cls(**keep)


def resolve_device(device: str) -> str:
    """``device`` if this torch can use it; :class:`SweepSettingsError` (naming the fix) if not."""
    if device == "cpu":
        return device
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise SweepSettingsError(f"--device {device}: CUDA is not available ({why}; torch {torch.__version__}); "
                                 "use --device cpu, or run on a machine with an NVIDIA GPU and a CUDA build of torch")
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        raise SweepSettingsError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here (0-based)")
    return device


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(t in text for t in _OOM_TEXT)


def _status_bytes(key: str) -> int | None:
    """A ``VmXxx`` line of ``/proc/self/status`` in bytes (Linux), else ``None``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _malloc_trim() -> None:
    """Hand freed heap pages back to the system (glibc), so an earlier trial's freed memory, still resident,
    is not reused unseen by the next trial's peak."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim  # noqa: B018  (glibc only)
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _peak_probe(device: str) -> Iterator[dict[str, int | None]]:
    """Yields a dict filled with ``peak``/``reserved`` bytes when the block ends (see the module docstring)."""
    out: dict[str, int | None] = {"peak": None, "reserved": None}
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
        yield out
        out["peak"] = int(torch.cuda.max_memory_allocated(device))
        out["reserved"] = int(torch.cuda.max_memory_reserved(device))
        return
    _malloc_trim()
    resettable = _reset_rss_peak()
    rss0, file0 = _status_bytes("VmRSS"), _status_bytes("RssFile")
    yield out
    hwm, file1 = _status_bytes("VmHWM"), _status_bytes("RssFile")
    if resettable and rss0 is not None and hwm is not None:
        paged_in = max(0, (file1 or 0) - (file0 or 0))  # code of kernels first used here: not the trial's data
        out["rss_peak"] = hwm - rss0
        out["peak"] = max(0, hwm - rss0 - paged_in)


def _time_cpu(model: LoadedModel, x: torch.Tensor, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        model(x)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        model(x)
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def _time_cuda(model: LoadedModel, x: torch.Tensor, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        model(x)
    torch.cuda.synchronize(x.device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        model(x)
        end.record()
    torch.cuda.synchronize(x.device)
    return [float(start.elapsed_time(end)) for start, end in events]


def make_input(model: LoadedModel, batch: int, settings: SweepSettings) -> torch.Tensor:
    """A standard-normal input of ``batch`` samples made on the device itself (seeded; a large CUDA batch is
    never drawn on the CPU and copied)."""
    shape = model.spec.input_shape(batch, patch=settings.patch, bands=settings.bands, size=settings.size)
    gen = torch.Generator(device=settings.device).manual_seed(0)
    return torch.randn(shape, generator=gen, device=settings.device, dtype=settings.torch_dtype)


def measure_batch(model: LoadedModel, batch: int, settings: SweepSettings, *, phase: Phase = "sweep") -> Trial:
    """Run ``model`` (already on ``settings.device`` as ``settings.dtype``) at ``batch`` in this process.

    Out of memory gives an OOM trial; any other failure of the model raises :class:`ModelError`.
    """
    device = settings.device
    warmup, iters = (settings.warmup, settings.iters) if phase == "sweep" else (settings.oom_warmup, settings.oom_iters)
    oom: BaseException | None = None
    x: torch.Tensor | None = None
    _release(device)  # each trial starts from an empty cache: what it reserves is its own
    try:
        with _cuda_cap(device, settings.memory_cap), _peak_probe(device) as mem:
            x = make_input(model, batch, settings)
            timer = _time_cuda if device.startswith("cuda") else _time_cpu
            times = timer(model, x, warmup, iters)
            x = None
    except (RuntimeError, MemoryError) as exc:
        x = None
        if not _is_oom(exc):
            shape = model.spec.input_shape(batch, patch=settings.patch, bands=settings.bands, size=settings.size)
            raise ModelError(f"{model.path}: the model fails at batch {batch} on {device} as {settings.dtype} "
                             f"(input {tuple(shape)}): {_first_line(exc)}") from None
        oom = exc
    if oom is not None:
        text = _first_line(oom)
        del oom  # its traceback holds the tensors: drop it before emptying the cache
        _release(device)
        return Trial(batch=batch, ok=False, oom=True, phase=phase, error=text)
    return Trial(batch=batch, ok=True, phase=phase, ms_per_batch=float(statistics.median(times)),
                 times_ms=tuple(times), peak_bytes=mem["peak"], reserved_bytes=mem["reserved"],
                 extra={"rss_peak_bytes": mem["rss_peak"]} if "rss_peak" in mem else {})


def _first_line(exc: BaseException) -> str:
    """The line of an error that says what went wrong (TorchScript puts the original error last)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("The following operation failed in the TorchScript interpreter"):
        last = lines[-1]
        head = last.split(":", 1)[0]
        named = " " not in head and head.endswith(("Error", "Exception"))  # e.g. "RuntimeError: ..."
        return last if named else f"{type(exc).__name__}: {last}"
    return f"{type(exc).__name__}: {lines[0]}"


def _release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _cuda_cap(device: str, cap: int | None) -> Iterator[None]:
    """A CUDA memory cap as ``set_per_process_memory_fraction`` for the block (restored to 1.0 after)."""
    if cap is None or not device.startswith("cuda"):
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def prime(model: LoadedModel, settings: SweepSettings) -> None:
    """One pass at batch 1 (and on CPU a parallel op that starts the thread pool), so that lazy buffers,
    kernels and threads exist before a trial measures memory or runs under a cap."""
    try:
        model(make_input(model, 1, settings))
    except (RuntimeError, MemoryError) as exc:
        shape = model.spec.input_shape(1, patch=settings.patch, bands=settings.bands, size=settings.size)
        raise ModelError(f"{model.path}: the model fails on one sample {tuple(shape)} on {settings.device} as "
                         f"{settings.dtype}: {_first_line(exc)} (check --patch/--bands against the model)") from None
    if settings.device.startswith("cuda"):
        torch.cuda.synchronize(settings.device)
    else:
        torch.ones(1 << 22).sum()
    gc.collect()


def cap_cpu_memory(cap: int) -> int:
    """Lower this process's ``RLIMIT_DATA`` to its data segment now plus ``cap`` bytes; the limit set.

    Irreversible in practice (the trial process ends after its trial): call it after :func:`prime`.
    """
    import resource  # POSIX only

    data = _status_bytes("VmData")
    if data is None:
        raise SweepSettingsError("a CPU memory cap needs Linux (/proc/self/status and RLIMIT_DATA); "
                                 "run without --memory-cap")
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = data + cap
    if hard != resource.RLIM_INFINITY and hard < limit:
        raise SweepSettingsError(f"memory cap: the hard data limit ({hard} bytes, ulimit -d) is below "
                                 f"{limit}; raise it or lower --memory-cap")
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return limit


def run_trial(model: LoadedModel, batch: int, settings: SweepSettings, *, phase: Phase = "sweep") -> Trial:
    """One trial at ``batch``: in a fresh process when ``settings.fresh`` (the model is loaded there
    again from ``model.path`` with ``model.spec``), else here with ``model`` as it is."""
    if settings.fresh:
        from ._fresh import fresh_trial

        return fresh_trial(model, batch, settings, phase)
    return measure_batch(model, batch, settings, phase=phase)
