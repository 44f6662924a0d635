"""The catalog index is derived from the item files: a 0-byte, damaged or outdated ``catalog.sqlite`` is
detected, reported and rebuilt from them (under the lake's locks, by ``reindex``); something that is not a
file where the index belongs is reported with the fix and never deleted. Through the library and through
the ``cubelake`` command run as a subprocess (no traceback, a clear message, the right exit code)."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from cubelake.catalog import LakeCatalog, Query
from cubelake.errors import CatalogError
from cubelake.ingest import IngestOptions, ingest

from ..conftest import hsi_cube, no_traceback, write_geotiff
from ..conftest import run_cli as cubelake
from .conftest import RealLake

INDEX = "catalog.sqlite"


def one_line(text: str) -> str:
    """stderr as one line (rich wraps log lines at 80 columns)."""
    return " ".join(text.replace("│", " ").split())


def remove_index(lake: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (lake / f"{INDEX}{suffix}").unlink(missing_ok=True)


def checkpointed(lake: Path) -> Path:
    """The index with its WAL folded in, so every page is in the main file."""
    db = sqlite3.connect(lake / INDEX)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for suffix in ("-wal", "-shm"):
        (lake / f"{INDEX}{suffix}").unlink(missing_ok=True)
    return lake / INDEX


def flip_pages(path: Path, first_page: int) -> None:
    """Invert each page's b-tree header (the first 12 bytes; page 0's follows the 100-byte file header)
    and 300 bytes after it, in every page from ``first_page`` (0-based) on: what a bad disk or copy does.
    The header makes sure every damaged page is detected when read, wherever its cells lie."""
    data = bytearray(path.read_bytes())
    assert len(data) >= 4096 * 4
    for off in range(4096 * first_page, len(data), 4096):
        head = off + (100 if off == 0 else 0)
        for lo, hi in ((head, head + 12), (head + 12, off + 400)):
            data[lo:hi] = bytes(b ^ 0xFF for b in data[lo:hi])
    path.write_bytes(bytes(data))


def item_ids(lake: Path) -> list[str]:
    return sorted(p.parent.name for p in (lake / "scenes").glob("*/item.json"))


# -- a 0-byte index ----------------------------------------------------------------------------------
def test_an_empty_index_file_is_rebuilt_not_taken_for_an_empty_catalog(lake_copy: Path, real_ingest: RealLake,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    remove_index(lake_copy)
    (lake_copy / INDEX).write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="cubelake.catalog"), LakeCatalog(lake_copy) as cat:
        assert sorted(h.id for h in cat.search(Query())) == real_ingest.all_ids
    assert f"{lake_copy / INDEX} is empty (0 bytes)" in caplog.text
    assert "rebuilding the catalog index from the item files" in caplog.text
    assert (lake_copy / INDEX).stat().st_size > 0


@pytest.mark.integration
def test_cli_search_on_an_empty_index_says_so_and_finds_every_item(lake_copy: Path, real_ingest: RealLake) -> None:
    remove_index(lake_copy)
    (lake_copy / INDEX).write_bytes(b"")
    res = cubelake("catalog", "search", "--lake", str(lake_copy), "--format", "summary")
    no_traceback(res)
    assert res.returncode == 0, res.stderr
    assert sorted(h["id"] for h in json.loads(res.stdout)) == real_ingest.all_ids
    err = one_line(res.stderr)
    assert "is empty (0 bytes)" in err
    assert f"catalog index rebuilt with {len(real_ingest.all_ids)} item(s)" in err


def test_ingest_after_an_empty_index_indexes_every_scene_not_only_the_new_one(lake_copy: Path, tmp_path: Path,
                                                                             real_ingest: RealLake) -> None:
    remove_index(lake_copy)
    (lake_copy / INDEX).write_bytes(b"")
    new = write_geotiff(tmp_path / "fresh.tif", hsi_cube(4, 32, 32, seed=3), nodata=-9999)
    [r] = ingest([new], lake_copy, IngestOptions(products=("cog",), workers=1))
    assert r.outcome == "ingested", r.message
    with LakeCatalog(lake_copy) as cat:
        assert sorted(h.id for h in cat.search(Query())) == sorted([*real_ingest.all_ids, "fresh"])
    # the collection files agree with the index
    linked = sum(len([lk for lk in json.loads(p.read_text())["links"] if lk["rel"] == "item"])
                 for p in lake_copy.glob("collections/*/collection.json"))
    assert linked == len(real_ingest.all_ids) + 1


# -- a damaged index -----------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("first_page", [0, 2], ids=["header", "pages"])
def test_cli_stats_on_a_damaged_index_rebuilds_it(lake_copy: Path, real_ingest: RealLake, first_page: int) -> None:
    with LakeCatalog(lake_copy) as cat:
        expected = cat.stats()
    flip_pages(checkpointed(lake_copy), first_page)
    res = cubelake("catalog", "stats", "--lake", str(lake_copy), "--format", "json")
    no_traceback(res)
    assert res.returncode == 0, res.stderr
    stats = json.loads(res.stdout)
    assert {k: v for k, v in stats.items() if k != "index_bytes"} == \
        {k: v for k, v in expected.items() if k != "index_bytes"}
    assert stats["items"] == len(real_ingest.all_ids)
    err = one_line(res.stderr)
    assert ("is damaged" in err) or ("not a database" in err), err
    assert "rebuilding the catalog index from the item files" in err
    # and it is whole again: SQLite's own check passes and a second run says nothing
    db = sqlite3.connect(lake_copy / INDEX)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    again = cubelake("catalog", "stats", "--lake", str(lake_copy))
    assert again.returncode == 0
    assert again.stderr == ""


@pytest.mark.integration
def test_a_damaged_index_is_rebuilt_for_search_show_and_export(lake_copy: Path, real_ingest: RealLake,
                                                               tmp_path: Path) -> None:
    for args in (("search", "--format", "summary"), ("export", "-o", str(tmp_path / "x.parquet"))):
        flip_pages(checkpointed(lake_copy), 2)
        res = cubelake("catalog", *args, "--lake", str(lake_copy))
        no_traceback(res)
        assert res.returncode == 0, (args, res.stderr)
        assert "rebuilding the catalog index" in one_line(res.stderr), args
    assert (tmp_path / "x.parquet").is_file()
    # a lookup by id reads a few pages: rebuilt if they are damaged, right either way
    sid = real_ingest.ids["enmap"][0]
    for first_page in (0, 2):
        flip_pages(checkpointed(lake_copy), first_page)
        res = cubelake("catalog", "show", sid, "--lake", str(lake_copy))
        no_traceback(res)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == json.loads((lake_copy / "scenes" / sid / "item.json").read_text())


def test_an_index_of_another_schema_version_is_rebuilt(lake_copy: Path, real_ingest: RealLake,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    db = sqlite3.connect(lake_copy / INDEX)
    db.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    db.commit()
    db.close()
    with caplog.at_level(logging.WARNING, logger="cubelake.catalog"), LakeCatalog(lake_copy) as cat:
        assert len(cat.search(Query())) == len(real_ingest.all_ids)
    assert "index schema version 4, expected" in caplog.text


# -- something that is not a file in the index's place ------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("command", [["reindex"], ["search"], ["stats"], ["show", "x"]])
def test_a_directory_named_like_the_index_is_reported_with_the_fix_and_kept(lake_copy: Path,
                                                                            command: list[str]) -> None:
    remove_index(lake_copy)
    (lake_copy / INDEX).mkdir()
    (lake_copy / INDEX / "keep.txt").write_text("mine")
    res = cubelake("catalog", *command, "--lake", str(lake_copy))
    no_traceback(res)
    assert res.returncode == 1, res.stderr
    err = one_line(res.stderr)
    assert f"{lake_copy / INDEX} is a directory, not the catalog index" in err
    assert "mv " in err
    assert "cubelake catalog reindex" in err
    assert (lake_copy / INDEX / "keep.txt").read_text() == "mine"  # never deleted
    # the fix the message gives works
    (lake_copy / INDEX).rename(lake_copy / f"{INDEX}.moved")
    assert cubelake("catalog", "reindex", "--lake", str(lake_copy)).returncode == 0
    res = cubelake("catalog", "search", "--lake", str(lake_copy), "--format", "summary")
    assert [h["id"] for h in json.loads(res.stdout)] != []


def test_library_reindex_refuses_a_directory_in_the_way(lake_copy: Path) -> None:
    remove_index(lake_copy)
    (lake_copy / INDEX).mkdir()
    with LakeCatalog(lake_copy) as cat, pytest.raises(CatalogError, match="is a directory, not the catalog index"):
        cat.reindex()
    assert (lake_copy / INDEX).is_dir()
    assert item_ids(lake_copy)  # and nothing else was touched
