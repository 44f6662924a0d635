"""The catalog of a lake on an object store: item JSONs plus a published search index.

Layout inside an object-store lake::

    scenes/<id>/item.json                          the items (the source of truth; each is its scene's commit object)
    datacubes/<name>/item.json, predictions/<name>/item.json   derived products' items (indexed too)
    catalog/index.json                             pointer: generation, base snapshot, change set, collections
    catalog/index/<generation>-<random>.sqlite     immutable base snapshots of the SQLite index
    catalog/index/changes/<generation>-<random>.json.gz   immutable cumulative change sets over a base
    catalog/pending/<id>.json                      an ingest between committing a scene and indexing it
    catalog.json, collections/<p>/collection.json  the static STAC tree

Searching never lists the scenes: a reader GETs the small pointer, the base snapshot it names
(downloaded once into a local cache: it is immutable) and the change set on top of it, which it
applies to a cached copy of the base. A writer publishing an item reads the current change set,
writes a new one holding it plus the item, and moves the pointer with ``If-Match``
(``If-None-Match: *`` for the first); when another writer moved it first, it starts again from
theirs, so concurrent ingests merge and no update is lost. When the change set grows large (or
the base is small enough that republishing it is cheap: :class:`~.changes.FoldPolicy`), the
writer folds the changes into a new base snapshot instead, and rewrites the static STAC tree
from it: an ingest costs O(changes since the last fold), not O(lake). Old snapshots and change
sets stay for readers still downloading them; ``lake gc`` removes them after the grace period.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import random
import shutil
import socket
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cubelake.errors import CatalogError, CorruptItemError, ItemNotFoundError
from cubelake.lake import AnyLake, open_lake, pid_alive, safe_scene_id
from cubelake.object_lake import VERSION_KEY, ObjectLake, staging_root
from cubelake.storage import CommitConflict, ObjectNotFound, StorageError

from .changes import Change, ChangeSet, DamagedIndexError, FoldPolicy, IndexPointer, should_fold
from .derived import DERIVED_ROOTS, DerivedKey, derived_for_index
from .index import CatalogIndex, SearchHit
from .items import collection_dict, root_catalog_dict, with_absolute_hrefs
from .lake import LakeCatalog, ReindexReport, StacReport, _indexable, check_item, parse_item
from .query import ParsedQuery, Query

__all__ = ["ObjectLakeCatalog", "cache_root"]

log = logging.getLogger(__name__)

POINTER = "catalog/index.json"
_ATTEMPTS = 200  # conditional-put retries before giving up (each one means another writer made progress)
_PENDING_GRACE = dt.timedelta(hours=1)
_MAX_CHANGES_OBJECT = 64 * 1024 * 1024  # compressed; the fold policy keeps real ones near 4 MiB


def fold_policy() -> FoldPolicy:
    """The fold policy, with ``CUBELAKE_INDEX_FOLD_BELOW`` (bytes: a base snapshot smaller than this is
    republished on every change) as an operator's knob."""
    raw = os.environ.get("CUBELAKE_INDEX_FOLD_BELOW", "").strip()
    try:
        return FoldPolicy(always_below=int(raw)) if raw else FoldPolicy()
    except ValueError:
        raise CatalogError(f"CUBELAKE_INDEX_FOLD_BELOW={raw!r} is not a number of bytes; unset it or give one, "
                           "e.g. 33554432") from None


def _backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, min(1.0, 0.02 * 2 ** min(attempt, 6))))


def _apply_one(idx: CatalogIndex, item_id: str, change: Change) -> set[str]:
    """Apply one change to an index; the collections it touched (the item's old and new one)."""
    old = idx.get(item_id)
    touched = {old.collection} if old is not None else set()
    if change.item is None:
        idx.delete(item_id)
    else:
        idx.upsert(change.item, change.href)
        touched.add(str(change.item["collection"]))
    return touched


def _apply(idx: CatalogIndex, changes: ChangeSet) -> set[str]:
    touched: set[str] = set()
    for item_id, change in sorted(changes.entries.items(), key=lambda kv: kv[1].generation):
        touched |= _apply_one(idx, item_id, change)
    return touched


