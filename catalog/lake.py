"""The lake's catalog: static STAC JSON next to the products, plus the derived SQLite index.

Layout inside a lake::

    catalog.json                              root STAC Catalog (links every collection)
    collections/<profile>/collection.json     one Collection per sensor profile, with summaries
    scenes/<id>/item.json                     the scene's Item, published with its products
    catalog.sqlite                            the index (derived; ``reindex`` rebuilds it, and opening it
                                              does when it is empty, damaged or of another schema version)
    .pending/<id>                             an ingest between publishing products and item

Derived products (built datacubes, predictions) publish their items at ``<root>/<name>/item.json``
(:mod:`.derived`); :meth:`LakeCatalog.publish_derived` indexes one the same way, ``reindex`` and
``gc`` find them all.

Publishing order: ingest builds products *and* ``item.json`` in staging and moves them into
``scenes/<id>`` with one rename, so an item file never exists without its products. Then
:meth:`LakeCatalog.publish` indexes it in one SQLite transaction and rewrites the collection
and root JSON (under the catalog lock, so concurrent ingests never lose each other's links).
A ``.pending`` marker spans both steps; :meth:`LakeCatalog.recover` finishes what a killed
process left: it indexes an item whose products are all there, or drops one that is not.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
import shapely

from cubelake.errors import (
    CatalogError,
    CorruptIndexError,
    CorruptItemError,
    CubelakeError,
    ItemNotFoundError,
    RecordVersionError,
)
from cubelake.lake import AnyLake, Lake, atomic_write_text, open_lake, pid_alive, safe_scene_id
from cubelake.storage import is_url

from .derived import (
    DERIVED_ROOTS,
    DerivedKey,
    derived_description,
    derived_for_index,
    is_derived_href,
    parse_derived_key,
)
from .index import CatalogIndex, SearchHit, index_rows
from .items import (
    ITEM_FILE,
    CollectionSummary,
    collection_dict,
    item_from_record,
    item_json,
    root_catalog_dict,
    with_absolute_hrefs,
)
from .query import ParsedQuery, Query

__all__ = ["INDEX_FILE", "LakeCatalog", "ReindexReport", "StacReport", "check_item", "collect_garbage", "read_item"]

log = logging.getLogger(__name__)

INDEX_FILE = "catalog.sqlite"
_LOCK = "_catalog"
_T = TypeVar("_T")


def read_item(path: Path) -> dict[str, Any]:
    """An item JSON file, checked to be a STAC item; raises :class:`CorruptItemError` naming the file."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptItemError(f"{path}: unreadable item JSON ({exc})") from exc
    return parse_item(text, str(path))


def parse_item(text: str, where: str) -> dict[str, Any]:
    """An item's JSON text, checked to be a STAC item; raises :class:`CorruptItemError` naming ``where``."""
    try:
        item = orjson.loads(text)  # a search reads every matched item: orjson parses them 2.3x faster than json
    except orjson.JSONDecodeError as exc:
        raise CorruptItemError(f"{where}: unreadable item JSON ({exc})") from exc
    problems = check_item(item)
    if problems:
        raise CorruptItemError(f"{where}: not a valid STAC item: {'; '.join(problems)}")
    return item


def check_item(item: Any) -> list[str]:
    """Structural problems of an item dict (empty when it is usable)."""
    if not isinstance(item, dict):
        return [f"expected a JSON object, got {type(item).__name__}"]
    problems = []
    if item.get("type") != "Feature":
        problems.append(f"type is {item.get('type')!r}, not 'Feature'")
    if not isinstance(item.get("id"), str) or not item.get("id"):
        problems.append("no string id")
    props = item.get("properties")
    if not isinstance(props, dict):
        problems.append("no properties object")
    elif props.get("datetime") is None and not (props.get("start_datetime") and props.get("end_datetime")):
        problems.append("neither datetime nor start_datetime/end_datetime")
    if not isinstance(item.get("assets"), dict):
        problems.append("no assets object")
    if item.get("geometry") is not None and not item.get("bbox"):
        problems.append("a geometry without a bbox")
    return problems


