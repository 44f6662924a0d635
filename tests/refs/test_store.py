"""The reference store serves zarr's byte-range requests from inline values and from targets alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer.core import default_buffer_prototype
from zarr.core.sync import sync

from cubelake.refs import build_refs, open_store, write_refs
from tests.conftest import hsi_cube


def test_byte_ranges_of_inline_and_referenced_keys(tmp_path: Path, geotiff) -> None:
    src = geotiff("t.tif", hsi_cube(2, 64, 64), tiled=True, blockxsize=64, blockysize=64, compress="deflate")
    refs = build_refs(str(src))
    store = open_store(write_refs(refs, tmp_path / "r.json"))
    proto = default_buffer_prototype()
    zgroup = refs.meta[".zgroup"]
    _, off, n = refs.chunks["data/0.0.0"]
    tile = src.read_bytes()[off:off + n]
    for key, whole in ((".zgroup", zgroup), ("data/0.0.0", tile)):
        for req, want in ((None, whole), (RangeByteRequest(2, 7), whole[2:7]), (OffsetByteRequest(3), whole[3:]),
                          (SuffixByteRequest(4), whole[-4:])):
            got = sync(store.get(key, proto, req))
            assert got is not None
            assert got.to_bytes() == want, (key, req)
    assert sync(store.get("data/9.9.9", proto)) is None
    assert np.frombuffer(sync(store.get("data/0.0.0", proto)).to_bytes(), np.uint8).size == n
