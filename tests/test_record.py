"""The scene record: one typed model reads and writes ``scene.json``; damaged or newer records fail clearly."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cubelake.catalog.items import item_from_record
from cubelake.errors import CorruptRecordError, CubelakeError, RecordVersionError
from cubelake.ingest import IngestOptions, Outcome, ingest
from cubelake.lake import Lake
from cubelake.record import SCENE_RECORD_FILE, SCENE_RECORD_VERSION, SceneRecord, read_scene_record
from tests.conftest import hsi_cube, no_traceback, run_cli, write_geotiff


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake with one scene of every product (and its labels), built once for the module."""
    tmp = tmp_path_factory.mktemp("record")
    src = write_geotiff(tmp / "scene.tif", hsi_cube(5, 128, 128, "int16"), nodata=-32768, tiled=True,
                        blockxsize=64, blockysize=64)
    labels = write_geotiff(tmp / "labels.tif", (hsi_cube(1, 128, 128, "uint8") % 4).astype("uint8"))
    [r] = ingest([src], tmp / "lake", IngestOptions(products=("cog", "zarr", "refs"), chunk=64, workers=1),
                 labels=labels)
    assert r.outcome is Outcome.INGESTED, r.message
    return tmp / "lake"


def _record_text(lake: Path) -> str:
    return (lake / "scenes" / "scene" / SCENE_RECORD_FILE).read_text()


def _copy_lake(lake: Path, tmp_path: Path) -> Lake:
    shutil.copytree(lake, tmp_path / "lake")
    return Lake(tmp_path / "lake", create=False)


def test_a_published_record_reads_into_typed_fields(published: Path) -> None:
    rec = SceneRecord.from_json(_record_text(published), "scene.json")
    assert rec.scene_id == "scene"
    assert rec.format_version == SCENE_RECORD_VERSION
    assert (rec.grid.height, rec.grid.width, rec.grid.chunk_shape) == (128, 128, [5, 64, 64])
    assert rec.band_count == 5
    assert [b.source_band for b in rec.bands] == [1, 2, 3, 4, 5]
    assert rec.bands[0].count == 128 * 128
    assert rec.bands[0].mean is not None
    assert rec.encoding.dtype == "int16"
    assert rec.encoding.fill_value == -32768
    assert set(rec.products) == {"cog", "zarr", "refs"}
    cog, zarr, refs = rec.product("cog"), rec.product("zarr"), rec.product("refs")
    assert cog is not None
    assert cog.blake3
    assert cog.bytes
    assert zarr is not None
    assert zarr.tree_blake3
    assert zarr.array == "data"
    assert refs is not None
    assert refs.in_place is not None
    assert refs.format == "json"
    assert refs.blake3
    assert rec.labels is not None
    assert rec.labels.cog == "scene.labels.tif"
    assert rec.labels.zarr_array == "labels"
    assert rec.source.content_hash == rec.content_hash
    assert len(rec.source.files) == 2
    assert rec.footprint is not None
    assert rec.acquisition is not None
    assert rec.acquisition.source == "unknown"
    assert rec.settings.chunk == 64
    assert rec.settings.products == ["cog", "refs", "zarr"]
    assert rec.profile.name == "generic"
    assert rec.validation.ok


def test_writing_a_record_read_gives_the_same_json(published: Path) -> None:
    text = _record_text(published)
    rec = SceneRecord.from_json(text, "scene.json")
    assert json.loads(rec.to_json()) == json.loads(text)
    assert SceneRecord.from_json(rec.to_json(), "again") == rec


def test_unknown_keys_survive_a_round_trip(published: Path) -> None:
    doc = json.loads(_record_text(published))
    doc["from_the_future"] = {"a": [1, 2.5, None]}
    doc["grid"]["pixel_is_area"] = True
    doc["products"]["cog"]["overview_levels"] = 3
    doc["products"]["tiles"] = {"path": "scene.pmtiles", "bytes": 7}
    doc["bands"][0]["snr"] = 120.5
    out = json.loads(SceneRecord.from_dict(doc, "scene.json").to_json())
    assert out == doc


def test_keys_a_record_lacks_are_not_invented(published: Path) -> None:
    doc = json.loads(_record_text(published))
    for key in ("acquisition", "footprint", "labels", "tags", "validation"):
        del doc[key]
    del doc["products"]["zarr"]["tree_blake3"]
    rec = SceneRecord.from_dict(doc, "old scene.json")
    assert rec.acquisition is None
    assert rec.labels is None
    assert rec.validation.warnings == []
    assert json.loads(rec.to_json()) == doc


@st.composite
def _json_values(draw: Any) -> Any:
    leaves = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8) | \
        st.floats(allow_nan=False, allow_infinity=False)
    return draw(st.recursive(leaves, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                             max_leaves=8))


@given(extra=st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in SceneRecord.model_fields),
                             _json_values(), max_size=4))
@settings(max_examples=60, deadline=None)
def test_any_json_kept_beside_the_known_fields(extra: dict[str, Any]) -> None:
    doc = {"scene_id": "s", "source": {"path": "/x.tif"}, "grid": {"height": 1, "width": 1, "chunk_shape": [1, 1, 1]},
           "bands": [{"source_band": 1}], **extra}
    assert json.loads(SceneRecord.from_dict(doc, "x").to_json()) == doc