def _indexable(item: dict[str, Any], where: str) -> dict[str, Any]:
    """``item`` if the index can take it; else :class:`CorruptItemError` naming ``where`` (a bad time or bbox)."""
    try:
        index_rows(item, None)
    except (CatalogError, ValueError, TypeError, KeyError, shapely.errors.GEOSException) as exc:
        raise CorruptItemError(f"{where}: not indexable: {exc}") from None
    return item


def _missing_assets(scene_dir: Path, item: dict[str, Any]) -> list[str]:
    """Relative asset hrefs of ``item`` whose files are not in ``scene_dir``."""
    out = []
    for key, a in item.get("assets", {}).items():
        href = a.get("href", "")
        if href.startswith("./") and not (scene_dir / href[2:]).exists():
            out.append(f"{key} ({href})")
    return out


def _empty_database(path: Path) -> bool:
    """A 0-byte database file with no write-ahead log: SQLite would take it as a new, empty index."""
    wal = Path(str(path) + "-wal")
    try:
        return path.stat().st_size == 0 and not (wal.exists() and wal.stat().st_size > 0)
    except FileNotFoundError:  # removed meanwhile: nothing to take for an index
        return False


def _remove_database(path: Path, suffixes: tuple[str, ...] = ("", "-wal", "-shm")) -> None:
    """Delete an SQLite file and its WAL/shared-memory companions, whichever exist."""
    for suffix in suffixes:
        with contextlib.suppress(FileNotFoundError):
            Path(str(path) + suffix).unlink()


@dataclass(slots=True)
class ReindexReport:
    """What ``reindex`` found: items indexed, corrupt item files skipped, items built from scene records."""

    indexed: int = 0
    corrupt: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    built: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"indexed": self.indexed, "corrupt": [{"path": p, "error": e} for p, e in self.corrupt],
                "built_from_scene_records": self.built}


@dataclass(slots=True)
class StacReport:
    """What ``validate`` found: how many STAC files were checked, and the problems of each invalid one."""

    checked: int = 0
    invalid: dict[str, list[str]] = field(default_factory=dict)  # path -> problems

    @property
    def ok(self) -> bool:
        return not self.invalid

    def to_dict(self) -> dict[str, Any]:
        return {"checked": self.checked, "valid": self.checked - len(self.invalid),
                "invalid": [{"path": p, "problems": probs} for p, probs in self.invalid.items()]}


