"""Helpers shared by the benchmarks: the page cache (cold runs read from disk), methods run in fresh processes."""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def busy_cpu_seconds() -> float:
    """Non-idle CPU seconds of the whole machine since boot (all cores; iowait counts as idle)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def lo_rx() -> int:
    """Bytes received on the loopback interface (all processes; only the measured run uses it)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    return 0


# -- running a benchmark's method in a fresh process ---------------------------------------------------


def _child(conn: Any, env: dict[str, str], module: str, name: str, kwargs: dict[str, Any]) -> None:
    os.environ.update(env)
    try:  # a script's functions live in ``__mp_main__`` in a spawned child
        mod = sys.modules["__mp_main__"] if module == "__main__" else importlib.import_module(module)
        conn.send(("ok", getattr(mod, name)(**kwargs)))
    except BaseException:  # reported to the parent
        conn.send(("error", traceback.format_exc()))
    conn.close()


def isolated(fn: Callable[..., Any], env: dict[str, str] | None = None, timeout: float = 1800, **kwargs: Any) -> Any:
    """``fn(**kwargs)`` in a new (spawned) process: a fresh interpreter, nothing cached from earlier runs, ``env``
    set before ``fn`` runs. ``fn`` is a module-level function of the calling script (or of a module)."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(send, env or {}, fn.__module__, fn.__name__, kwargs))
    p.start()
    send.close()
    try:
        if not recv.poll(timeout):
            p.kill()
            raise TimeoutError(f"{fn.__name__} ran past {timeout} s")
        status, res = recv.recv()
    finally:
        p.join(30)
    if status != "ok":
        raise RuntimeError(f"{fn.__name__} failed in its process:\n{res}")
    return res
