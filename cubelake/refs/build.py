"""Build the reference set of one TIFF: its tiles become the chunks of ``data (band, y, x)``.

The metadata and coordinates come from the same :func:`dataset_template` as the native Zarr
product, written by xarray as Zarr v2 (the version kerchunk's formats and fsspec's reference
filesystem speak) into memory; the ``data`` array then gets the :class:`TiffTileCodec` of the
file and one reference per stored tile. Empty tiles (byte count 0, GDAL's sparse files) are left
out and read as the fill value, as GDAL reads them.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

from cubelake.cube import CubeSpec, dataset_template
from cubelake.errors import NotReferenceableError

from .layout import TiffLayout
from .model import RefSet, Target

__all__ = ["reference_tiff", "template_refs"]


def template_refs(spec: CubeSpec, chunks: tuple[int, int, int]) -> RefSet:
    """Metadata and coordinate keys of a cube (no ``data`` chunks), as Zarr v2."""
    from zarr.storage import MemoryStore

    ds, enc = dataset_template(spec, chunks)
    written: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(MemoryStore(written), mode="w", zarr_format=2, compute=False, encoding=enc, consolidated=False)
    refs = RefSet()
    for key, buf in written.items():
        if key.startswith("data/") and not key.endswith((".zarray", ".zattrs")):
            continue
        refs.meta[key] = buf.to_bytes()
    return refs


def _fill(value: float | None) -> Any:
    if value is None:
        return None
    if math.isnan(value):
        return "NaN"
    return int(value) if float(value).is_integer() else value


def reference_tiff(layout: TiffLayout, target: Target, spec: CubeSpec, *, chunk: int | None = None,
                   tile_size_rule: bool = True) -> RefSet:
    """References to every stored tile of ``layout`` (the file at ``target``) as ``data`` chunks."""
    problems = layout.problems(chunk, tile_size_rule=tile_size_rule)
    if problems:
        raise NotReferenceableError(f"{target.url} cannot be referenced as it is: " + "; ".join(problems))
    nb, ny, nx = spec.shape
    if (nb, ny, nx) != (layout.samples, layout.height, layout.width):
        raise NotReferenceableError(f"{target.url}: the cube description {spec.shape} does not match the file's "
                                    f"{layout.samples} bands x {layout.height} x {layout.width}")
    th, tw = layout.tile
    cs = layout.chunk_samples
    refs = template_refs(spec, (cs, th, tw))
    zarray = refs.json_meta("data/.zarray")
    zarray.update(
        compressor=layout.codec().get_config(),
        filters=None,
        chunks=[cs, th, tw],
        fill_value=_fill(spec.encoding.fill_value),
        order="C",
    )
    zarray.pop("dimension_separator", None)  # "." is the v2 default and what kerchunk writes
    refs.meta["data/.zarray"] = json.dumps(zarray, allow_nan=True).encode()
    refs.targets.append(target)
    offsets = layout.offsets.tolist()
    counts = layout.bytecounts.tolist()
    chunks = refs.chunks
    i = 0
    for p in range(nb // cs):
        for r in range(layout.tiles_down):
            for c in range(layout.tiles_across):
                n = counts[i]
                if n:
                    chunks[f"data/{p}.{r}.{c}"] = (0, offsets[i], n)
                i += 1
    refs.consolidate()
    return refs
