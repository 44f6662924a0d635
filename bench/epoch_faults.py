"""Where a fresh process's first loader epoch spends its kernel time: page faults on fresh memory.

Runs two in-process sliding epochs of a lake scene's Zarr product (as ``bench/loader.py`` does:
windows of ``--window`` px at stride = window, batches of 64, 2 decode threads, no normalisation)
in ``--repeats`` fresh processes, each epoch timed with ``getrusage`` around it alone: wall,
user and system CPU, minor page faults, maximum resident set, chunks decoded and their decode time, the
memory the reader has mapped for decoded chunks. Then, also in fresh processes,
``--touch-mib`` MiB of fresh anonymous memory touched once per page, with and without
``madvise(MADV_HUGEPAGE)``: what one fresh page costs on this machine.

    python bench/epoch_faults.py /tmp/bench/loader/lake_1536x1536x96_c128/scenes/synth_1536x1536x96 \
        --cache-mib 224 --window 24 --repeats 3
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import resource
import time
from typing import Any

import numpy as np


def _usage() -> resource.struct_rusage:
    return resource.getrusage(resource.RUSAGE_SELF)


def _delta(r0: resource.struct_rusage, r1: resource.struct_rusage, wall: float) -> dict[str, float]:
    return {"wall_s": wall, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
            "minflt": r1.ru_minflt - r0.ru_minflt, "maxrss_mib": r1.ru_maxrss / 1024}


def epoch(product: str, cache_mib: int, window: int) -> dict[str, dict[str, float]]:
    from cubelake.loaders import CubeDataset, PlanSpec, ReaderConfig, Sampling, Spectral

    ds = CubeDataset([product], sampling=Sampling(mode="sliding", size=window, stride=window, labels="none"),
                     spectral=Spectral(normalize="none"), plan=PlanSpec(seed=0, batch_size=64, chunks_per_round=8),
                     reader=ReaderConfig(cache_bytes=cache_mib * 2**20, threads=2), prefetch=8, prefer=("zarr",))
    ds.plan(0, worker=0, num_workers=1)
    runs = []
    for _ in range(2):  # the first epoch of the process, then a second one over memory already touched
        r0, t0 = _usage(), time.perf_counter()
        n = sum(int(b["image"].shape[0]) for b in ds.timed(ds))
        out = _delta(r0, _usage(), time.perf_counter() - t0)
        m = ds.metrics()
        # the reader's decode buffers mapped so far (private attribute: a benchmark's look inside)
        mapped = ds._reader._buffers.allocated if ds._reader is not None else 0
        runs.append({**out, "samples": n, "decode_s": m.decode_s, "chunks_decoded": m.chunks_decoded,
                     "buffers_mib": mapped / 2**20})
    return {"first": runs[0], "second": runs[1]}


def touch(mib: int, huge: bool) -> dict[str, float]:
    r0, t0 = _usage(), time.perf_counter()
    # private, as malloc's memory is: a shared anonymous mapping (mmap's default) never gets huge pages
    m = mmap.mmap(-1, mib * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    np.frombuffer(m, np.uint8)[::4096] = 1
    return _delta(r0, _usage(), time.perf_counter() - t0)


def _fresh(fn: Any, *args: Any) -> dict[str, Any]:
    with mp.get_context("spawn").Pool(1) as pool:
        return dict(pool.apply(fn, args))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scene", help="a lake's scene folder (holding <id>.zarr)")
    ap.add_argument("--cache-mib", type=int, default=224)
    ap.add_argument("--window", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--touch-mib", type=int, default=256)
    a = ap.parse_args()
    for _ in range(a.repeats):
        both = _fresh(epoch, a.scene, a.cache_mib, a.window)
        for which, e in both.items():
            print(f"{which} epoch: {e['samples']:.0f} samples in {e['wall_s']:.3f} s; CPU user {e['user_s']:.2f} s, "
                  f"sys {e['sys_s']:.2f} s; {e['minflt']:.0f} minor faults; max RSS {e['maxrss_mib']:.0f} MiB; "
                  f"{e['chunks_decoded']:.0f} chunks decoded in {e['decode_s']:.2f} s (thread time); decode buffers "
                  f"mapped {e['buffers_mib']:.0f} MiB", flush=True)
    for huge in (False, True):
        r = _fresh(touch, a.touch_mib, huge)
        print(f"touch {a.touch_mib} MiB fresh, MADV_{'' if huge else 'NO'}HUGEPAGE: {r['wall_s']:.3f} s, "
              f"sys {r['sys_s']:.3f} s, {r['minflt']:.0f} faults ({r['sys_s'] / max(1, r['minflt']) * 1e6:.1f} µs each)")


if __name__ == "__main__":
    main()
