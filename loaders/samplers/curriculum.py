"""A two-stage curriculum: a high-quality core subset first, then everything. Pure, no I/O.

Stage 1 (epochs ``0 .. core_epochs - 1``) serves only the samples of the core scenes; stage 2 serves all.
The stage is a function of the epoch number alone, so resuming mid-epoch, sharding and the planner's
decode-once guarantee hold in both stages (each stage's epochs are planned like any other epoch).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..plan import SCENE, SampleTable

__all__ = ["Curriculum"]


@dataclass(frozen=True, slots=True)
class Curriculum:
    """``core_epochs`` epochs on the ``core`` scenes (ids), then all scenes.

    ``core`` is usually chosen in the catalog: ``CubeDataset.from_search(..., core_filters=[...])`` makes
    the scenes matching e.g. ``cubelake:quality>=0.9`` the core. Window-level quality (the share of valid
    pixels) is ``Sampling.min_valid``, applied in both stages.
    """

    core_epochs: int
    core: Collection[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.core_epochs < 0:
            raise ValueError(f"core_epochs is a number of epochs (>= 0), got {self.core_epochs}")

    def stage(self, epoch: int) -> int:
        """1 while the core is served alone, then 2."""
        return 1 if epoch < self.core_epochs else 2

    def filter(self, table: SampleTable, scene_ids: Sequence[str], epoch: int) -> SampleTable:
        """The epoch's samples: those of core scenes in stage 1, all of them in stage 2."""
        if self.stage(epoch) == 2:
            return table
        core = np.array([sid in self.core for sid in scene_ids], bool)
        if not core.any():
            raise ValueError("the curriculum's core holds none of the dataset's scenes: stage 1 would be empty; "
                             f"core={sorted(self.core)[:5]}, scenes={list(scene_ids)[:5]}")
        return table.take(np.flatnonzero(core[table.rows[:, SCENE]]))
