"""The malformed-input corpus: every case and the CLI runs that cover it, and writing it to disk.

Batches (one ``ingest --format json`` and one text ``validate`` per folder of inputs, plus two
good real scenes that must still be ingested) cover the inputs that can share a process;
special files, bombs, odd names and bad options run alone. ``python -m tests.corpus.generate
DIR`` writes the corpus to DIR and lists it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cubelake.ingest import profile as _profile_module

from .cases_iso import NAMES_RUNS, add_bombs, add_names, add_profiles, add_special, name_cases
from .cases_landsat import LANDSAT_RUNS, LT5_MTL, landsat_cases
from .cases_raster import (
    ENMAP,
    ENVI_HDR,
    ENVI_RUNS,
    HYDICE,
    MAT_RUNS,
    TIFF_RUNS,
    envi_cases,
    mat_cases,
    tiff_cases,
)
from .cases_refs import add_refs
from .model import Case, Corpus, Run

__all__ = ["build_corpus", "materialize"]

#: bundled profile the bad profiles are derived from
PROFILE = Path(_profile_module.__file__).parent / "profiles" / "enmap-l2a.yaml"


def _batch(c: Corpus, keys: tuple[str, str], folder: str, controls: tuple[str, ...], timeout: float,
           cases: list[Case]) -> None:
    """One ``ingest --format json`` and one text ``validate`` over ``folder`` plus the good ``controls``."""
    ingest_key, validate_key = keys
    for case in cases:
        assert case.runs == keys, (case.id, case.runs)
        c.add(case)
    c.runs[ingest_key] = Run(ingest_key, "ingest", (folder,), controls, fmt="json", timeout=timeout, batch=True)
    c.runs[validate_key] = Run(validate_key, "validate", (folder,), controls, timeout=timeout, batch=True)


def build_corpus() -> Corpus:
    """Every case and run (pure: nothing is written)."""
    c = Corpus()
    _batch(c, TIFF_RUNS, "b_tiff", (ENMAP, ENVI_HDR), 240.0, tiff_cases())
    _batch(c, ENVI_RUNS, "b_envi", (ENMAP, ENVI_HDR), 120.0, envi_cases())
    _batch(c, MAT_RUNS, "b_mat", (ENMAP, HYDICE), 120.0, mat_cases())
    _batch(c, LANDSAT_RUNS, "b_landsat", (ENMAP, LT5_MTL), 120.0, landsat_cases())
    _batch(c, NAMES_RUNS, "b_names", (ENMAP, ENVI_HDR), 120.0, name_cases())
    add_special(c)
    add_names(c)
    add_bombs(c)
    add_profiles(c, PROFILE)
    add_refs(c)
    for case in c.cases:
        assert case.runs, case.id
        assert all(k in c.runs for k in case.runs), case.id
    return c


def materialize(c: Corpus, root: Path, real: Path) -> None:
    """Write every case's files under ``root`` from the real scenes in ``real``."""
    root.mkdir(parents=True, exist_ok=True)
    for case in c.cases:
        case.build(root, real)


def main(argv: list[str]) -> int:
    from tests.conftest import REAL

    root = Path(argv[1]) if len(argv) > 1 else Path("corpus")
    c = build_corpus()
    materialize(c, root, REAL)
    for case in c.cases:
        print(f"{case.id:45s} {case.expect:15s} {','.join(case.runs):40s} {case.scene!r}")
    print(f"{len(c.cases)} inputs, {len(c.runs)} runs -> {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
