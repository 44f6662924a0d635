"""A lake on an object store (``s3://bucket/prefix``, any S3-compatible store): publication without rename.

Layout (``LAKE_VERSION`` 1, as on disk, plus immutable versions)::

    <url>/lake.json                           format marker (written create-only)
    <url>/scenes/<id>/item.json               the commit object: the scene's STAC item, assets in v/<version>/
    <url>/scenes/<id>/v/<version>/            one immutable version: scene.json, validation.json, thumbnail.png, products
    <url>/rejected/<id>.json                  validation report of the latest rejected attempt
    <url>/catalog/...                         the published search index (see cubelake.catalog.remote)
    <url>/jobs/, cubes/, exports/             scheduled jobs' ledgers and outputs, as on disk (cubelake.lake.job_key)
    <url>/datacubes/<name>/                   built datacubes, as on disk (cubelake.lake.datacube_key)

The commit protocol. Object stores have no rename and no locks, so a scene is built in a local
staging folder, uploaded under a fresh, never reused version prefix ``v/<UTC time>-<random>``,
and made visible by writing one small object, its ``item.json``, with a conditional PUT:
``If-None-Match: *`` for a new scene, ``If-Match: <ETag read before the build>`` to replace one.
Readers resolve a scene through that object only (its ``cubelake:version`` names the version
folder), so they see the old version or the new one, never a partial one. Of two writers of one
scene exactly one commit wins; the other gets :class:`~cubelake.storage.CommitConflict`, its
upload is deleted and nothing is mixed. A crash leaves only an unreferenced version prefix, which
``cubelake lake gc`` deletes once it is older than the grace period (never a referenced version).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .errors import CorruptRecordError, LakeError
from .lake import LAKE_VERSION, pid_alive, safe_scene_id
from .record import SCENE_RECORD_FILE, SceneRecord
from .storage import (
    CommitConflict,
    ObjectNotFound,
    S3Options,
    StorageError,
    Store,
    open_store,
    read_json_info,
)

__all__ = ["VERSION_KEY", "ObjectLake", "new_version"]

log = logging.getLogger(__name__)

VERSION_KEY = "cubelake:version"  # the item property naming the scene's published version folder
ITEM = "item.json"
_SKELETON_KEYS = ("lake.json",)
_MAX_JSON = 16 * 1024 * 1024  # a marker, record or item larger than this is not one of ours


def new_version(now: dt.datetime | None = None) -> str:
    """A fresh version name: sortable UTC time plus randomness (never reused, so never overwritten)."""
    t = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%S")
    return f"{t}-{uuid.uuid4().hex[:12]}"


def version_time(version: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(version[:15], "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def committed_item(item: dict[str, Any], version: str) -> dict[str, Any]:
    """The staged item as the commit object: relative asset hrefs into ``v/<version>/``, the version named."""
    out = json.loads(json.dumps(item))
    for asset in out.get("assets", {}).values():
        href = str(asset.get("href", ""))
        if href.startswith("./"):
            asset["href"] = f"./v/{version}/{href[2:]}"
    out.setdefault("properties", {})[VERSION_KEY] = version
    return out


def staging_root() -> Path:
    root = Path(os.environ.get("CUBELAKE_STAGING") or tempfile.gettempdir()) / "cubelake-staging"
    root.mkdir(parents=True, exist_ok=True)
    return root


class ObjectLake:
    """A lake rooted at an object-store URL; the same operations as :class:`cubelake.lake.Lake`."""

    is_local = False

    def __init__(self, url: str, *, create: bool = True,
                 options: S3Options | Mapping[str, Any] | None = None) -> None:
        self.store: Store = open_store(url, options)
        self.url = self.root = self.store.url
        self._etags: dict[str, str | None] = {}  # scene id -> ETag of its commit object when last read
        try:
            text = self.store.get_text("lake.json", _MAX_JSON)
        except ObjectNotFound:
            self.store.list_dirs("")  # a missing bucket says so here (a HEAD of a key cannot tell)
            if not create:
                raise LakeError(f"{self.url}: no cubelake lake here (no lake.json); create one with "
                                f"'cubelake ingest SCENES --lake {self.url}'") from None
            self._create()
            text = self.store.get_text("lake.json", _MAX_JSON)
        self._check_marker(text)

    def __repr__(self) -> str:
        return f"ObjectLake({self.url!r})"

    def _check_marker(self, text: str) -> None:
        try:
            info = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LakeError(f"{self.store.url_of('lake.json')}: unreadable lake marker ({exc}); is this a cubelake "
                            "lake?") from None
        fmt = info.get("format") if isinstance(info, dict) else None
        if fmt != "cubelake-lake":
            raise LakeError(f"{self.store.url_of('lake.json')}: not a cubelake lake marker (format={fmt!r})")
        if not isinstance(info.get("version", 0), int) or info.get("version", 0) > LAKE_VERSION:
            raise LakeError(f"{self.url}: lake format version {info.get('version')!r} is newer than this cubelake "
                            f"understands ({LAKE_VERSION}); upgrade cubelake")

    def _create(self) -> None:
        """Write the marker create-only; a prefix holding other objects is not taken over."""
        dirs, objs = self.store.list_dirs("")
        if dirs or any(o.key not in _SKELETON_KEYS for o in objs):
            raise LakeError(f"{self.url}: holds objects and is not a cubelake lake; choose an empty or new --lake "
                            "prefix")
        marker = json.dumps({"format": "cubelake-lake", "version": LAKE_VERSION}) + "\n"
        with contextlib.suppress(CommitConflict):  # another process created the lake first: use theirs
            self.store.put("lake.json", marker.encode(), create=True)
        log.info("%s: created a cubelake lake", self.url)

    def check_writable(self) -> None:
        """Write and delete one small probe object, so missing write permission is reported before any work."""
        key = f"rejected/.write-probe-{uuid.uuid4().hex[:12]}"
        self.store.put(key, b"cubelake write probe\n")
        self.store.delete(key)

    def space_text(self, needed: int | None = None) -> str:
        return f"object store {self.url}" + (f"; this scene needs up to about {needed} bytes" if needed else "")

    # -- layout ---------------------------------------------------------------
    @staticmethod
    def _check_id(scene_id: str) -> str:
        if safe_scene_id(scene_id) != scene_id:
            raise LakeError(f"{scene_id!r} is not a safe scene id")
        return scene_id

    def item_key(self, scene_id: str) -> str:
        return f"scenes/{self._check_id(scene_id)}/{ITEM}"

    def version_key(self, scene_id: str, version: str) -> str:
        if safe_scene_id(version) != version:
            raise LakeError(f"{self.url}: scene {scene_id}: version {version!r} is not a safe name")
        return f"scenes/{self._check_id(scene_id)}/v/{version}"

    def rejected_key(self, scene_id: str) -> str:
        return f"rejected/{self._check_id(scene_id)}.json"

    def rejected_path(self, scene_id: str) -> str:
        return self.store.url_of(self.rejected_key(scene_id))

    def read_json(self, key: str) -> dict[str, Any] | None:
        """A JSON object of the lake, or ``None`` when missing; a damaged one is logged and taken as missing."""
        return self.read_json_info(key)[0]

    def read_json_info(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """:meth:`read_json` and the ETag it was read at (``None`` only when the object is missing)."""
        return read_json_info(self.store, key, _MAX_JSON)

    def committed(self, scene_id: str) -> tuple[dict[str, Any] | None, str | None]:
        """The scene's commit object (its item) and that object's ETag; ``(None, None)`` if unpublished."""
        item, etag = self.read_json_info(self.item_key(scene_id))
        self._etags[scene_id] = etag
        return item, etag

    def scene_version(self, scene_id: str) -> str | None:
        item, _ = self.committed(scene_id)
        version = (item or {}).get("properties", {}).get(VERSION_KEY)
        return str(version) if isinstance(version, str) else None

    def scene_location(self, scene_id: str) -> str | None:
        """The URL of the scene's published version folder (where its products are), or ``None``."""
        version = self.scene_version(scene_id)
        return self.store.url_of(self.version_key(scene_id, version)) if version else None

    def scene_record(self, scene_id: str) -> SceneRecord | None:
        """The published record of a scene (through its commit object); ``None`` if unpublished or unreadable.

        Raises :class:`~cubelake.errors.RecordVersionError` for a record a newer cubelake wrote.
        """
        version = self.scene_version(scene_id)
        if version is None:
            return None
        key = f"{self.version_key(scene_id, version)}/{SCENE_RECORD_FILE}"
        try:
            return SceneRecord.from_json(self.store.get_text(key, _MAX_JSON), self.store.url_of(key))
        except ObjectNotFound:
            return None
        except CorruptRecordError as exc:
            log.warning("unreadable scene record: %s", exc)
            return None

    def scene_ids(self) -> list[str]:
        """Ids of the scene folders (one delimiter listing; a folder without a commit object is skipped by readers)."""
        dirs, _ = self.store.list_dirs("scenes")
        return [d for d in dirs if safe_scene_id(d) == d]

    def rejected_ids(self) -> list[str]:
        return sorted(o.key.rsplit("/", 1)[-1].removesuffix(".json") for o in self.store.list("rejected")
                      if o.key.endswith(".json"))

    # -- reference roots ----------------------------------------------------------
    def _marker(self) -> tuple[dict[str, Any], str | None]:
        info, etag = self.read_json_info("lake.json")
        return info or {}, etag

    @property
    def allowed_roots(self) -> list[str]:
        return [str(r) for r in self._marker()[0].get("allowed_roots", [])]

    def reference_roots(self) -> list[str]:
        return [self.url, *self.allowed_roots]

    def allow_root(self, root: str) -> bool:
        """Add a reference root to the marker (a conditional replace, retried when another writer won)."""
        for _ in range(20):
            info, etag = self._marker()
            roots = [str(r) for r in info.get("allowed_roots", [])]
            if root in roots:
                return False
            info["allowed_roots"] = [*roots, root]
            try:
                self.store.put("lake.json", (json.dumps(info) + "\n").encode(), if_match=etag)
                return True
            except CommitConflict:
                continue
        raise LakeError(f"{self.url}: lake.json kept changing under 20 attempts to add {root}; try again")

    # -- building and publishing -----------------------------------------------
    @contextlib.contextmanager
    def lock(self, scene_id: str, *, blocking: bool = True) -> Iterator[bool]:
        """No lock across machines: the conditional commit decides between writers (always yields True)."""
        yield True

    @contextlib.contextmanager
    def staging(self, scene_id: str) -> Iterator[Path]:
        """A private local folder to build the scene in (``$CUBELAKE_STAGING`` or the temp folder)."""
        path = staging_root() / f"{self._check_id(scene_id)}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        path.mkdir()
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def publish(self, staged: Path, scene_id: str) -> str:
        """Upload ``staged`` as a new version and commit it; the version folder's URL.

        Raises :class:`CommitConflict` (after deleting the upload) when another writer committed
        this scene since :meth:`scene_record` read it.
        """
        version = new_version()
        prefix = self.version_key(scene_id, version)
        item = json.loads((staged / ITEM).read_text())
        expected = self._etags.get(scene_id)
        try:
            self._upload(staged, prefix)
            body = (json.dumps(committed_item(item, version), indent=1) + "\n").encode()
            if expected is None:
                self.store.put(self.item_key(scene_id), body, create=True)
            else:
                self.store.put(self.item_key(scene_id), body, if_match=expected)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self.store.delete_prefix(prefix)
            if isinstance(exc, CommitConflict):
                raise CommitConflict(f"{self.url}: scene {scene_id} was published by another ingest while this one "
                                     "was building it; nothing of this run was published. Run the ingest again to "
                                     "compare with the new version") from None
            raise
        self._etags.pop(scene_id, None)
        with contextlib.suppress(StorageError):
            self.store.delete(self.rejected_key(scene_id))
        log.info("%s: scene %s published as version %s", self.url, scene_id, version)
        return self.store.url_of(prefix)

    def _upload(self, staged: Path, prefix: str) -> None:
        """Every file of the staged scene but its item, streamed (multipart for large ones), 8 at a time:
        a Zarr store is hundreds of small chunk objects, and one at a time each costs a round trip."""
        files = [(p, p.relative_to(staged).as_posix()) for p in sorted(staged.rglob("*")) if p.is_file()]
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="cubelake-upload") as pool:
            for done in [pool.submit(self.store.put, f"{prefix}/{rel}", path) for path, rel in files if rel != ITEM]:
                done.result()

    def rejected_record(self, scene_id: str) -> dict[str, Any] | None:
        return self.read_json(self.rejected_key(scene_id))

    def record_rejection(self, scene_id: str, record: dict[str, Any]) -> str:
        self.store.put(self.rejected_key(scene_id), (json.dumps(record, indent=2) + "\n").encode())
        return self.rejected_path(scene_id)

    # -- crash recovery and garbage -------------------------------------------------
    def recover(self) -> list[str]:
        """Remove local staging folders of dead processes (the lake itself needs no repair: see :meth:`gc`)."""
        done = []
        for entry in staging_root().iterdir():
            parts = entry.name.rsplit(".", 2)
            pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
            if pid is None or pid == os.getpid() or pid_alive(pid):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"removed unfinished local build {entry.name}")
        return done

    def orphan_versions(self, grace: dt.timedelta) -> list[tuple[str, str]]:
        """``(scene id, version)`` of every version no commit object references, older than ``grace``."""
        now = dt.datetime.now(dt.UTC)
        out = []
        for sid in self.scene_ids():
            live = self.scene_version(sid)
            versions, _ = self.store.list_dirs(f"scenes/{sid}/v")
            for v in versions:
                born = version_time(v)
                if v != live and (born is None or now - born >= grace):
                    out.append((sid, v))
        return out

    def gc(self, grace: dt.timedelta | None = None, *, dry_run: bool = False) -> list[str]:
        """Delete unreferenced versions older than ``grace`` (never a referenced one); one line each.

        ``grace`` must exceed the longest ingest: a version being uploaded is not referenced yet.
        """
        lines = [] if dry_run else self.recover()
        for sid, version in self.orphan_versions(grace if grace is not None else dt.timedelta(hours=6)):
            key = f"scenes/{sid}/v/{version}"
            n = 0 if dry_run else self.store.delete_prefix(key)
            lines.append(f"{'would remove' if dry_run else 'removed'} unreferenced version {sid}/{version}"
                         + ("" if dry_run else f" ({n} objects)"))
        for line in lines:
            log.info("%s: %s", self.url, line)
        return lines