def cache_root() -> Path:
    """Where downloaded index snapshots are kept (``$CUBELAKE_CACHE`` or ``~/.cache/cubelake``)."""
    base = os.environ.get("CUBELAKE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cubelake")
    return Path(base) / "catalogs"


class ObjectLakeCatalog(LakeCatalog):
    """:class:`LakeCatalog` for an :class:`ObjectLake`: same reading API, publication by conditional PUT."""

    def __init__(self, lake: AnyLake | str | Path, *, create: bool = False) -> None:
        opened = open_lake(lake, create=create)
        if not isinstance(opened, ObjectLake):
            raise CatalogError(f"{opened.url}: a local lake; use LakeCatalog")
        self.lake: ObjectLake = opened  # type: ignore[assignment]
        self.store = opened.store
        self.root = opened.url  # type: ignore[assignment]
        self.cache = cache_root() / hashlib.sha256(opened.url.encode()).hexdigest()[:16]
        self._index: CatalogIndex | None = None
        self._generation = 0
        self._changeset: tuple[str, ChangeSet] | None = None

    # -- the published index --------------------------------------------------
    def _pointer(self) -> tuple[IndexPointer | None, str | None]:
        doc, etag = self.lake.read_json_info(POINTER)
        if etag is None:
            return None, None
        try:
            return IndexPointer.parse(doc), etag
        except DamagedIndexError as exc:
            log.warning("%s: damaged index pointer (%s); the index will be rebuilt from the items",
                        self.store.url_of(POINTER), exc)
            return None, etag

    def _snapshot(self, key: str) -> Path:
        """The local copy of an immutable base snapshot, downloaded once."""
        local = self.cache / Path(key).name
        if not local.is_file():
            self.cache.mkdir(parents=True, exist_ok=True)
            n = self.store.download(key, local)
            log.info("%s: downloaded the catalog index %s (%d bytes)", self.root, key, n)
        return local

    def _changes(self, ptr: IndexPointer) -> ChangeSet | None:
        """The change set ``ptr`` names, if any (immutable: kept in memory by key)."""
        key = ptr.changes
        if key is None:
            return None
        if self._changeset is not None and self._changeset[0] == key:
            return self._changeset[1]
        size = self.store.head(key).size
        if size > _MAX_CHANGES_OBJECT:
            raise CatalogError(f"{self.store.url_of(key)}: {size} bytes is far more than an index change set; "
                               f"run 'cubelake catalog reindex --lake {self.root}'")
        try:
            changes = ChangeSet.decode(self.store.get(key))
        except DamagedIndexError as exc:
            raise CatalogError(f"{self.store.url_of(key)}: damaged index change set ({exc}); run 'cubelake catalog "
                               f"reindex --lake {self.root}' to rebuild the index from the items") from None
        if changes.base != ptr.key:
            raise CatalogError(f"{self.store.url_of(key)}: an index change set over {changes.base}, but the pointer "
                               f"names {ptr.key} as its base; run 'cubelake catalog reindex --lake {self.root}'")
        self._changeset = (key, changes)
        return changes

    def _view(self, ptr: IndexPointer) -> Path:
        """A local SQLite file answering for ``ptr``: its base snapshot, or (cached by the change set's
        immutable key) a copy of the base with the changes applied."""
        if ptr.changes is None:
            assert ptr.key is not None
            path = self._snapshot(ptr.key)
        else:
            path = self.cache / (Path(ptr.changes).name.removesuffix(".json.gz") + ".sqlite")
            if not path.is_file():
                tmp = self._materialize(ptr, self.cache)
                os.replace(tmp, path)  # readers sharing the cache see the whole file or none
        self._evict({path.name, Path(ptr.key).name if ptr.key else ""})
        return path

    def _materialize(self, ptr: IndexPointer, folder: Path) -> Path:
        """A new file in ``folder``: the base of ``ptr`` with its changes applied (self-contained, no WAL)."""
        folder.mkdir(parents=True, exist_ok=True)
        work = folder / f".view.{os.getpid()}.{uuid.uuid4().hex[:8]}.sqlite"
        try:
            if ptr.key is not None:
                shutil.copyfile(self._snapshot(ptr.key), work)
            idx = CatalogIndex(work)
            changes = self._changes(ptr)
            if changes is not None:
                _apply(idx, changes)
            _finish_snapshot(work, idx)
        except BaseException:
            work.unlink(missing_ok=True)
            raise
        return work

    def _evict(self, keep: set[str]) -> None:
        """Drop cached views and snapshots older than the ones in use (names sort by generation); a reader
        holding an old one open keeps its copy until it closes it."""
        newest = max(keep)
        for old in self.cache.glob("*.sqlite"):
            if old.name.startswith("."):  # a view being built: removed only when its builder died
                pid = old.name.split(".")[2] if old.name.startswith(".view.") else ""
                if pid.isdigit() and not pid_alive(int(pid)):
                    old.unlink(missing_ok=True)
            elif old.name not in keep and old.name != "empty.sqlite" and old.name < newest:
                old.unlink(missing_ok=True)

    @property
    def index(self) -> CatalogIndex:
        """The current published index (a cached local copy, read-only); built from the items if there is none."""
        if self._index is None:
            ptr, _ = self._pointer()
            if ptr is None:
                if not self.lake.scene_ids():
                    self._index = self._empty_index()
                    return self._index
                log.info("%s: no published catalog index; building it from the items", self.root)
                self.reindex()
                ptr, _ = self._pointer()
                assert ptr is not None
            self._index = self._open_view(ptr)
        return self._index

    def _open_view(self, ptr: IndexPointer) -> CatalogIndex:
        for _ in range(3):
            path = self._view(ptr)
            try:
                index = CatalogIndex(path, readonly=True)
            except CatalogError:
                if path.exists():
                    raise
                # another process sharing the cache evicted it for a newer generation: resolve again
                ptr = self._pointer()[0] or ptr
                continue
            self._generation = ptr.generation
            return index
        raise CatalogError(f"{self.cache}: the cached index kept disappearing; is another process clearing "
                           "CUBELAKE_CACHE? Use a cache folder of its own")

    def refresh(self) -> None:
        """Answer the next search from the index as published now (an open catalog keeps the one it opened)."""
        self.close()

    def _empty_index(self) -> CatalogIndex:
        self.cache.mkdir(parents=True, exist_ok=True)
        path = self.cache / "empty.sqlite"
        if not path.is_file():
            tmp = self.cache / f".empty.{uuid.uuid4().hex[:8]}.sqlite"
            _finish_snapshot(tmp, CatalogIndex(tmp))
            os.replace(tmp, path)
        return CatalogIndex(path, readonly=True)

    def _commit(self, change: Callable[[CatalogIndex], set[str]], what: str, *, fresh: bool = False) -> int:
        """Apply ``change`` to a copy of the current index (an empty one if ``fresh``: reindex never
        reads the index it replaces) and publish it as a new base snapshot.

        Retries from the newer index whenever another writer moved the pointer first. Returns the
        generation published; ``change`` returns the collections it touched (their JSON is rewritten).
        """
        for attempt in range(_ATTEMPTS):
            ptr, etag = self._pointer()
            gen = self._publish_snapshot(ptr, etag, change, what, fresh=fresh)
            if gen is not None:
                return gen
            _backoff(attempt)
        raise CatalogError(f"{self.root}: the catalog index kept changing under {_ATTEMPTS} attempts to {what}; "
                           "run the ingest again")

    def _publish_snapshot(self, ptr: IndexPointer | None, etag: str | None,
                          change: Callable[[CatalogIndex], set[str]], what: str, *, fresh: bool = False) -> int | None:
        """One attempt to publish ``ptr``'s index (changes folded in; empty if ``fresh``) with ``change``
        applied as the next base snapshot; ``None`` when another writer moved the pointer first."""
        gen = ptr.generation + 1 if ptr else 1
        # in the lake's local staging root, named by pid: recover() removes it after a kill
        folder = Path(tempfile.mkdtemp(prefix=f"index.{os.getpid()}.", dir=staging_root()))
        try:
            if ptr is None or fresh:
                work, old = folder / "index.sqlite", set(ptr.collections if ptr else ())
            else:
                work, old = self._materialize(ptr, folder), (self._changes(ptr) or ChangeSet(None)).collections()
            idx = CatalogIndex(work)
            touched = change(idx) | old
            new = IndexPointer(gen, f"catalog/index/{gen:08d}-{uuid.uuid4().hex[:12]}.sqlite", len(idx.ids()),
                               collections=tuple(idx.collections()))
            _finish_snapshot(work, idx)
            new = dataclasses.replace(new, base_bytes=work.stat().st_size)
            assert new.key is not None
            self.store.put(new.key, work, create=True)
            if not self._move_pointer(new, etag, new.key):
                return None
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.close()
        log.info("%s: catalog index generation %d published as a new snapshot (%s)", self.root, gen, what)
        self._write_collections_at(gen, touched)
        return gen

    def _publish_change(self, ptr: IndexPointer, etag: str | None, item_id: str, change: Change,
                        what: str) -> int | None:
        """One attempt to publish ``change`` in a new cumulative change set over ``ptr``'s base;
        ``None`` when another writer moved the pointer first."""
        gen = ptr.generation + 1
        base = self._changes(ptr) or ChangeSet(ptr.key)
        changes = base.with_change(item_id, dataclasses.replace(change, generation=gen))
        key = f"catalog/index/changes/{gen:08d}-{uuid.uuid4().hex[:12]}.json.gz"
        self.store.put(key, changes.encode(), create=True)
        new = dataclasses.replace(ptr, generation=gen, changes=key, changes_entries=len(changes.entries))
        if not self._move_pointer(new, etag, key):
            return None
        self.close()
        log.info("%s: catalog index generation %d published as %d change(s) over snapshot %s (%s)", self.root, gen,
                 len(changes.entries), ptr.key, what)
        return gen

    def _move_pointer(self, new: IndexPointer, etag: str | None, written: str) -> bool:
        """Move the pointer from ``etag`` to ``new`` by conditional PUT; on a conflict delete ``written``."""
        body = new.to_json(dt.datetime.now(dt.UTC).isoformat(timespec="seconds")).encode()
        try:
            if etag is None:
                self.store.put(POINTER, body, create=True)
            else:
                self.store.put(POINTER, body, if_match=etag)
        except CommitConflict:
            self.store.delete(written)
            return False
        return True

    def _commit_item(self, item_id: str, change: Change, what: str) -> int:
        """Publish one item's change: into the change set, or folded into a new snapshot when the policy
        says so (a fold that loses a race twice gives way to the change set, so a busy lake never stalls)."""
        new_colls = {str(change.item["collection"])} if change.item is not None else set()
        folds_lost = 0
        for attempt in range(_ATTEMPTS):
            ptr, etag = self._pointer()
            changes = self._changes(ptr) if ptr is not None else None
            if ptr is None or (folds_lost < 2 and should_fold(fold_policy(), ptr, changes, new_colls)):
                gen = self._publish_snapshot(ptr, etag, lambda idx: _apply_one(idx, item_id, change), what)
                folds_lost += gen is None
            else:
                gen = self._publish_change(ptr, etag, item_id, change, what)
            if gen is not None:
                return gen
            _backoff(attempt)
        raise CatalogError(f"{self.root}: the catalog index kept changing under {_ATTEMPTS} attempts to {what}; "
                           "run the ingest again")

    # -- publishing -------------------------------------------------------------
    @contextlib.contextmanager
    def pending(self, scene_id: str) -> Iterator[None]:
        """Mark a scene as between commit and index; the marker stays if the process dies inside."""
        key = f"catalog/pending/{safe_scene_id(scene_id)}.json"
        marker = {"pid": os.getpid(), "host": socket.gethostname(),
                  "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        self.store.put(key, json.dumps(marker).encode())
        yield
        self.store.delete(key)

    def publish(self, scene_id: str) -> dict[str, Any]:
        """Index the scene's committed item (and link it from its collection)."""
        item, _ = self.lake.committed(scene_id)
        if item is None:
            raise CatalogError(f"{self.root}: scene {scene_id} has no committed item to index")
        problems = check_item(item)
        if problems:
            raise CorruptItemError(f"{self.store.url_of(self.lake.item_key(scene_id))}: not a valid STAC item: "
                                   f"{'; '.join(problems)}")

        self._commit_item(scene_id, Change(0, item, self.item_href(scene_id)), f"index {scene_id}")
        return item

    def unpublish(self, scene_id: str) -> bool:
        if self.index.get(scene_id) is None:
            return False

        self._commit_item(scene_id, Change(0, None), f"remove {scene_id}")
        return True

    def _write_collections_at(self, generation: int, collections: set[str]) -> None:
        """Rewrite these collections' JSON and the root catalog from generation ``generation``'s index.

        Each file records the generation it was derived from and is replaced (``If-Match``) only by a
        newer one, so a slow writer never puts back an older view over a newer one.
        """
        idx = self.index
        for coll in sorted(collections):
            summary = idx.collection_summary(coll)
            key = f"collections/{coll}/collection.json"
            if not summary.item_ids:
                self._put_newer(key, None, generation)
                continue
            stac, description = self._collection_meta(summary)
            self._put_newer(key, collection_dict(summary, description, stac), generation)
        self._put_newer("catalog.json", root_catalog_dict(idx.collections()), generation)

    def _put_newer(self, key: str, doc: dict[str, Any] | None, generation: int) -> None:
        for _ in range(_ATTEMPTS):
            current, etag = self.lake.read_json_info(key)
            if current is not None and int(current.get("cubelake:index_generation", 0)) >= generation:
                return
            if doc is None:
                self.store.delete(key)
                return
            body = (json.dumps({**doc, "cubelake:index_generation": generation}, indent=1) + "\n").encode()
            try:
                if etag is None:
                    self.store.put(key, body, create=True)
                else:
                    self.store.put(key, body, if_match=etag)
                return
            except CommitConflict:
                continue

    # -- derived products ------------------------------------------------------------
    def _derived_where(self, ref: DerivedKey) -> str:
        return self.store.url_of(ref.key)

    def _derived_keys(self) -> list[DerivedKey]:
        """Every derived product folder of the lake, by root then name (one delimiter listing per root)."""
        out = []
        for root in DERIVED_ROOTS:
            names, _ = self.store.list_dirs(root)
            out += [DerivedKey(root, n) for n in sorted(names) if safe_scene_id(n) == n]
        return out

    def _read_derived(self, ref: DerivedKey) -> dict[str, Any]:
        url = self.store.url_of(ref.key)
        try:
            text = self.store.get_text(ref.key, 16 * 1024 * 1024)
        except ObjectNotFound:
            raise ItemNotFoundError(f"{url}: no derived item there; write the product and its item first, "
                                    "then publish it") from None
        except StorageError as exc:
            raise CatalogError(f"{url}: the item cannot be read ({exc})") from None
        return _indexable(derived_for_index(parse_item(text, url), ref, url), url)

    def _index_derived(self, ref: DerivedKey, item: dict[str, Any]) -> dict[str, Any]:
        """Publish the item in the next index generation (a change set or a fold), unless it is indexed as it is."""
        self.refresh()  # decide on the index as published now, not on the view this catalog opened
        old = self._derived_slot(ref, item["id"])
        if old is not None and self.index.holds(item, ref.key):
            return item
        self._commit_item(item["id"], Change(0, item, ref.key), f"index {ref.key}")
        return item

    def _drop_derived(self, item_id: str) -> bool:
        self.refresh()
        if self._derived_hit(item_id) is None:
            return False
        self._commit_item(item_id, Change(0, None), f"remove {item_id}")
        return True

    # -- recovery and reindex ---------------------------------------------------
    def recover(self) -> list[str]:
        """Index scenes a killed ingest committed but did not index; drop markers of dead ingests."""
        done = []
        for obj in list(self.store.list("catalog/pending")):
            scene_id = obj.key.rsplit("/", 1)[-1].removesuffix(".json")
            marker = self.lake.read_json(obj.key) or {}
            if safe_scene_id(scene_id) != scene_id or self._owner_alive(marker, obj.mtime):
                continue
            item, _ = self.lake.committed(scene_id)
            hit = self.index.get(scene_id)
            if item is not None and (hit is None or hit.properties.get(VERSION_KEY)
                                     != item.get("properties", {}).get(VERSION_KEY)):
                self.publish(scene_id)
                done.append(f"completed catalog item {scene_id} left unindexed by a killed ingest")
            self.store.delete(obj.key)
        for line in done:
            log.info("%s: %s", self.root, line)
        return done

    @staticmethod
    def _owner_alive(marker: dict[str, Any], mtime: dt.datetime | None) -> bool:
        """Whether the ingest that wrote a pending marker may still run (same host: its pid; else: its age)."""
        if marker.get("host") == socket.gethostname() and isinstance(marker.get("pid"), int):
            return marker["pid"] == os.getpid() or pid_alive(marker["pid"])
        return mtime is not None and dt.datetime.now(dt.UTC) - mtime < _PENDING_GRACE

    def reindex(self, progress: Callable[[int, int], None] | None = None, *,
                rebuild_items: bool = False) -> ReindexReport:
        """Rebuild the index from the committed items and publish it as the next generation."""
        if rebuild_items:
            raise CatalogError(f"{self.root}: --rebuild-items is for local lakes; re-ingest the scenes of an "
                               "object-store lake to rewrite their items")
        report = ReindexReport()
        items: list[dict[str, Any]] = []
        hrefs: dict[str, str] = {}
        ids, derived = self.lake.scene_ids(), self._derived_keys()
        for n, sid in enumerate(ids, 1):
            if progress:
                progress(n, len(ids) + len(derived))
            item = self._reindex_one(sid, report)
            if item is not None:
                items.append(item)
                hrefs[sid] = self.item_href(sid)
        for n, ref in enumerate(derived, len(ids) + 1):
            if progress:
                progress(n, len(ids) + len(derived))
            item = self._reindex_derived(ref, report, hrefs)
            if item is not None:
                items.append(item)
                hrefs[item["id"]] = ref.key

        def change(idx: CatalogIndex) -> set[str]:
            report.indexed = idx.insert_items(items, batch_size=1000, href=lambda it: hrefs[it["id"]])
            idx.analyze()
            return set(idx.collections())

        self._commit(change, f"reindex {len(items)} item(s)", fresh=True)
        return report

    def _reindex_one(self, sid: str, report: ReindexReport) -> dict[str, Any] | None:
        key = self.lake.item_key(sid)
        try:
            text = self.store.get_text(key, 16 * 1024 * 1024)
        except ObjectNotFound:
            return None  # an upload whose commit never happened: gc's business
        except StorageError as exc:
            report.corrupt.append((self.store.url_of(key), str(exc)))
            return None
        try:
            item = parse_item(text, self.store.url_of(key))
        except CorruptItemError as exc:
            report.corrupt.append((self.store.url_of(key), str(exc)))
            return None
        if item["id"] != sid:
            report.corrupt.append((self.store.url_of(key), f"id {item['id']!r} differs from its folder {sid!r}"))
            return None
        return item

    def validate(self, schema_dirs: Sequence[str | Path] = (),
                 progress: Callable[[int, int], None] | None = None) -> StacReport:
        """Check the root catalog, collections and items against the official STAC schemas, offline."""
        from .validate import stac_registry, validate_stac

        registry = stac_registry(schema_dirs)
        colls = [o.key for o in self.store.list("collections") if o.key.endswith("/collection.json")]
        keys = ["catalog.json", *sorted(colls), *(self.lake.item_key(s) for s in self.lake.scene_ids()),
                *(ref.key for ref in self._derived_keys())]
        report = StacReport()
        for n, key in enumerate(keys, 1):
            if progress:
                progress(n, len(keys))
            try:
                obj = json.loads(self.store.get_text(key, 16 * 1024 * 1024))
            except ObjectNotFound:
                continue
            except (StorageError, json.JSONDecodeError) as exc:
                report.checked += 1
                report.invalid[self.store.url_of(key)] = [f"unreadable JSON ({exc})"]
                continue
            report.checked += 1
            problems = validate_stac(obj, registry) if isinstance(obj, dict) else ["not a JSON object"]
            if problems:
                report.invalid[self.store.url_of(key)] = problems
        return report

    # -- reading -------------------------------------------------------------------
    def search(self, query: Query | ParsedQuery, *, scenes_only: bool = False) -> list[SearchHit]:
        return self.index.search(query, scenes_only=scenes_only)

    def get(self, item_id: str) -> dict[str, Any]:
        hit = self.index.get(item_id)
        if hit is None or not hit.href:
            raise ItemNotFoundError(f"no item {item_id!r} in the catalog of {self.root}; list them with "
                                    "'cubelake catalog search'")
        return self._item(hit.href, False)

    def _item(self, href: str, absolute: bool) -> dict[str, Any]:
        url = self.store.url_of(href)
        try:
            item = parse_item(self.store.get_text(href, 16 * 1024 * 1024), url)
        except ObjectNotFound:
            raise ItemNotFoundError(f"{url}: indexed but gone; run 'cubelake catalog reindex --lake {self.root}'") \
                from None
        return with_absolute_hrefs(item, url, in_place=True) if absolute else item

    def stats(self) -> dict[str, Any]:  # the same numbers as a local lake, index_bytes being the snapshot's
        return self.index.stats()

    def collection_path(self, collection: str) -> Path:
        raise CatalogError(f"{self.root}: collections of an object-store lake are objects, not local files")

    def export_geoparquet(self, path: str | Path) -> int:
        """Every item as one stac-geoparquet file; an ``s3://`` destination inside or outside the lake works too."""
        from cubelake.storage import is_url, object_at

        from .export import export_geoparquet

        hrefs = [h for h in self.index.hrefs().values() if h]
        if not hrefs:
            raise CatalogError(f"the catalog of {self.root} has no items: nothing to export, no file written; "
                               f"ingest scenes first ('cubelake ingest SCENES --lake {self.root}')")
        collections = {c: doc for c in self.index.collections()
                       if (doc := self.lake.read_json(f"collections/{c}/collection.json")) is not None}
        items = (self._item(h, absolute=True) for h in hrefs)
        if not is_url(str(path)):
            return export_geoparquet(items, path, collections=collections or None)
        with tempfile.TemporaryDirectory(prefix="cubelake-export-") as tmp:
            local = Path(tmp) / "items.parquet"
            n = export_geoparquet(items, local, collections=collections or None)
            store, key = object_at(str(path), self.store.options)
            store.put(key, local)
        return n

    # -- garbage -----------------------------------------------------------------------
    def gc(self, grace: dt.timedelta | None = None, *, dry_run: bool = False) -> list[str]:
        """Bring derived items in line (:meth:`sync_derived`), then delete index snapshots and change sets
        the pointer does not name, older than ``grace``."""
        lines = self.sync_derived(dry_run=dry_run)
        ptr, _ = self._pointer()
        live = {ptr.key, ptr.changes} if ptr else set()
        now, grace = dt.datetime.now(dt.UTC), grace if grace is not None else dt.timedelta(hours=6)
        for obj in list(self.store.list("catalog/index")):
            if obj.key in live or (obj.mtime is not None and now - obj.mtime < grace):
                continue
            if not dry_run:
                self.store.delete(obj.key)
            what = "change set" if obj.key.startswith("catalog/index/changes/") else "snapshot"
            lines.append(f"{'would remove' if dry_run else 'removed'} old index {what} {obj.key}")
        return lines


def _finish_snapshot(path: Path, idx: CatalogIndex) -> None:
    """Close an index built for upload as one self-contained file (no WAL beside it)."""
    idx.close()
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA journal_mode=DELETE")
    finally:
        db.close()

