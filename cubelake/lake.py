"""The lake on disk: where products live, and how they appear atomically.

Layout (``LAKE_VERSION`` 1)::

    <lake>/lake.json                 format marker
    <lake>/scenes/<id>/              one published scene: scene.json, validation.json, thumbnail.png, <id>.tif, <id>.zarr/
    <lake>/rejected/<id>.json        validation report of the latest rejected attempt
    <lake>/.staging/<id>.<pid>.<n>/  products being built (never read by anyone)
    <lake>/.trash/                   replaced scenes on their way out
    <lake>/.locks/<id>.lock          one ingest of a scene at a time, across processes
    <lake>/jobs/<job>/               a scheduled job's ledger: lease.json, inputs/, steps/, runs/ (cubelake.jobs)
    <lake>/cubes/<job>/              the job's stacked datacubes (reference sets of scenes on one grid)
    <lake>/datacubes/<name>/         a built datacube (cubelake.datacube): item.json, its STAC item and
                                     commit object, naming the version v/<version>/<name>.zarr it publishes
    <lake>/predictions/<name>/       a model's prediction of a scene (cubelake.infer): item.json naming the
                                     version v/<version>/ (Zarr + COGs); both kinds publish as cubelake.derived says
    <lake>/exports/                  catalog snapshots (stac-geoparquet) that jobs export

A scene is built completely in ``.staging`` and moved into ``scenes/`` with one ``rename``,
so readers see the old scene or the new one, never a partial one. After a crash, stale
staging folders (their process is gone) are removed and a scene caught mid-replacement is
restored from ``.trash``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock

from .errors import CorruptRecordError, LakeError
from .record import SCENE_RECORD_FILE, SceneRecord, read_scene_record
from .storage import S3Options, Store, is_url, open_store

__all__ = ["DERIVED_ROOTS", "LAKE_VERSION", "AnyLake", "Lake", "atomic_write_text", "cube_key", "datacube_key",
           "derived_key", "format_bytes", "is_disk_full", "job_key", "open_lake", "pid_alive", "prediction_key",
           "safe_scene_id"]

log = logging.getLogger(__name__)

LAKE_VERSION = 1
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_scene_id(name: str, max_len: int = 96) -> str:
    """A scene id from a file name: letters, digits, ``.``, ``_``, ``-`` only; no separators or ``..``."""
    cleaned = _SAFE.sub("_", name).strip("._-")
    cleaned = re.sub(r"\.{2,}", ".", cleaned)
    if not cleaned:
        cleaned = "scene"
    if len(cleaned) > max_len:
        digest = hashlib.sha1(cleaned.encode()).hexdigest()[:8]
        cleaned = f"{cleaned[: max_len - 9]}-{digest}"
    return cleaned


def job_key(job: str, *parts: str) -> str:
    """The key, relative to the lake root (a folder or an object-store prefix), of a job's ledger object."""
    if safe_scene_id(job) != job:
        raise LakeError(f"{job!r} is not a safe job name")
    for part in parts:
        if safe_scene_id(part) != part:
            raise LakeError(f"{part!r} is not a safe ledger key")
    return "/".join(("jobs", job, *parts))


def cube_key(job: str, name: str) -> str:
    """The key of a stacked datacube a job writes (a reference set of scenes on one grid)."""
    if safe_scene_id(job) != job or safe_scene_id(name) != name:
        raise LakeError(f"{job!r}/{name!r} is not a safe cube name")
    return f"cubes/{job}/{name}"


#: The lake folders holding derived products, one ``<name>/`` each (``cubelake.derived`` publishes them).
DERIVED_ROOTS = ("datacubes", "predictions")


def derived_key(root: str, name: str, *parts: str) -> str:
    """The key of a derived product's folder (or of ``parts`` inside it): ``<root>/<name>/...``, every part checked."""
    if root not in DERIVED_ROOTS:
        raise LakeError(f"{root!r} is not a folder of derived products (one of {', '.join(DERIVED_ROOTS)})")
    for part in (name, *parts):
        if safe_scene_id(part) != part:
            raise LakeError(f"{part!r} is not a safe {root[:-1]} name or key (letters, digits, '.', '_', '-')")
    return "/".join((root, name, *parts))


