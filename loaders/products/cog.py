"""``cog`` products: a tiled GeoTIFF, read through references built from its header (``cubelake.refs.build_refs``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from cubelake.record import SceneRecord
from cubelake.storage import S3Options, parent_url

from ._base import ChunkSource
from .refs import open_refs

__all__ = ["open_cog"]

def open_cog(url: str, scene_id: str, options: S3Options | None, record: SceneRecord | None,
              labels_path: Path | None) -> ChunkSource:
    from cubelake.refs.api import build_refs
    from cubelake.refs.formats import write_refs

    refs = build_refs(url, storage_options=options)
    tmp = Path(tempfile.mkdtemp(prefix="cubelake-cogrefs-"))
    try:  # the references are read into memory on opening; the file is only their way in
        path = write_refs(refs, tmp / f"{scene_id}.refs.json", "json")
        root = parent_url(url)
        src = open_refs(str(path), scene_id, options, record, [root], kind="cog", labels_path=labels_path)
        src.url = url  # the COG, not the references' temporary file (messages, and what lies beside it)
        enc = record.encoding if record is not None else None
        if enc is not None and (src.scale, src.add_offset) == (1.0, 0.0):
            # references built from the COG's header carry no CF scale/offset (GDAL keeps them in its own
            # metadata): the scene record holds the encoding the COG was written with
            src.scale = float(enc.scale_factor) if enc.scale_factor is not None else 1.0
            src.add_offset = float(enc.add_offset) if enc.add_offset is not None else 0.0
        return src
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

