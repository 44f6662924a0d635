"""Opening a Zarr product asks the store only for Zarr v3 metadata; a Zarr v2 store is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import zarr
from zarr.storage import WrapperStore

from cubelake.storage import Store
from loaders.products import ProductError, open_zarr


class _Recording(WrapperStore[Any]):
    keys: ClassVar[list[str]] = []

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        _Recording.keys.append(key)
        return await super().get(key, *args, **kwargs)

    async def exists(self, key: str) -> bool:
        _Recording.keys.append(key)
        return await super().exists(key)


def test_opening_a_product_asks_for_no_zarr_v2_metadata(synth_lake: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each v2 probe (.zattrs, .zgroup, .zmetadata) is a request per scene open on an object store (three 404s)."""
    original = Store.zarr_store
    monkeypatch.setattr(Store, "zarr_store", lambda self, **kw: _Recording(original(self, **kw)))
    _Recording.keys = []
    scene = Path(synth_lake["scenes"][0])  # type: ignore[index]
    src = open_zarr(str(scene / f"{scene.name}.zarr"), scene.name, None, None)
    assert src.grid.n_chunks > 0
    assert _Recording.keys, "the recording store was not used"
    v2 = [k for k in _Recording.keys if k.rsplit("/", 1)[-1] in (".zattrs", ".zgroup", ".zmetadata", ".zarray")]
    assert v2 == []


def test_a_zarr_v2_store_is_refused_by_name(tmp_path: Path) -> None:
    url = tmp_path / "old.zarr"
    group = zarr.open_group(str(url), mode="w", zarr_format=2)
    group.create_array("data", data=np.zeros((2, 4, 4), np.int16))
    with pytest.raises(ProductError, match=rf"{url}: not a cubelake Zarr store .*give a <id>.zarr folder"):
        open_zarr(str(url), "old", None, None)
