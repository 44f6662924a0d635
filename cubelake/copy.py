"""``cubelake lake copy``: scenes from one lake to another, local or on an object store, verified and resumable.

Each scene is fetched into a local staging folder object by object (bounded memory: streamed
downloads), checked against the BLAKE3 hashes its record holds for every product, and published
into the destination with the destination's own protocol (a rename on disk, an immutable
version plus a conditional commit on an object store), then indexed. A scene whose destination
record already has the same content and configuration hashes is skipped, so a copy that was
interrupted resumes where it stopped; a half-uploaded version left by a crash is never
referenced and ``lake gc`` removes it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CubelakeError, LakeError
from .hashing import file_blake3, tree_blake3
from .lake import AnyLake, Lake, open_lake
from .object_lake import VERSION_KEY, ObjectLake, staging_root
from .record import ProductInfo, SceneRecord, Thumbnail
from .storage import Store, open_store

__all__ = ["CopyReport", "copy_lake"]

log = logging.getLogger(__name__)


@dataclass
class CopyReport:
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already there with the same content and settings
    failed: dict[str, str] = field(default_factory=dict)
    bytes: int = 0

    def lines(self) -> list[str]:
        return ([f"copied {s}" for s in self.copied] + [f"unchanged {s} (already in the destination)" for s in self.skipped]
                + [f"{len(self.copied)} copied ({self.bytes} bytes), {len(self.skipped)} unchanged, "
                   f"{len(self.failed)} failed"])


def local_item(item: dict[str, Any]) -> dict[str, Any]:
    """A committed item back in its staged form: asset hrefs beside it, no version property."""
    out = json.loads(json.dumps(item))
    version = out.get("properties", {}).pop(VERSION_KEY, None)
    if version:
        prefix = f"./v/{version}/"
        for asset in out.get("assets", {}).values():
            href = str(asset.get("href", ""))
            if href.startswith(prefix):
                asset["href"] = "./" + href[len(prefix):]
    return out


def _scene_store(lake: AnyLake, scene_id: str) -> tuple[Store, dict[str, Any]]:
    """The store rooted at the scene's published folder, and its item in staged form."""
    location = lake.scene_location(scene_id)
    if location is None:
        raise LakeError(f"{lake.url}: scene {scene_id} is not published")
    store = open_store(location, lake.store.options)
    if isinstance(lake, ObjectLake):
        item, _ = lake.committed(scene_id)
        return store, local_item(item or {})
    return store, json.loads(store.get_text("item.json"))


def _verify(staged: Path, record: SceneRecord, scene_id: str) -> None:
    """Every product's recorded BLAKE3 (file or tree), and the thumbnail's, against the staged copy."""
    checked: list[tuple[str, ProductInfo | Thumbnail]] = list(record.products.items())
    if record.thumbnail is not None:
        checked.append(("thumbnail", record.thumbnail))
    for name, info in checked:
        path = staged / info.path
        want = info.blake3 if isinstance(info, Thumbnail) else info.blake3 or info.tree_blake3
        if not want:
            continue
        if not path.exists():
            raise LakeError(f"{scene_id}: product {name} ({path.name}) missing from the source")
        got = file_blake3(path) if path.is_file() else tree_blake3(path)
        if got != want:
            raise LakeError(f"{scene_id}: product {name} differs from its recorded BLAKE3 ({got[:12]} != {want[:12]}); "
                            "the source lake is damaged, nothing was copied for this scene")


def _fetch(src: AnyLake, scene_id: str, staged: Path) -> int:
    store, item = _scene_store(src, scene_id)
    n = 0
    for obj in store.list():
        if obj.key == "item.json":
            continue
        dest = staged / obj.key
        dest.parent.mkdir(parents=True, exist_ok=True)
        n += store.download(obj.key, dest)
    (staged / "item.json").write_text(json.dumps(item, separators=(",", ":")) + "\n")
    return n


def copy_scene(src: AnyLake, dst: AnyLake, scene_id: str) -> int | None:
    """Copy one scene; the bytes copied, or ``None`` when the destination already has this content."""
    from cubelake.catalog import LakeCatalog

    record = src.scene_record(scene_id)
    if record is None:
        raise LakeError(f"{src.url}: scene {scene_id} has no readable record")
    there = dst.scene_record(scene_id)
    if there is not None and there.content_hash == record.content_hash and there.config_hash == record.config_hash:
        return None
    # in the staging root (created if missing), named <name>.<pid>.<random>: recover() removes it after a kill
    staging = Path(tempfile.mkdtemp(prefix=f"copy-{scene_id}.{os.getpid()}.", dir=staging_root()))
    try:
        n = _fetch(src, scene_id, staging)
        _verify(staging, record, scene_id)
        with dst.lock(scene_id), LakeCatalog(dst) as cat, cat.pending(scene_id):
            dst.scene_record(scene_id)  # the ETag the commit is conditional on
            dst.publish(staging, scene_id)
            cat.publish(scene_id)
        return n
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_lake(src: AnyLake | str, dst: AnyLake | str, scene_ids: list[str] | None = None) -> CopyReport:
    """Copy ``scene_ids`` (default: every scene) from ``src`` to ``dst`` (created if new); one bad scene never
    stops the others."""
    source = open_lake(src, create=False)
    dest = open_lake(dst)
    dest.check_writable()
    if isinstance(dest, Lake) and isinstance(source, Lake) and dest.root.resolve() == source.root.resolve():
        raise LakeError(f"{dest.url}: source and destination are the same lake")
    report = CopyReport()
    for sid in scene_ids if scene_ids is not None else source.scene_ids():
        try:
            n = copy_scene(source, dest, sid)
        except CubelakeError as exc:
            report.failed[sid] = str(exc)
            log.warning("%s: %s", sid, exc)
            continue
        if n is None:
            report.skipped.append(sid)
        else:
            report.copied.append(sid)
            report.bytes += n
    return report
