"""Helpers shared by the benchmarks: the page cache, so cold runs read from disk."""

from __future__ import annotations

import os
from pathlib import Path


def can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def lo_rx() -> int:
    """Bytes received on the loopback interface (all processes; only the measured run uses it)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    return 0
