"""``make samples``: one small product of each delivery format cubelake reads, for trying the readers.

Real EMIT, PRISMA, EnMAP and DESIS products need an account and weigh gigabytes; these follow each
product's published layout (see the modules beside this one for the specifications and
versions) with few bands and pixels. Usage: ``python -m cubelake.testing.samples FOLDER``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .dlr import write_desis_delivery, write_enmap_delivery
from .emit import write_emit
from .netcdf import write_cf_cube
from .prisma import write_prisma


def write_samples(out: Path) -> list[Path]:
    """Write the samples into ``out``; returns what a user would name to ingest each."""
    out.mkdir(parents=True, exist_ok=True)
    emit = write_emit(out / "EMIT_L2A_RFL_001_20230217T064052_2304804_005.nc", n_bands=48).path
    prisma = write_prisma(out / "PRS_L2D_STD_20200613102341_20200613102345_0001.he5").path
    enmap = write_enmap_delivery(out, "L2A").folder
    desis = write_desis_delivery(out, "L2A").folder
    cube = out / "research_cube.nc"
    write_cf_cube(cube)
    return [emit, prisma, enmap, desis, cube]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m cubelake.testing.samples FOLDER", file=sys.stderr)
        return 2
    for path in write_samples(Path(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