def datacube_key(name: str, *parts: str) -> str:
    """The key of a built datacube's folder (or of ``parts`` inside it): ``datacubes/<name>/...``.

    Built cubes (scenes reprojected onto one grid) live apart from the jobs' stacked reference sets
    under ``cubes/``, so a cube name never meets a job name.
    """
    return derived_key("datacubes", name, *parts)


def prediction_key(name: str, *parts: str) -> str:
    """The key of a prediction's folder (or of ``parts`` inside it): ``predictions/<name>/...``."""
    return derived_key("predictions", name, *parts)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file so readers see the old content or the new, never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def is_disk_full(exc: BaseException) -> bool:
    """Whether an error, or one it was raised from, says the device is full (ENOSPC, EDQUOT).

    GDAL and SQLite report it in their own words, so their messages are matched too.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e).lower()
        if any(s in text for s in ("no space left on device", "database or disk is full", "disk quota exceeded")):
            return True
        e = e.__cause__ or e.__context__
    return False


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


def _mount_of(path: Path) -> tuple[str, str]:
    """The mount point holding ``path`` and its device name (from /proc/self/mounts where there is one)."""
    p = path.resolve()
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    device = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[1] == str(p):
                device = fields[0]
    return str(p), device


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _settle_zarr_writes(timeout: float = 30.0) -> None:
    """Wait until zarr-python's event-loop thread has finished what it was running.

    zarr's synchronous API runs each call as a coroutine on its own loop thread and waits for it; a
    ``KeyboardInterrupt`` in that wait leaves the coroutine writing (``zarr.json`` files, with the folders
    above them) after the caller has moved on, into a staging folder being removed: a Ctrl-C during an
    ingest's store creation left a staging folder behind (CI, ``tests/test_lake.py``). Does nothing when zarr
    was never imported or its loop never started.
    """
    import sys

    sync = sys.modules.get("zarr.core.sync")
    loop = getattr(sync, "loop", [None])[0] if sync is not None else None
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    import asyncio

    async def drain() -> None:
        for _ in range(8):  # a coroutine may start others as it ends
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if not pending:
                return
            await asyncio.wait(pending, timeout=timeout)

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout + 1)


_SKELETON = ("scenes", "rejected", ".staging", ".trash", ".locks")


def _is_skeleton(name: str) -> bool:
    """An entry a lake being created holds (its marker may have appeared since this process looked)."""
    return name in (*_SKELETON, "lake.json") or (name.startswith(".lake.json.") and name.endswith(".tmp"))


class Lake:
    """A lake rooted at a local directory (created on first use).

    Local lakes keep publication by ``rename`` (one system call, measured against the object-store
    protocol in BENCHMARKS.md); :class:`cubelake.object_lake.ObjectLake` is the same lake on an
    object store. :func:`open_lake` picks the right one for a path or URL.
    """

    is_local = True

    def __init__(self, root: str | Path, *, create: bool = True) -> None:
        if is_url(str(root)):
            raise LakeError(f"{root}: an object-store URL, not a folder; open it with cubelake.lake.open_lake")
        self.root = Path(root)
        marker = self.root / "lake.json"
        if not marker.is_file():
            if not create:
                raise LakeError(
                    f"{self.root}: no cubelake lake here (no lake.json); create one with 'cubelake ingest --lake'")
            self._create(marker)
        self._check_marker(marker)
        for sub in _SKELETON:
            (self.root / sub).mkdir(exist_ok=True)

    def _check_marker(self, marker: Path) -> None:
        try:
            info = json.loads(marker.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LakeError(f"{marker}: unreadable lake marker ({exc}); is this a cubelake lake?") from exc
        fmt = info.get("format") if isinstance(info, dict) else None
        if fmt != "cubelake-lake":
            raise LakeError(f"{marker}: not a cubelake lake marker (format={fmt!r})")
        if not isinstance(info.get("version", 0), int) or info.get("version", 0) > LAKE_VERSION:
            raise LakeError(
                f"{self.root}: lake format version {info.get('version')!r} is newer than this cubelake "
                f"understands ({LAKE_VERSION}); upgrade cubelake"
            )

    def _create(self, marker: Path) -> None:
        """Create the lake; several processes may do so at once, and all of them succeed.

        A folder holding only the lake's own skeleton is a lake another process is creating right
        now, not a foreign folder. The marker appears with ``link``, which never replaces one that
        another process wrote in the meantime (with allowed roots it may already have added).
        """
        if self.root.exists() and not self.root.is_dir():
            raise LakeError(f"{self.root}: exists and is not a folder; choose an empty or new --lake folder")
        if self.root.is_dir() and any(not _is_skeleton(p.name) for p in self.root.iterdir()):
            raise LakeError(
                f"{self.root}: exists, is not empty and is not a cubelake lake; choose an empty or new --lake folder"
            )
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for sub in _SKELETON:
                (self.root / sub).mkdir(exist_ok=True)
            tmp = marker.with_name(f".lake.json.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_text(json.dumps({"format": "cubelake-lake", "version": LAKE_VERSION}) + "\n")
            try:
                os.link(tmp, marker)
            except FileExistsError:
                pass  # another process created the lake first: use theirs
            finally:
                tmp.unlink()
        except OSError as exc:
            raise LakeError(f"{self.root}: cannot create the lake here: {exc.strerror or exc}") from exc

    def check_writable(self) -> None:
        """Nothing to probe: creating the skeleton already wrote into the folder."""

    def space_text(self, needed: int | None = None) -> str:
        """Where the lake's bytes go and how much room is left, for disk-full messages."""
        mount, device = _mount_of(self.root)
        try:
            usage = shutil.disk_usage(self.root)
            free = f"{format_bytes(usage.free)} free of {format_bytes(usage.total)}"
        except OSError:
            free = "free space unknown"
        need = f"; this scene needs up to about {format_bytes(needed)}" if needed else ""
        return f"device {device} mounted at {mount} has {free}{need}"

    # -- layout -------------------------------------------------------------
    @property
    def url(self) -> str:
        return str(self.root)

    @property
    def store(self) -> Store:
        """The lake's root as a :class:`~cubelake.storage.Store` (what copy and gc read through)."""
        return open_store(self.root)

    def scene_location(self, scene_id: str) -> str | None:
        """The folder of the scene's published products, or ``None``."""
        folder = self.scene_dir(scene_id)
        return str(folder) if (folder / "scene.json").is_file() else None

    @property
    def scenes_dir(self) -> Path:
        return self.root / "scenes"

    def scene_dir(self, scene_id: str) -> Path:
        if safe_scene_id(scene_id) != scene_id:
            raise LakeError(f"{scene_id!r} is not a safe scene id")
        return self.scenes_dir / scene_id

    def rejected_path(self, scene_id: str) -> Path:
        return self.root / "rejected" / f"{scene_id}.json"

    def scene_record(self, scene_id: str) -> SceneRecord | None:
        """The published record of a scene; ``None`` if there is none or it is unreadable (logged).

        Raises :class:`~cubelake.errors.RecordVersionError` for a record a newer cubelake wrote
        (treating it as absent would let this version overwrite the scene).
        """
        path = self.scene_dir(scene_id) / SCENE_RECORD_FILE
        try:
            return read_scene_record(path)
        except FileNotFoundError:
            return None
        except CorruptRecordError as exc:
            log.warning("unreadable scene record: %s", exc)
            return None

    def rejected_record(self, scene_id: str) -> dict[str, Any] | None:
        """The report of the scene's latest rejected attempt, or ``None`` (unreadable ones too)."""
        try:
            data = json.loads(self.rejected_path(scene_id).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def scene_ids(self) -> list[str]:
        return sorted(p.name for p in self.scenes_dir.iterdir() if p.is_dir() and (p / "scene.json").is_file())

    def rejected_ids(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "rejected").glob("*.json"))

    # -- reference roots ----------------------------------------------------
    def _marker(self) -> dict[str, Any]:
        return dict(json.loads((self.root / "lake.json").read_text()))

    @property
    def allowed_roots(self) -> list[str]:
        """Roots outside the lake that its reference sets may point into (local folders, ``s3://`` prefixes)."""
        return [str(r) for r in self._marker().get("allowed_roots", [])]

    def reference_roots(self) -> list[str]:
        """Everything a reference set in this lake may point into: the lake itself and :attr:`allowed_roots`."""
        return [str(self.root.resolve()), *self.allowed_roots]

    def allow_root(self, root: str) -> bool:
        """Add a reference root (a local folder is stored resolved); returns False if it was there already."""
        if "://" not in root:
            root = str(Path(root).expanduser().resolve())
        with self.lock("_lake_json"):
            info = self._marker()
            roots = [str(r) for r in info.get("allowed_roots", [])]
            if root in roots:
                return False
            info["allowed_roots"] = [*roots, root]
            atomic_write_text(self.root / "lake.json", json.dumps(info) + "\n")
        log.info("%s: references may now point into %s", self.root, root)
        return True

    # -- concurrency and atomicity -----------------------------------------
    @contextlib.contextmanager
    def lock(self, scene_id: str, *, blocking: bool = True) -> Iterator[bool]:
        """Hold the scene's lock across processes; yields False if ``blocking=False`` and it is taken.

        filelock gives flock(2) on POSIX and msvcrt locking on Windows; the lock file stays (removing
        it would let a third process lock a new file while the second still holds the old one).
        """
        lock = filelock.FileLock(self.root / ".locks" / f"{scene_id}.lock")
        try:
            lock.acquire(timeout=-1 if blocking else 0)
        except filelock.Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    @contextlib.contextmanager
    def staging(self, scene_id: str) -> Iterator[Path]:
        """A fresh private folder for building a scene; removed on exit unless published."""
        path = self.root / ".staging" / f"{scene_id}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        try:
            yield path
        except BaseException:
            _settle_zarr_writes()  # before the folder goes: nothing may write into it afterwards
            raise
        finally:
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)

    def publish(self, staged: Path, scene_id: str) -> Path:
        """Move a complete staged scene into ``scenes/<id>``, replacing any previous version."""
        target = self.scene_dir(scene_id)
        trash = None
        if target.exists():
            trash = self.root / ".trash" / f"{scene_id}.{uuid.uuid4().hex[:8]}"
            os.rename(target, trash)
        try:
            os.rename(staged, target)
        except OSError:
            if trash is not None:
                os.rename(trash, target)
            raise
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.rejected_path(scene_id).unlink()
        return target

    def record_rejection(self, scene_id: str, record: dict[str, Any]) -> Path:
        path = self.rejected_path(scene_id)
        atomic_write_text(path, json.dumps(record, indent=2) + "\n")
        return path

    def gc(self, grace: dt.timedelta | None = None, *, dry_run: bool = False) -> list[str]:
        """A local lake keeps no old versions (publication renames): gc is crash recovery (staging, trash)."""
        return [] if dry_run else self.recover()

    def recover(self) -> list[str]:
        """Clean up after crashed ingests; returns what was done, one line each."""
        done: list[str] = []
        for entry in (self.root / ".staging").iterdir():
            parts = entry.name.rsplit(".", 2)
            pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
            if pid is not None and pid != os.getpid() and pid_alive(pid):
                continue
            if pid == os.getpid():
                continue
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"removed unfinished build {entry.name}")
        for entry in (self.root / ".trash").iterdir():
            scene_id = entry.name.rsplit(".", 1)[0]
            with self.lock(scene_id, blocking=False) as held:
                if not held:
                    continue  # a live ingest of this scene is mid-replacement
                target = self.scenes_dir / scene_id
                if not target.exists() and (entry / "scene.json").is_file():
                    try:
                        os.rename(entry, target)
                        done.append(f"restored scene {scene_id} interrupted while being replaced")
                        continue
                    except OSError as exc:
                        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                            raise
                shutil.rmtree(entry, ignore_errors=True)
        for line in done:
            log.info("%s: %s", self.root, line)
        return done


if TYPE_CHECKING:
    from typing import TypeAlias

    from .object_lake import ObjectLake

    AnyLake: TypeAlias = "Lake | ObjectLake"
else:
    AnyLake = Any


def open_lake(root: str | Path | AnyLake, *, create: bool = True,
              options: S3Options | Mapping[str, Any] | None = None) -> AnyLake:
    """The lake at ``root``: a :class:`Lake` for a local folder, an ``ObjectLake`` for ``s3://`` (and other) URLs."""
    if isinstance(root, Lake):
        return root
    if not isinstance(root, str | Path):
        return root  # an ObjectLake already
    if is_url(str(root)):
        from .object_lake import ObjectLake

        return ObjectLake(str(root), create=create, options=options)
    return Lake(root, create=create)


