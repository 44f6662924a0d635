"""The catalog of a lake on an object store: item JSONs plus a published, immutable search index.

Layout inside an object-store lake::

    scenes/<id>/item.json                      the items (the source of truth; each is its scene's commit object)
    catalog/index.json                         pointer: {"generation": n, "key": ..., "items": k}
    catalog/index/<generation>-<random>.sqlite immutable snapshots of the SQLite index
    catalog/pending/<id>.json                  an ingest between committing a scene and indexing it
    catalog.json, collections/<p>/collection.json   the static STAC tree

Searching never lists the scenes: a reader GETs the small pointer and opens the snapshot it
names from a local cache keyed by that (immutable) key, downloading it only when the pointer
moved. A writer takes the current snapshot, adds its item in a local copy, uploads it as the
next generation and moves the pointer with ``If-Match`` (``If-None-Match: *`` for the first);
when another writer moved it first, it starts again from theirs, so concurrent ingests merge
and no update is lost. Old snapshots stay for readers still downloading them; ``lake gc``
removes them after the grace period.
"""

from __future__ import annotations

import contextlib
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

from .index import CatalogIndex, SearchHit
from .items import collection_dict, root_catalog_dict, with_absolute_hrefs
from .lake import LakeCatalog, ReindexReport, StacReport, check_item, parse_item
from .query import ParsedQuery, Query

__all__ = ["ObjectLakeCatalog", "cache_root"]

log = logging.getLogger(__name__)

POINTER = "catalog/index.json"
_ATTEMPTS = 200  # conditional-put retries before giving up (each one means another writer made progress)
_PENDING_GRACE = dt.timedelta(hours=1)


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

    # -- the published index --------------------------------------------------
    def _pointer(self) -> tuple[dict[str, Any] | None, str | None]:
        ptr, etag = self.lake.read_json_info(POINTER)
        if etag is None:
            return None, None
        if ptr is None or not isinstance(ptr.get("key"), str) or not str(ptr["key"]).startswith("catalog/index/"):
            log.warning("%s: damaged index pointer; the index will be rebuilt from the items", self.store.url_of(POINTER))
            return None, etag
        return ptr, etag

    def _snapshot(self, key: str) -> Path:
        """The local copy of an immutable snapshot, downloaded once; older cached snapshots are removed."""
        local = self.cache / Path(key).name
        if not local.is_file():
            self.cache.mkdir(parents=True, exist_ok=True)
            n = self.store.download(key, local)
            log.info("%s: downloaded the catalog index %s (%d bytes)", self.root, key, n)
            for old in self.cache.glob("*.sqlite"):
                if old.name not in (local.name, "empty.sqlite") and old.name < local.name:
                    # an older generation (names sort by generation); a reader holding it open keeps its copy
                    old.unlink(missing_ok=True)
        return local

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
            self._generation = int(ptr.get("generation", 0))
            self._index = CatalogIndex(self._snapshot(str(ptr["key"])), readonly=True)
        return self._index

    def _empty_index(self) -> CatalogIndex:
        self.cache.mkdir(parents=True, exist_ok=True)
        path = self.cache / "empty.sqlite"
        if not path.is_file():
            tmp = self.cache / f".empty.{uuid.uuid4().hex[:8]}.sqlite"
            _finish_snapshot(tmp, CatalogIndex(tmp))
            os.replace(tmp, path)
        return CatalogIndex(path, readonly=True)

    def _commit(self, change: Callable[[CatalogIndex], set[str]], what: str) -> int:
        """Apply ``change`` to a copy of the current index and publish it as the next generation.

        Retries from the newer snapshot whenever another writer moved the pointer first. Returns the
        generation published; ``change`` returns the collections it touched (their JSON is rewritten).
        """
        for attempt in range(_ATTEMPTS):
            ptr, etag = self._pointer()
            gen = int(ptr.get("generation", 0)) + 1 if ptr else 1
            # in the lake's local staging root, named by pid: recover() removes it after a kill
            work = Path(tempfile.mkdtemp(prefix=f"index.{os.getpid()}.", dir=staging_root())) / "index.sqlite"
            try:
                if ptr is not None:
                    shutil.copyfile(self._snapshot(str(ptr["key"])), work)
                idx = CatalogIndex(work)
                touched = change(idx)
                count = len(idx.ids())
                _finish_snapshot(work, idx)
                key = f"catalog/index/{gen:08d}-{uuid.uuid4().hex[:12]}.sqlite"
                self.store.put(key, work, create=True)
                body = json.dumps({"format": "cubelake-index", "generation": gen, "key": key, "items": count,
                                   "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}) + "\n"
                try:
                    if etag is None:
                        self.store.put(POINTER, body.encode(), create=True)
                    else:
                        self.store.put(POINTER, body.encode(), if_match=etag)
                except CommitConflict:
                    self.store.delete(key)
                    time.sleep(random.uniform(0, min(1.0, 0.02 * 2 ** min(attempt, 6))))
                    continue
            finally:
                shutil.rmtree(work.parent, ignore_errors=True)
            self.close()
            log.info("%s: catalog index generation %d published (%s)", self.root, gen, what)
            self._write_collections_at(gen, touched)
            return gen
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

        def change(idx: CatalogIndex) -> set[str]:
            old = idx.get(scene_id)
            idx.upsert(item, self.item_href(scene_id))
            return {item["collection"]} | ({old.collection} if old and old.collection != item["collection"] else set())

        self._commit(change, f"index {scene_id}")
        return item

    def unpublish(self, scene_id: str) -> bool:
        if self.index.get(scene_id) is None:
            return False

        def change(idx: CatalogIndex) -> set[str]:
            old = idx.get(scene_id)
            idx.delete(scene_id)
            return {old.collection} if old else set()

        self._commit(change, f"remove {scene_id}")
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
            stac, description = self._profile_stac(coll, summary.item_ids[0])
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
        ids = self.lake.scene_ids()
        for n, sid in enumerate(ids, 1):
            if progress:
                progress(n, len(ids))
            item = self._reindex_one(sid, report)
            if item is not None:
                items.append(item)

        def change(idx: CatalogIndex) -> set[str]:
            old = set(idx.collections())
            idx.clear()
            report.indexed = idx.insert_items(items, batch_size=1000, href=lambda it: self.item_href(it["id"]))
            idx.analyze()
            return old | set(idx.collections())

        self._commit(change, f"reindex {len(items)} item(s)")
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
        keys = ["catalog.json", *sorted(colls), *(self.lake.item_key(s) for s in self.lake.scene_ids())]
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
    def search(self, query: Query | ParsedQuery) -> list[SearchHit]:
        return self.index.search(query)

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
        return with_absolute_hrefs(item, url) if absolute else item

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
        """Delete index snapshots the pointer does not name, older than ``grace``."""
        ptr, _ = self._pointer()
        live = ptr.get("key") if ptr else None
        now, grace = dt.datetime.now(dt.UTC), grace if grace is not None else dt.timedelta(hours=6)
        lines = []
        for obj in list(self.store.list("catalog/index")):
            if obj.key == live or (obj.mtime is not None and now - obj.mtime < grace):
                continue
            if not dry_run:
                self.store.delete(obj.key)
            lines.append(f"{'would remove' if dry_run else 'removed'} old index snapshot {obj.key}")
        return lines


def _finish_snapshot(path: Path, idx: CatalogIndex) -> None:
    """Close an index built for upload as one self-contained file (no WAL beside it)."""
    idx.close()
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA journal_mode=DELETE")
    finally:
        db.close()