class LakeCatalog:
    """The catalog of one lake: publish items, search, show, reindex, export."""

    def __new__(cls, lake: AnyLake | str | Path, *, create: bool = False) -> LakeCatalog:
        """An object-store lake (or URL) gets :class:`~cubelake.catalog.remote.ObjectLakeCatalog`."""
        if cls is LakeCatalog and not isinstance(lake, Lake) and (not isinstance(lake, str | Path) or is_url(str(lake))):
            from .remote import ObjectLakeCatalog

            return super().__new__(ObjectLakeCatalog)
        return super().__new__(cls)

    def __init__(self, lake: AnyLake | str | Path, *, create: bool = False) -> None:
        opened = open_lake(lake, create=create)
        assert isinstance(opened, Lake)
        self.lake = opened
        self.root = self.lake.root
        self.index_path = self.root / INDEX_FILE
        self._index: CatalogIndex | None = None
        self._opening = False

    @property
    def index(self) -> CatalogIndex:
        """The index; rebuilt from the item files first if it is missing, empty, damaged or outdated."""
        if self._index is None:
            if self._opening:  # reindex, called from here, opening the index it built
                self._index = CatalogIndex(self.index_path)
                return self._index
            # processes starting on a new lake at once: one creates the index, the others wait and open
            # it (SQLite's own locking does not cover switching a new file to WAL: that fails at once)
            with self.lake.lock("_catalog_index"):
                self._opening = True
                try:
                    self._open_index()
                finally:
                    self._opening = False
        assert self._index is not None
        return self._index

    def _open_index(self) -> None:
        """Open the index, or rebuild it from the item files when it cannot answer truthfully."""
        self._check_index_path()
        problem = None
        missing = f"no catalog index at {self.index_path}"
        if not self.index_path.exists():
            problem = missing if self.lake.scene_ids() else None
        elif _empty_database(self.index_path):
            problem = f"{self.index_path} is empty (0 bytes): it would answer 0 items" if self.lake.scene_ids() else None
        else:
            try:
                self._index = CatalogIndex(self.index_path)
            except CorruptIndexError as exc:
                problem = str(exc)
        if problem is not None:  # a missing index is expected (a copied or pre-catalog lake): no warning for it
            self._rebuild(problem, logging.INFO if problem == missing else logging.WARNING)
        if self._index is None:
            self._index = CatalogIndex(self.index_path)

    def _check_index_path(self) -> None:
        """Refuse an index path that is not a regular file: it is not ours to delete."""
        path = self.index_path
        if (path.exists() or path.is_symlink()) and not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise CatalogError(
                f"{path} is {kind}, not the catalog index; cubelake does not delete it. Move it away "
                f"(mv '{path}' '{path}.moved'), then run 'cubelake catalog reindex --lake {self.root}'")

    def _rebuild(self, why: str, level: int = logging.WARNING) -> None:
        """Rebuild the index from the item files, saying why (on the log, which the CLI shows on stderr)."""
        log.log(level, "%s; rebuilding the catalog index from the item files", why)
        try:
            report = self.reindex()
        except OSError as exc:
            raise CatalogError(f"{why}; rebuilding it failed ({exc}); run 'cubelake catalog reindex --lake "
                               f"{self.root}' where the lake is writable") from exc
        for path, skipped in report.corrupt:
            log.warning("%s: skipped: %s", path, skipped)
        log.log(level, "%s: catalog index rebuilt with %d item(s)", self.root, report.indexed)

    def _rebuilt_if_damaged(self, op: Callable[[], _T]) -> _T:
        """Run ``op``; if the index turns out damaged, rebuild it from the item files and run ``op`` again."""
        try:
            return op()
        except CorruptIndexError as exc:
            self.close()
            self._rebuild(str(exc))
            return op()

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    def __enter__(self) -> LakeCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- paths ---------------------------------------------------------------
    def item_path(self, scene_id: str) -> Path:
        return self.lake.scene_dir(scene_id) / ITEM_FILE

    def item_href(self, scene_id: str) -> str:
        return f"scenes/{scene_id}/{ITEM_FILE}"

    def collection_path(self, collection: str) -> Path:
        return self.root / "collections" / collection / "collection.json"

    # -- pending markers -----------------------------------------------------
    @contextlib.contextmanager
    def pending(self, scene_id: str) -> Iterator[None]:
        """Mark a scene as between products and item; the marker stays if the process dies inside."""
        marker = self.root / ".pending" / scene_id
        marker.parent.mkdir(exist_ok=True)
        atomic_write_text(marker, f"{os.getpid()}\n")
        yield
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()

    # -- publishing ----------------------------------------------------------
    def publish(self, scene_id: str) -> dict[str, Any]:
        """Index the published ``scenes/<id>/item.json`` and link it from its collection."""
        item = read_item(self.item_path(scene_id))
        return self._rebuilt_if_damaged(lambda: self._publish(scene_id, item))

    def _publish(self, scene_id: str, item: dict[str, Any]) -> dict[str, Any]:
        _ = self.index  # open (or build) it before taking the lock that building takes
        with self.lake.lock(_LOCK):
            old = self.index.get(scene_id)
            self.index.upsert(item, self.item_href(scene_id))
            touched = {item["collection"]} | ({old.collection} if old and old.collection != item["collection"] else set())
            self._write_collections(touched)
        log.info("%s: catalog item %s published in %s", self.root, scene_id, item["collection"])
        return item

    def unpublish(self, scene_id: str) -> bool:
        return self._rebuilt_if_damaged(lambda: self._unpublish(scene_id))

    def _unpublish(self, scene_id: str) -> bool:
        _ = self.index
        with self.lake.lock(_LOCK):
            old = self.index.get(scene_id)
            if old is None:
                return False
            self.index.delete(scene_id)
            self._write_collections({old.collection})
        return True

    def _write_collections(self, collections: set[str]) -> None:
        """Rewrite these collections' JSON from the index, then the root catalog (caller holds the lock)."""
        for coll in sorted(collections):
            path = self.collection_path(coll)
            summary = self.index.collection_summary(coll)
            if not summary.item_ids:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            stac, description = self._collection_meta(summary)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(collection_dict(summary, description, stac), indent=1) + "\n")
        atomic_write_text(self.root / "catalog.json", json.dumps(root_catalog_dict(self.index.collections()), indent=1) + "\n")

    def _collection_meta(self, summary: CollectionSummary) -> tuple[dict[str, Any], str]:
        """A collection's STAC settings and description: its first scene's profile, or (no scene in it) a
        description of its derived products."""
        hrefs: list[str | None] = list(summary.item_hrefs)
        if len(hrefs) != len(summary.item_ids):  # items indexed without a file: take them for scenes
            hrefs = [None] * len(summary.item_ids)
        scene = next((i for i, h in zip(summary.item_ids, hrefs, strict=True) if not is_derived_href(h)), None)
        if scene is None:
            return {}, derived_description(summary.item_hrefs)
        return self._profile_stac(summary.id, scene)

    def _profile_stac(self, collection: str, any_item: str) -> tuple[dict[str, Any], str]:
        try:
            record = self.lake.scene_record(any_item)
        except RecordVersionError as exc:  # its collection is described without it
            log.warning("%s", exc)
            record = None
        if record is None:
            return {}, ""
        return dict(record.profile.settings.get("stac", {}) or {}), str(record.profile.description or "")

    # -- derived products ------------------------------------------------------
    def publish_derived(self, key: str) -> dict[str, Any]:
        """Index the derived product's item at lake-relative ``key`` (``datacubes/<name>/item.json``,
        ``predictions/<name>/item.json``) and link it from its collection; returns the item as indexed.

        A no-op when the index already holds the item as it is. Raises :class:`CatalogError` for a key
        of another form, :class:`ItemNotFoundError` when there is no item, :class:`CorruptItemError`
        for an unusable one, and :class:`CatalogError` when its id is another item's (a scene's).
        """
        ref = parse_derived_key(key)
        return self._index_derived(ref, self._read_derived(ref))

    def unpublish_derived(self, item_id: str) -> bool:
        """Remove a derived product's item from the index (its files stay; ``reindex`` finds it again
        while they are there); ``False`` if it was not indexed. A scene's id is refused."""
        return self._rebuilt_if_damaged(lambda: self._drop_derived(item_id))

    def _derived_where(self, ref: DerivedKey) -> str:
        return str(self.root / ref.key)

    def _derived_keys(self) -> list[DerivedKey]:
        """Every derived item file of the lake, by root then name."""
        out = []
        for root in DERIVED_ROOTS:
            folder = self.root / root
            names = sorted(p.name for p in folder.iterdir() if (p / ITEM_FILE).is_file()) if folder.is_dir() else []
            out += [DerivedKey(root, n) for n in names if safe_scene_id(n) == n]
        return out

    def _read_derived(self, ref: DerivedKey) -> dict[str, Any]:
        """The item at ``ref`` as the index takes it; :class:`ItemNotFoundError` when there is none."""
        path = self.root / ref.key
        if not path.is_file():
            raise ItemNotFoundError(f"{path}: no derived item there; write the product and its item first, "
                                    "then publish it")
        return _indexable(derived_for_index(read_item(path), ref, str(path)), str(path))

    def _derived_slot(self, ref: DerivedKey, item_id: str) -> SearchHit | None:
        """The indexed item of ``item_id`` if it is ``ref``'s; :class:`CatalogError` if another item has that id."""
        hit = self.index.get(item_id)
        if hit is not None and hit.href != ref.key:
            raise CatalogError(f"{self._derived_where(ref)}: item id {item_id!r} is already that of the catalog's "
                               f"item {hit.href}; ids are one namespace for scenes and derived products: give "
                               "the product another name")
        return hit

    def _derived_hit(self, item_id: str) -> SearchHit | None:
        """The indexed item of ``item_id`` if it is a derived product's; :class:`CatalogError` for a scene's."""
        hit = self.index.get(item_id)
        if hit is not None and not is_derived_href(hit.href):
            raise CatalogError(f"{self.root}: item {item_id!r} is a scene's ({hit.href}), not a derived product's; "
                               "it leaves the catalog with its scene")
        return hit

    def _index_derived(self, ref: DerivedKey, item: dict[str, Any]) -> dict[str, Any]:
        def op() -> dict[str, Any]:
            _ = self.index  # open (or build) it before taking the lock that building takes
            with self.lake.lock(_LOCK):
                old = self._derived_slot(ref, item["id"])
                if old is not None and self.index.holds(item, ref.key):
                    return item
                self.index.upsert(item, ref.key)
                self._write_collections({item["collection"]} | ({old.collection} if old else set()))
            log.info("%s: catalog item %s published in %s", self.root, ref.key, item["collection"])
            return item

        return self._rebuilt_if_damaged(op)

    def _drop_derived(self, item_id: str) -> bool:
        _ = self.index
        with self.lake.lock(_LOCK):
            old = self._derived_hit(item_id)
            if old is None:
                return False
            self.index.delete(item_id)
            self._write_collections({old.collection})
        return True

    def _reindex_derived(self, ref: DerivedKey, report: ReindexReport, taken: dict[str, str]) -> dict[str, Any] | None:
        """The derived item at ``ref`` for a reindex, or ``None`` (missing; corrupt or an id taken: reported)."""
        where = self._derived_where(ref)
        try:
            item = self._read_derived(ref)
        except ItemNotFoundError:
            return None
        except CatalogError as exc:  # corrupt, or unreadable from the store
            log.warning("%s", exc)
            report.corrupt.append((where, str(exc).removeprefix(f"{where}: ")))
            return None
        if item["id"] in taken:
            report.corrupt.append((where, f"id {item['id']!r} is already that of the item {taken[item['id']]}"))
            return None
        return item

    def sync_derived(self, *, dry_run: bool = False) -> list[str]:
        """Index derived items committed but not indexed as they are (their publisher died in between) and
        drop indexed ones whose item is gone; one line per action (``dry_run``: what it would do)."""
        lines: list[str] = []
        present: set[str] = set()
        for ref in self._derived_keys():
            present.add(ref.key)
            try:
                item = self._read_derived(ref)
                if self._derived_slot(ref, item["id"]) is not None and self.index.holds(item, ref.key):
                    continue
                if not dry_run:
                    self.publish_derived(ref.key)
            except ItemNotFoundError:
                present.discard(ref.key)
                continue
            except CatalogError as exc:  # corrupt, or its id taken: reindex reports it; the index stays
                log.warning("%s", exc)
                continue
            lines.append(f"{'would index' if dry_run else 'indexed'} derived item {ref.key}: committed but not "
                         "in the catalog index as it is")
        for item_id, href in self.index.hrefs().items():
            if is_derived_href(href) and href not in present:
                if not dry_run:
                    self.unpublish_derived(item_id)
                lines.append(f"{'would remove' if dry_run else 'removed'} derived item {item_id} from the catalog "
                             f"index: {href} is gone")
        return lines

    # -- recovery and reindex --------------------------------------------------
    def recover(self) -> list[str]:
        """Finish or undo what killed ingests left between products and item; one line per action."""
        done: list[str] = []
        _ = self.index  # exists from the first ingest on (built from the item files if it went missing)
        pending = self.root / ".pending"
        for marker in sorted(pending.iterdir()) if pending.is_dir() else []:
            scene_id = marker.name
            if safe_scene_id(scene_id) != scene_id:  # a marker's own temp file, left by a kill mid-write
                owner = marker.name.split(".")[-3] if marker.name.count(".") >= 3 else ""
                if not (owner.isdigit() and pid_alive(int(owner))):
                    marker.unlink(missing_ok=True)
                continue
            try:
                pid = int(marker.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and pid_alive(pid):
                continue
            try:
                line = self._recover_one(scene_id)
            except CubelakeError as exc:  # one bad leftover must not stop every later ingest
                log.error("%s: could not finish the catalog entry of %s, left for the next run: %s", self.root,
                          scene_id, exc)
                continue
            if line:
                done.append(line)
        for line in done:
            log.info("%s: %s", self.root, line)
        return done

    def gc(self, grace: dt.timedelta | None = None, *, dry_run: bool = False) -> list[str]:
        """The local index is updated in place: nothing to collect (``recover`` finishes killed ingests,
        :meth:`sync_derived` brings derived items in line)."""
        return ([] if dry_run else self.recover()) + self.sync_derived(dry_run=dry_run)

    def _recover_one(self, scene_id: str) -> str | None:
        marker = self.root / ".pending" / scene_id
        with self.lake.lock(scene_id, blocking=False) as held:
            if not held:
                return None  # a live ingest of this scene holds it
            path = self.item_path(scene_id)
            try:
                item = read_item(path) if path.exists() else None
            except CorruptItemError as exc:
                log.warning("%s", exc)
                item = None
            missing = _missing_assets(path.parent, item) if item else []
            line = None
            if item is not None and not missing:
                self.publish(scene_id)
                line = f"completed catalog item {scene_id} left unpublished by a killed ingest"
            elif self.unpublish(scene_id):
                line = f"removed catalog item {scene_id}: its products are incomplete ({', '.join(missing)})"
            marker.unlink(missing_ok=True)
            return line

    def reindex(self, progress: Callable[[int, int], None] | None = None, *,
                rebuild_items: bool = False) -> ReindexReport:
        """Rebuild the index from the item JSON files; corrupt ones are reported by path and skipped.

        Derived products' items (``datacubes/<name>/item.json``, ``predictions/<name>/item.json``) are
        indexed after the scenes; one whose id a scene (or an earlier one) has is reported and skipped.
        A scene with a record but no item (a lake from before the catalog) gets its item built
        from ``scene.json``; ``rebuild_items`` rebuilds every item from its record (after an
        upgrade changed how items are written). The new index is built aside, then copied into the
        live one with SQLite's backup API, in one transaction: other processes that have the index
        open see the old or the new content, never a file swapped under them (renaming or deleting
        a database in use, with its WAL, is how SQLite files get corrupted). Only an index SQLite
        cannot open at all is replaced by a rename.
        """
        self._check_index_path()
        report = ReindexReport()
        tmp = self.root / f".{INDEX_FILE}.{uuid.uuid4().hex[:8]}.tmp"
        with self.lake.lock(_LOCK):
            ids = self.lake.scene_ids()  # under the lock: a publish cannot slip in between
            derived = self._derived_keys()
            hrefs: dict[str, str] = {}
            fresh = CatalogIndex(tmp)
            try:
                def items() -> Iterator[dict[str, Any]]:
                    for n, sid in enumerate(ids, 1):
                        if progress:
                            progress(n, len(ids) + len(derived))
                        item = self._reindex_item(sid, report, rebuild_items)
                        if item is not None:
                            hrefs[sid] = self.item_href(sid)
                            yield item
                    for n, ref in enumerate(derived, len(ids) + 1):
                        if progress:
                            progress(n, len(ids) + len(derived))
                        item = self._reindex_derived(ref, report, hrefs)
                        if item is not None:
                            hrefs[item["id"]] = ref.key
                            yield item

                report.indexed = fresh.insert_items(items(), batch_size=1000, href=lambda item: hrefs[item["id"]])
                fresh.analyze()
            except BaseException:
                fresh.close()
                _remove_database(tmp)
                raise
            fresh.close()
            self.close()
            self._swap_in(tmp)
            # open it here, not through ``index``: that takes the index-creation lock, which is taken
            # before this one where ``index`` rebuilds (the other order could deadlock two processes)
            self._index = CatalogIndex(self.index_path)
            old_dirs = {p.name for p in (self.root / "collections").glob("*") if p.is_dir()}
            self._write_collections(old_dirs | set(self.index.collections()))
            for d in old_dirs - set(self.index.collections()):
                shutil.rmtree(self.root / "collections" / d, ignore_errors=True)
        return report

    def _reindex_item(self, sid: str, report: ReindexReport, rebuild: bool) -> dict[str, Any] | None:
        """The item of scene ``sid`` for a reindex (built from its record if missing or asked), or ``None``."""
        path = self.item_path(sid)
        if rebuild or not path.exists():
            # an ingest rewriting this scene holds its lock and writes a new item anyway: leave it be
            # (waiting for it here, under the catalog lock it needs next, would deadlock)
            with self.lake.lock(sid, blocking=False) as held:
                try:
                    record = self.lake.scene_record(sid) if held else None
                    text = item_json(item_from_record(record)) if record is not None else None
                except RecordVersionError as exc:
                    log.warning("%s; keeping its item file", exc)
                    text = None
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    log.warning("%s: no item can be built from this scene record (%r); keeping its item file",
                                self.lake.scene_dir(sid) / "scene.json", exc)
                    text = None
                if text is not None:
                    atomic_write_text(path, text)
                    report.built.append(sid)
            if not path.exists():
                return None
        try:
            item = read_item(path)
        except CorruptItemError as exc:
            log.warning("%s", exc)
            report.corrupt.append((str(path), str(exc).removeprefix(f"{path}: ")))
            return None
        if item["id"] != sid:
            report.corrupt.append((str(path), f"id {item['id']!r} differs from its folder {sid!r}"))
            return None
        try:
            index_rows(item, None)  # values the index cannot take (a bad time, a bad bbox)
        except (CatalogError, ValueError, TypeError, KeyError, shapely.errors.GEOSException) as exc:
            report.corrupt.append((str(path), f"not indexable: {exc}"))
            return None
        return item

    def _swap_in(self, built: Path) -> None:
        """Make ``built`` the index (caller holds the catalog lock), then remove it."""
        self._check_index_path()
        try:
            live = CatalogIndex(self.index_path) if self.index_path.exists() else None
        except CatalogError as exc:
            log.warning("%s; replacing it", exc)
            live = None
        try:
            if live is not None:
                src = sqlite3.connect(built)
                try:
                    src.backup(live.db)
                except sqlite3.DatabaseError as exc:  # a damaged live file can refuse the copy: replace it
                    log.warning("%s: copying the rebuilt index in failed (%s); replacing the file", self.index_path, exc)
                    live.close()
                    live = None
                finally:
                    src.close()
                    if live is not None:
                        live.close()
            if live is None:
                _remove_database(self.index_path, ("-wal", "-shm"))  # leftovers of an unreadable index
                os.replace(built, self.index_path)
        finally:
            _remove_database(built)

    # -- checking ----------------------------------------------------------------
    def validate(self, schema_dirs: Sequence[str | Path] = (),
                 progress: Callable[[int, int], None] | None = None) -> StacReport:
        """Check the root catalog, every collection and every item file against the official STAC schemas, offline.

        ``schema_dirs``: folders of extra (or replacement) official schema copies, by ``$id``.
        """
        from .validate import stac_registry, validate_stac

        registry = stac_registry(schema_dirs)
        paths = [self.root / "catalog.json", *sorted((self.root / "collections").glob("*/collection.json")),
                 *(self.item_path(sid) for sid in self.lake.scene_ids()),
                 *(self.root / ref.key for ref in self._derived_keys())]
        report = StacReport()
        for n, path in enumerate(paths, 1):
            if progress:
                progress(n, len(paths))
            if not path.exists():
                continue
            report.checked += 1
            try:
                obj = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                report.invalid[str(path)] = [f"unreadable JSON ({exc})"]
                continue
            problems = validate_stac(obj, registry) if isinstance(obj, dict) else ["not a JSON object"]
            if problems:
                report.invalid[str(path)] = problems
        return report

    # -- reading ---------------------------------------------------------------
    def search(self, query: Query | ParsedQuery, *, scenes_only: bool = False) -> list[SearchHit]:
        """The items matching ``query``: scenes and derived products (datacubes, predictions) alike;
        ``scenes_only`` for callers that read the hits as scenes."""
        return self._rebuilt_if_damaged(lambda: self.index.search(query, scenes_only=scenes_only))

    def get(self, item_id: str) -> dict[str, Any]:
        """The full item JSON of ``item_id``; raises :class:`ItemNotFoundError`."""
        hit = self._rebuilt_if_damaged(lambda: self.index.get(item_id))
        if hit is None or not hit.href:
            raise ItemNotFoundError(f"no item {item_id!r} in the catalog of {self.root}; list them with "
                                    "'cubelake catalog search'")
        return read_item(self.root / hit.href)

    def items(self, hits: list[SearchHit], *, absolute: bool = False) -> list[dict[str, Any]]:
        """The item dicts of ``hits``; ``absolute``: hrefs made absolute, with a ``self`` link (usable elsewhere)."""
        return [self._item(h.href, absolute) for h in hits if h.href]

    def item_at(self, href: str) -> dict[str, Any]:
        """The item file at ``href`` (relative to the lake, as the index holds it), hrefs as written."""
        return self._item(href, False)

    def collection_document(self, collection: str) -> dict[str, Any] | None:
        """A collection's STAC document as the index makes it now (``None``: no item in it)."""
        summary = self.index.collection_summary(collection)
        if not summary.item_ids:
            return None
        stac, description = self._collection_meta(summary)
        return collection_dict(summary, description, stac)

    def _item(self, href: str, absolute: bool) -> dict[str, Any]:
        path = self.root / href
        item = read_item(path)
        return with_absolute_hrefs(item, str(path.resolve()), in_place=True) if absolute else item

    def item_collection(self, hits: list[SearchHit], *, matched: int | None = None) -> dict[str, Any]:
        """A STAC ItemCollection of ``hits`` with absolute hrefs (what ``pystac.ItemCollection.from_dict`` reads)."""
        features = self.items(hits, absolute=True)
        return {"type": "FeatureCollection", "features": features, "numberReturned": len(features),
                **({"numberMatched": matched} if matched is not None else {}), "links": []}

    def stats(self) -> dict[str, Any]:
        return self._rebuilt_if_damaged(lambda: self.index.stats())

    def export_geoparquet(self, path: str | Path) -> int:
        """Every item as one stac-geoparquet file (with the collections in its metadata); returns how many.

        Hrefs are absolute (each item gets a ``self`` link), so the file is usable away from the lake.
        An empty catalog raises :class:`CatalogError` and writes nothing.
        """
        from .export import export_geoparquet

        hrefs = [h for h in self._rebuilt_if_damaged(lambda: self.index.hrefs()).values() if h]
        if not hrefs:
            raise CatalogError(f"the catalog of {self.root} has no items: nothing to export, no file written; "
                               f"ingest scenes first ('cubelake ingest SCENES --lake {self.root}')")
        collections = {}
        for c in self.index.collections():
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                collections[c] = json.loads(self.collection_path(c).read_text())
        items = (self._item(h, absolute=True) for h in hrefs)
        return export_geoparquet(items, path, collections=collections or None)


def collect_garbage(lake: AnyLake, grace: dt.timedelta | None = None, *, dry_run: bool = False) -> list[str]:
    """``cubelake lake gc``: what crashed or replaced ingests left in the lake and its catalog, one line each."""
    lines = lake.gc(grace, dry_run=dry_run)
    with LakeCatalog(lake) as cat:
        lines += cat.gc(grace, dry_run=dry_run)
    return lines
