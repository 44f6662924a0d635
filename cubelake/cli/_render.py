"""Rendering helpers: consoles, progress bars and result lines."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["STATE", "err_console", "escape", "out_console", "print_json", "progress_bars"]


@dataclass
class _State:
    quiet: bool = False


STATE = _State()


def out_console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


def err_console() -> Console:
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Callable[[Any], None] | None]:
    """A progress callback drawing one bar per scene on stderr, or ``None`` when not a terminal."""
    console = err_console()
    if not enabled or STATE.quiet or not console.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as bars:
        tasks: dict[str, Any] = {}

        def on_event(ev: Any) -> None:
            if ev.path not in tasks:
                tasks[ev.path] = bars.add_task(escape(ev.path.rsplit("/", 1)[-1]), total=None)
            task = tasks[ev.path]
            if ev.stage == "scan" and ev.total:
                bars.update(task, completed=ev.done, total=ev.total, description=escape(ev.path.rsplit("/", 1)[-1]))
            elif ev.stage in ("cog", "publish"):
                bars.update(task, description=escape(f"{ev.path.rsplit('/', 1)[-1]} ({ev.stage})"))
            elif ev.stage == "done":
                bars.remove_task(task)

        yield on_event
