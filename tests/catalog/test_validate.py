"""Every item, collection and the root catalog of the real-scene lake against the official STAC 1.1 JSON
schemas, offline: the core schemas pystac ships and the extension schemas of ``../shared/schemas``.

The validator is ``cubelake.catalog.validate_stac``; these tests also show it is not forgiving where
stac-pydantic is, and that ``cubelake catalog validate`` names what is wrong and exits 1.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pystac
import pytest
from referencing import Registry
from stac_pydantic import Item
from typer.testing import CliRunner

from cubelake.catalog import validate_stac
from cubelake.catalog.validate import SCHEMA_DIR, stac_registry
from cubelake.cli import app

from .conftest import RealLake

runner = CliRunner()
PREFIX_URL = {
    "eo": "https://stac-extensions.github.io/eo/v2.0.0/schema.json",
    "proj": "https://stac-extensions.github.io/projection/v2.0.0/schema.json",
    "raster": "https://stac-extensions.github.io/raster/v2.0.0/schema.json",
    "file": "https://stac-extensions.github.io/file/v2.1.0/schema.json",
    "view": "https://stac-extensions.github.io/view/v1.1.0/schema.json",
}


@pytest.fixture(scope="module")
def registry(shared_schemas: Path) -> Registry:
    """The core schemas (pystac's) and the shared official extension schemas, which replace the bundled copies."""
    return stac_registry([shared_schemas])


def stac_files(lake: Path) -> list[Path]:
    return [lake / "catalog.json", *sorted(lake.glob("collections/*/collection.json")),
            *sorted(lake.glob("scenes/*/item.json"))]


def prefixes(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return {k.split(":", 1)[0] for k in obj if ":" in k} | {p for v in obj.values() for p in prefixes(v)}
    if isinstance(obj, list):
        return {p for v in obj for p in prefixes(v)}
    return set()


def test_bundled_extension_schemas_are_the_shared_official_copies(shared_schemas: Path) -> None:
    for path in sorted(shared_schemas.glob("*.json")):
        assert (SCHEMA_DIR / path.name).read_bytes() == path.read_bytes(), path.name
    view = json.loads((SCHEMA_DIR / "view.json").read_text())
    assert view["$id"] == PREFIX_URL["view"]
    assert "view.json" in (SCHEMA_DIR / "README.md").read_text()  # its source is named there


def test_every_item_collection_and_the_root_of_the_real_lake_is_valid(real_lake: Path, real_ingest: RealLake,
                                                                      registry: Registry) -> None:
    files = stac_files(real_lake)
    assert len([f for f in files if f.name == "item.json"]) == len(real_ingest.all_ids)
    assert len([f for f in files if f.name == "collection.json"]) == 4
    for path in files:
        obj = json.loads(path.read_text())
        assert validate_stac(obj, registry) == [], path
        # it declares exactly the extensions whose fields it uses
        assert obj.get("stac_extensions", []) == [u for p, u in PREFIX_URL.items() if p in prefixes(obj)], path


def test_items_use_the_extensions_they_declare(real_lake: Path, real_ingest: RealLake) -> None:
    items = {sid: json.loads((real_lake / "scenes" / sid / "item.json").read_text()) for sid in real_ingest.all_ids}
    for sid in real_ingest.ids["enmap"]:
        exts = items[sid]["stac_extensions"]
        assert {PREFIX_URL["eo"], PREFIX_URL["raster"], PREFIX_URL["proj"], PREFIX_URL["file"]} <= set(exts)
        assert items[sid]["assets"]["cog"]["raster:scale"] == 0.0001
    for sid in real_ingest.ids["landsat"]:
        props = items[sid]["properties"]
        assert PREFIX_URL["view"] in items[sid]["stac_extensions"]
        assert 0 <= props["view:sun_azimuth"] < 360
        assert -90 <= props["view:sun_elevation"] <= 90
    samson = items[real_ingest.ids["samson"][0]]  # no wavelengths, float32 without scale: neither eo nor raster
    assert PREFIX_URL["eo"] not in samson["stac_extensions"]
    assert PREFIX_URL["raster"] not in samson["stac_extensions"]


def test_items_are_compact(real_lake: Path, real_ingest: RealLake) -> None:
    """Per-band arrays live in the bands (statistics once) and in scene.json, not in custom properties."""
    for sid in real_ingest.all_ids:
        path = real_lake / "scenes" / sid / "item.json"
        item = json.loads(path.read_text())
        record = json.loads((path.parent / "scene.json").read_text())
        cal = item["properties"]["cubelake:calibration"]
        assert len(json.dumps(cal)) < 1024, sid
        assert cal["steps"] == [s["step"] for s in record["calibration"]["steps"]]
        select = next(s for s in record["calibration"]["steps"] if s["step"] == "select_bands")
        assert cal["bands_kept"] == len(select["keep"]) == len(record["bands"])
        assert sum(cal["bands_removed"].values()) == len(select["removed"])
        with_stats = [k for k, a in item["assets"].items() if any("statistics" in b for b in a.get("bands", []))]
        assert with_stats == ["cog"], sid
        # beyond the bands, the footprint and its geohash cover, an item is a few kilobytes, whatever its band count
        rest = copy.deepcopy(item)
        rest["geometry"] = None
        del rest["properties"]["cubelake:geohash6"]
        for a in rest["assets"].values():
            a.pop("bands", None)
        assert len(json.dumps(rest, separators=(",", ":"))) < 8000, sid


def _enmap_item(real_lake: Path, real_ingest: RealLake) -> dict[str, Any]:
    return json.loads((real_lake / "scenes" / real_ingest.ids["enmap"][0] / "item.json").read_text())


def test_the_validator_rejects_what_stac_pydantic_accepts(real_lake: Path, real_ingest: RealLake,
                                                          registry: Registry) -> None:
    item = _enmap_item(real_lake, real_ingest)
    # the old layout: bands in properties and no asset with bands -- the 1.1 item schema forbids it
    old = copy.deepcopy(item)
    old["properties"]["bands"] = old["assets"]["cog"]["bands"]
    for a in old["assets"].values():
        a.pop("bands", None)
    Item.model_validate(old)  # stac-pydantic lets it through
    problems = validate_stac(old, registry)
    assert any(p.startswith("$.properties") and "item.json" in p for p in problems), problems


@pytest.mark.parametrize(("change", "needle"), [
    (lambda it: it["stac_extensions"].append("https://stac-extensions.github.io/sat/v1.0.0/schema.json"),
     "sat/v1.0.0/schema.json has no schema available offline"),
    (lambda it: it["properties"].update({"eo:cloud_cover": 150}), "eo/v2.0.0"),
    (lambda it: it["properties"].update({"view:sun_azimuth": -40.0}) or it["stac_extensions"].append(PREFIX_URL["view"]),
     "view/v1.1.0"),
    (lambda it: it["assets"]["cog"].update({"raster:scale": "0.0001"}), "raster/v2.0.0"),
    (lambda it: it["assets"]["cog"].update({"data_type": "int12"}), "'int12' is not one of"),
    (lambda it: it["assets"]["cog"]["bands"][0].update({"statistics": {}}), "should be non-empty"),
    (lambda it: it["properties"].update({"proj:shape": [32]}), "projection/v2.0.0"),
    (lambda it: it["stac_extensions"].remove(PREFIX_URL["raster"]) or it["stac_extensions"].append(PREFIX_URL["view"]),
     "view/v1.1.0"),  # declared but none of its fields used
    (lambda it: it.pop("bbox"), "item.json"),
])
def test_the_validator_names_each_problem(real_lake: Path, real_ingest: RealLake, registry: Registry,
                                          change: Any, needle: str) -> None:
    item = _enmap_item(real_lake, real_ingest)
    assert validate_stac(item, registry) == []
    change(item)
    problems = validate_stac(item, registry)
    assert problems
    assert any(needle in p for p in problems), problems
    assert all(p.startswith("$") for p in problems)


def test_not_a_stac_object() -> None:
    assert validate_stac({"type": "Thing"}) == ["$.type: 'Thing' is not a STAC object type (expected Feature, "
                                                "Collection or Catalog)"]


def test_cli_validate_passes_the_real_lake(real_lake: Path) -> None:
    n = len(stac_files(real_lake))
    res = runner.invoke(app, ["catalog", "validate", "--lake", str(real_lake)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"{n} STAC file(s) checked: {n} valid, 0 invalid" in res.stdout


def test_cli_validate_names_an_invalid_item_and_exits_1(lake_copy: Path, real_ingest: RealLake,
                                                        shared_schemas: Path) -> None:
    sid = real_ingest.ids["landsat"][0]
    path = lake_copy / "scenes" / sid / "item.json"
    item = json.loads(path.read_text())
    item["properties"]["eo:cloud_cover"] = 150
    path.write_text(json.dumps(item))
    broken = lake_copy / "collections" / "generic" / "collection.json"
    broken.write_text("{not json")
    n = len(stac_files(lake_copy))
    res = runner.invoke(app, ["catalog", "validate", "--lake", str(lake_copy), "--schemas", str(shared_schemas)],
                        catch_exceptions=False)
    assert res.exit_code == 1
    assert f"{n} STAC file(s) checked: {n - 2} valid, 2 invalid" in res.stdout
    assert f"invalid {path}" in res.stderr
    assert "eo:cloud_cover" in res.stderr
    assert f"invalid {broken}" in res.stderr
    assert "unreadable JSON" in res.stderr
    res = runner.invoke(app, ["catalog", "validate", "--lake", str(lake_copy), "--format", "json"],
                        catch_exceptions=False)
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert (report["checked"], report["valid"]) == (n, n - 2)
    assert sorted(r["path"] for r in report["invalid"]) == sorted([str(path), str(broken)])


def test_cli_validate_refuses_a_schemas_path_that_is_not_a_folder(real_lake: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["catalog", "validate", "--lake", str(real_lake), "--schemas", str(tmp_path / "nope")],
                        catch_exceptions=False)
    assert res.exit_code == 2
    assert "not a folder of JSON schemas" in " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())


@pytest.fixture
def offline_pystac(shared_schemas: Path) -> Iterator[None]:
    """pystac's own validator with the shared extension schemas (and the bundled view schema) in its cache."""
    from pystac.validation import JsonSchemaSTACValidator, RegisteredValidator, set_validator

    validator = JsonSchemaSTACValidator()
    for folder in (SCHEMA_DIR, shared_schemas):
        for path in folder.glob("*.json"):
            doc = json.loads(path.read_text())
            validator.schema_cache[doc["$id"].rstrip("#")] = doc
    before = RegisteredValidator._validator
    set_validator(validator)
    try:
        yield
    finally:
        RegisteredValidator._validator = before


def test_pystac_validates_every_item_and_collection_offline(real_lake: Path, real_ingest: RealLake,
                                                            offline_pystac: None) -> None:
    checked = 0
    for path in stac_files(real_lake):
        obj = pystac.read_file(str(path))
        schemas = obj.validate()  # raises STACValidationError on any problem
        assert len(schemas) == 1 + len(obj.stac_extensions), path
        checked += 1
    assert checked == len(real_ingest.all_ids) + 5
    old = _enmap_item(real_lake, real_ingest)
    old["properties"]["bands"] = old["assets"]["cog"]["bands"]
    for a in old["assets"].values():
        a.pop("bands", None)
    with pytest.raises(pystac.STACValidationError):
        pystac.Item.from_dict(old).validate()


def test_reindex_rebuild_items_upgrades_items_written_the_old_way(lake_copy: Path, real_ingest: RealLake) -> None:
    """A lake from before: bands in properties, none on the assets. ``reindex --rebuild-items`` fixes it."""
    sid = real_ingest.ids["enmap"][1]
    path = lake_copy / "scenes" / sid / "item.json"
    current = path.read_text()
    old = json.loads(current)
    old["properties"]["bands"] = old["assets"]["cog"]["bands"]
    for a in old["assets"].values():
        a.pop("bands", None)
    path.write_text(json.dumps(old, indent=1))
    res = runner.invoke(app, ["catalog", "validate", "--lake", str(lake_copy)], catch_exceptions=False)
    assert res.exit_code == 1
    assert f"invalid {path}" in res.stderr
    res = runner.invoke(app, ["catalog", "reindex", "--lake", str(lake_copy)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(path.read_text()) == old  # a plain reindex leaves the files alone
    res = runner.invoke(app, ["catalog", "reindex", "--lake", str(lake_copy), "--rebuild-items"],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"  built item {sid} from its scene record" in res.stdout
    assert len([ln for ln in res.stdout.splitlines() if ln.startswith("  built item ")]) == len(real_ingest.all_ids)
    assert path.read_text() == current  # exactly what ingest wrote: the item is derived from the record
    res = runner.invoke(app, ["catalog", "validate", "--lake", str(lake_copy)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
