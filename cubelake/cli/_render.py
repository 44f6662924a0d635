"""Rendering helpers: consoles, progress bars and result lines."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["QUIET", "STATE", "VERBOSE", "clean", "configure_output", "err_console", "escape", "fail", "out_console",
           "print_json", "progress_bars", "show"]

#: -v/-q are accepted before the subcommand (global) and after it (per command).
VERBOSE = typer.Option(0, "--verbose", "-v", count=True, help="More log output (-v info, -vv debug).")
QUIET = typer.Option(False, "--quiet", "-q", help="Only errors; no progress bars.")


@dataclass
class _State:
    quiet: bool = False


STATE = _State()


def configure_output(verbose: int, quiet: bool) -> None:
    """Log level and progress bars for this run (the library logs; the CLI decides what shows)."""
    if not verbose and not quiet and logging.getLogger().handlers:
        return  # a subcommand without -v/-q keeps what the global options set
    from rich.logging import RichHandler  # here, not at the top: start-up time

    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    handler = RichHandler(show_time=False, show_path=False, console=err_console())
    handler.addFilter(_OneLineErrors(keep_tracebacks=verbose >= 2))
    logging.basicConfig(level=level, format="%(name)s: %(message)s", handlers=[handler], force=True)
    # GDAL's and tifffile's own complaints about odd TIFF tags are noise next to our reports (which say
    # what is wrong with the file); show them with -vv
    logging.getLogger("rasterio").setLevel(logging.DEBUG if verbose >= 2 else logging.ERROR)
    logging.getLogger("tifffile").setLevel(logging.DEBUG if verbose >= 2 else logging.CRITICAL)
    logging.getLogger("filelock").setLevel(logging.WARNING)  # a DEBUG line per lock taken
    # Dask distributed logs every scheduler, nanny and connection event at INFO; jobs print what matters
    quiet_dask(verbose)
    STATE.quiet = STATE.quiet or quiet


class _OneLineErrors(logging.Filter):
    """No traceback reaches a user: a logged exception shows as one line (its type and message) unless -vv.

    Also drops distributed's own error when Ctrl-C lands in ``distributed.utils.sync`` before the coroutine it
    waits for has started: its ``cancel`` callback reads a ``future`` not yet assigned and tornado logs the
    ``NameError`` (distributed 2026.8.0); there is nothing to cancel then, and the job reports the interrupt.
    """

    def __init__(self, keep_tracebacks: bool) -> None:
        super().__init__()
        self.keep_tracebacks = keep_tracebacks

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is None or record.exc_info[1] is None:
            return True
        exc = record.exc_info[1]
        if _is_sync_cancel_bug(exc):
            return False
        if not self.keep_tracebacks:
            record.msg, record.args = f"{record.getMessage()}: {type(exc).__name__}: {exc}", None
            record.exc_info = record.exc_text = None
        return True


def _is_sync_cancel_bug(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code if tb is not None else None
    return (isinstance(exc, NameError) and code is not None and code.co_name == "cancel"
            and code.co_filename.replace("\\", "/").endswith("distributed/utils.py"))


def quiet_dask(verbose: int = 0) -> None:
    """Dask distributed logs every scheduler, nanny and connection event at INFO on its own loggers (set when it
    is imported); a job prints what matters, so they show with -vv only."""
    level = logging.DEBUG if verbose >= 2 else logging.ERROR
    for name in [n for n in logging.root.manager.loggerDict if n.startswith(("distributed", "bokeh", "tornado"))]:
        logging.getLogger(name).setLevel(level)
    for name in ("distributed", "bokeh", "tornado"):
        logging.getLogger(name).setLevel(level)
    # distributed gives some of these loggers stderr handlers of their own (they do not propagate to ours)
    for logger in [v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)]:
        for handler in logger.handlers:
            if not any(isinstance(f, _OneLineErrors) for f in handler.filters):
                handler.addFilter(_OneLineErrors(keep_tracebacks=verbose >= 2))


def clean(text: object) -> str:
    """Text safe for one terminal line: control characters (a newline in a file name could forge an output
    line) and undecodable bytes of file names (surrogate escapes) are shown as escapes."""
    out = []
    for ch in str(text):
        o = ord(ch)
        if o < 32 or o == 127 or 0x80 <= o < 0xA0:
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{o:02x}"))
        elif 0xDC80 <= o <= 0xDCFF:  # os.fsdecode's stand-in for an undecodable byte
            out.append(f"\\x{o - 0xDC00:02x}")
        elif 0xD800 <= o <= 0xDFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


def show(text: object) -> str:
    """:func:`clean` text, escaped for rich markup."""
    return escape(clean(text))


def fail(exc: Exception, code: int = 1) -> typer.Exit:
    """Print a library error on stderr; the ``typer.Exit`` for the command to raise."""
    err_console().print(f"[red]error[/red]: {show(exc)}")
    return typer.Exit(code)


def out_console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


def err_console() -> Console:
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def print_json(obj: Any) -> None:
    # ensure_ascii: file names that are not UTF-8 come out as \\udcXX escapes, never as a UnicodeEncodeError
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False, default=str, ensure_ascii=True) + "\n")
    sys.stdout.flush()


@contextmanager
def _interrupts() -> Iterator[Callable[[], None]]:
    """Ctrl-C that cannot be lost: yields ``check()``, which raises ``KeyboardInterrupt`` once one arrived.

    Python raises ``KeyboardInterrupt`` in whatever code runs when it handles the signal; when
    that is a finalizer (a ``__del__`` the garbage collector runs), the exception is printed and
    dropped, and an ingest would go on to publish. The handler also remembers the interrupt, so
    the next progress event raises it again (and ingest reports progress before publishing).
    Where Ctrl-C is ignored (a background job) or handled by the caller, nothing changes.
    """
    arrived = threading.Event()

    def check() -> None:
        if arrived.is_set():
            raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler or threading.current_thread() is not threading.main_thread():
        yield check
        return

    def handler(signum: int, frame: Any) -> None:
        arrived.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Callable[[Any], None]]:
    """A progress callback drawing one bar per scene on stderr (when it is a terminal).

    Every event first raises a Ctrl-C that arrived and was dropped (see :func:`_interrupts`).
    """
    console = err_console()
    with _interrupts() as check:
        if not enabled or STATE.quiet or not console.is_terminal:
            yield lambda ev: check()
        else:
            with _bars(console, check) as on_event:
                yield on_event


@contextmanager
def _bars(console: Console, check: Callable[[], None]) -> Iterator[Callable[[Any], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as bars:
        tasks: dict[str, Any] = {}

        def on_event(ev: Any) -> None:
            check()
            if ev.path not in tasks:
                tasks[ev.path] = bars.add_task(show(ev.path.rsplit("/", 1)[-1]), total=None)
            task = tasks[ev.path]
            if ev.stage == "scan" and ev.total:
                bars.update(task, completed=ev.done, total=ev.total, description=show(ev.path.rsplit("/", 1)[-1]))
            elif ev.stage in ("cog", "publish"):
                bars.update(task, description=show(f"{ev.path.rsplit('/', 1)[-1]} ({ev.stage})"))
            elif ev.stage == "done":
                bars.remove_task(task)

        yield on_event
