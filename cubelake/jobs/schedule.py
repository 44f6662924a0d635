"""When a job is due: its cron ``schedule`` (in UTC) has fired since its last successful run started."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from croniter import croniter

from .ledger import Ledger
from .spec import Manifest

__all__ = ["is_due", "manifest_files"]


def is_due(manifest: Manifest, ledger: Ledger, now: datetime | None = None) -> tuple[bool, str]:
    """``(due, why)``: a job without a schedule is never due; one that never succeeded is due at once."""
    now = now or datetime.now(UTC)
    if manifest.schedule is None:
        return False, "no schedule in the manifest (run it by name instead)"
    last = ledger.last_success()
    if last is None or not last.get("started"):
        return True, "never succeeded"
    started = datetime.fromisoformat(str(last["started"]))
    fires = croniter(manifest.schedule, started).get_next(datetime)
    if fires <= now:
        return True, f"'{manifest.schedule}' fired at {fires.isoformat(timespec='minutes')} since the last " \
                     f"success ({started.isoformat(timespec='minutes')})"
    return False, f"next due at {fires.isoformat(timespec='minutes')} ('{manifest.schedule}', UTC)"


def manifest_files(folder: Path) -> list[Path]:
    """The manifests of a folder: its ``*.yaml``/``*.yml`` files (not walked into sub-folders), sorted."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in (".yaml", ".yml") and p.is_file())
