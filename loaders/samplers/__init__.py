"""Sampling strategies behind one protocol (:class:`Sampler`), and the pure steps that shape an epoch's table.

* :mod:`.sliding`, :mod:`.random`, :mod:`.labels` — which windows a scene gives (one strategy per module);
* :mod:`.region` — limit windows to an area of interest (only chunks meeting it are read);
* :mod:`.curriculum` — a core subset for the first epochs, then all.

Geographic balance (geohash cells, hot-region downsampling, loss weights) is :mod:`cubelake.loaders.geo`.
"""

from ._base import Sampler, SceneView
from .curriculum import Curriculum
from .labels import LabelSampler
from .random import RandomSampler
from .region import Region, WindowRule, region_of, restrict
from .sliding import SlidingSampler

__all__ = ["Curriculum", "LabelSampler", "RandomSampler", "Region", "Sampler", "SceneView", "SlidingSampler",
           "WindowRule", "region_of", "restrict"]
