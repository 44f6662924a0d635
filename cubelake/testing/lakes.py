"""A real ``cubelake catalog serve`` process on 127.0.0.1 for the API tests, and synthetic lakes to serve."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cubelake.catalog.index import CatalogIndex
from cubelake.catalog.items import item_json
from cubelake.lake import Lake

CLI = str(Path(sys.executable).with_name("cubelake"))
_URL = re.compile(r"at (http://127\.0\.0\.1:\d+/)")


@contextmanager
def api_server(lake: str | Path, *args: str, env: dict[str, str] | None = None,
               timeout: float = 60.0) -> Iterator[str]:
    """The base URL of a server process on a free port; stopped (SIGINT) and checked on exit."""
    proc = subprocess.Popen([CLI, "catalog", "serve", "--lake", str(lake), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    url = None
    while url is None:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = proc.stdout.readline() if ready else ""
        if not line:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the server did not start (exit {proc.returncode}): {line}{out}{err}")
        m = _URL.search(line)
        url = m.group(1) if m else None
    try:
        _wait_ready(url, deadline)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("the server did not stop on SIGINT within 20 s") from None
        assert "Traceback" not in err, err


def _wait_ready(url: str, deadline: float) -> None:
    import httpx

    while True:
        try:
            if httpx.get(url + "conformance", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} never answered")
        time.sleep(0.1)


def synthetic_lake(root: Path, items: Iterable[dict[str, Any]]) -> Path:
    """A lake folder whose catalog holds ``items`` (item files under ``scenes/<id>/``, indexed)."""
    Lake(root, create=True)
    hrefs: dict[str, str] = {}

    def written() -> Iterator[dict[str, Any]]:
        for item in items:
            href = f"scenes/{item['id']}/item.json"
            (root / href).parent.mkdir(parents=True, exist_ok=True)
            (root / href).write_text(item_json(item))
            hrefs[item["id"]] = href
            yield item

    with CatalogIndex(root / "catalog.sqlite") as idx:
        idx.insert_items(written(), batch_size=1000, href=lambda item: hrefs[item["id"]])
    return root