def test_a_newer_record_says_to_upgrade(published: Path, tmp_path: Path) -> None:
    lake = _copy_lake(published, tmp_path)
    path = lake.scene_dir("scene") / SCENE_RECORD_FILE
    doc = json.loads(path.read_text())
    doc["format_version"] = SCENE_RECORD_VERSION + 1
    doc["grid"] = "a shape this version does not know"
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordVersionError, match=r"format_version 2 is newer.*upgrade cubelake") as exc:
        lake.scene_record("scene")
    assert str(path) in str(exc.value)
    # the ingest does not overwrite it: the scene fails with the same message
    src = Path(json.loads(_record_text(published))["source"]["path"])
    [r] = ingest([src], lake, IngestOptions(products=("cog",), chunk=64, workers=1))
    assert r.outcome is Outcome.FAILED
    assert "upgrade cubelake" in r.message
    assert json.loads(path.read_text())["format_version"] == SCENE_RECORD_VERSION + 1
    res = run_cli("lake", "--lake", str(lake.root))
    assert res.returncode == 1
    assert "upgrade cubelake" in no_traceback(res)


_CORRUPT: list[tuple[str, Any, str]] = [
    ("not JSON", "{", "not a JSON scene record"),
    ("not UTF-8", b"\xff\xfe\xfa", "not a JSON scene record"),
    ("a list", [], "a scene record is a JSON object, got list"),
    ("no grid", {"drop": "grid"}, "grid: Field required"),
    ("grid of the wrong type", {"set": ("grid", [1, 2])}, "grid: Input should be a valid dictionary"),
    ("text for a number", {"set": ("grid.height", "tall")}, "grid.height"),
    ("product outside the folder", {"set": ("products.cog.path", "../../etc/passwd")}, "not a name inside"),
    ("absolute product path", {"set": ("products.zarr.path", "/etc")}, "not a name inside"),
    ("label raster outside the folder", {"set": ("labels.cog", "../x.tif")}, "not a name inside"),
    ("unsafe scene id", {"set": ("scene_id", "../../x")}, "not a scene id"),
    ("version as text", {"set": ("format_version", "1")}, "format_version '1' is not a positive integer"),
    ("version zero", {"set": ("format_version", 0)}, "format_version 0 is not a positive integer"),
    ("deep nesting", "[" * 100_000 + "]" * 100_000, "not a JSON scene record"),
]


def _damage(text: str, how: Any) -> bytes:
    if isinstance(how, bytes):
        return how
    if isinstance(how, str):
        return how.encode()
    if isinstance(how, list):
        return json.dumps(how).encode()
    doc = json.loads(text)
    if "drop" in how:
        del doc[how["drop"]]
    else:
        dotted, value = how["set"]
        *parents, last = dotted.split(".")
        node = doc
        for p in parents:
            node = node[p]
        node[last] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("how", "needle"), [c[1:] for c in _CORRUPT], ids=[c[0] for c in _CORRUPT])
def test_a_damaged_record_is_a_clear_error_naming_the_file(published: Path, tmp_path: Path, how: Any,
                                                          needle: str, caplog: pytest.LogCaptureFixture) -> None:
    lake = _copy_lake(published, tmp_path)
    path = lake.scene_dir("scene") / SCENE_RECORD_FILE
    path.write_bytes(_damage(path.read_text(), how))
    with pytest.raises(CorruptRecordError) as exc:
        read_scene_record(path)
    assert str(exc.value).startswith(f"{path}: ")
    assert needle in str(exc.value)
    assert "re-ingest" in str(exc.value)
    # the lake treats it as absent, with a warning (a re-ingest rewrites it)
    with caplog.at_level(logging.WARNING, logger="cubelake.lake"):
        assert lake.scene_record("scene") is None
    assert needle in caplog.text
    # opening the scene folder names the file (no traceback of a JSON or validation error)
    from cubelake import open_dataset
    from cubelake.loaders import open_source

    for opener in (open_source, open_dataset):
        with pytest.raises(CubelakeError, match=str(path).replace(".", r"\.")):
            opener(lake.scene_dir("scene"))
    res = run_cli("lake", "--lake", str(lake.root))
    assert res.returncode == 0
    no_traceback(res)


def test_a_record_that_is_not_a_file_is_corrupt_not_a_hang(published: Path, tmp_path: Path) -> None:
    lake = _copy_lake(published, tmp_path)
    path = lake.scene_dir("scene") / SCENE_RECORD_FILE
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CorruptRecordError, match="not a regular file"):
        read_scene_record(path)


def test_a_missing_record_is_absent(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_scene_record(tmp_path / "nothing" / SCENE_RECORD_FILE)
    with pytest.raises(FileNotFoundError):
        read_scene_record(tmp_path / "nothing")
    assert Lake(tmp_path / "lake").scene_record("nothing") is None


def test_the_loader_names_a_scene_by_its_record(published: Path, tmp_path: Path) -> None:
    """The record's ``scene_id`` names the source (it read a key ``id`` no record has: the folder name)."""
    from cubelake.loaders import open_source

    folder = tmp_path / "renamed"
    shutil.copytree(published / "scenes" / "scene", folder)
    for prefer in (("zarr",), ("refs",), ("cog",)):
        src = open_source(folder, prefer=prefer, lake=published)  # refs in place: the lake allows the source
        assert src.scene_id == "scene", prefer
        assert src.stats is not None
        assert len(src.stats["mean"]) == 5
        labels = src.labels()
        assert labels is not None
        assert labels.shape == (128, 128)


def test_the_item_is_the_same_from_the_record_or_its_dict(published: Path) -> None:
    text = _record_text(published)
    assert item_from_record(json.loads(text)) == item_from_record(SceneRecord.from_json(text, "x"))
    item = json.loads((published / "scenes" / "scene" / "item.json").read_text())
    rebuilt = item_from_record(SceneRecord.from_json(text, "x"))
    assert json.loads(json.dumps(rebuilt)) == item
    with pytest.raises(CorruptRecordError, match="scene record: not a valid scene record"):
        item_from_record({"scene_id": "x"})
