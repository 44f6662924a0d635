"""What a corpus entry is: an input made from a real file, the CLI run that covers it, what must hold."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

__all__ = ["Builder", "Case", "Corpus", "Expect", "Run"]

#: ``build(root, real)`` writes a case's files under the corpus ``root`` from the ``real`` scenes.
Builder = Callable[[Path, Path], None]


class Expect(StrEnum):
    """What a run must report for an input."""

    OK = "ok"  # genuinely fine: ingested (validate: ok), exit 0 when alone
    REJECT = "reject"  # rejected: exit 1, a report in rejected/, nothing in scenes/
    REJECT_OR_WARN = "reject_or_warn"  # rejected, or accepted only with a warning matching ``mention``
    ROBUST = "robust"  # the damage may be undetectable: ingested or rejected, never a crash
    USAGE = "usage"  # a usage error (bad --profile file): exit 2 naming the file, nothing written
    REFUSE = "refuse"  # refused as a whole (refs check, an empty folder): exit 1 or 2 naming it, nothing ingested


@dataclass(frozen=True, slots=True)
class Case:
    """One malformed (or, as a control, sound) input.

    ``scene`` is the input as the CLI reports it, relative to the corpus root (ENVI: the header,
    Landsat: the MTL). ``runs`` are the keys of the CLI runs that cover it. ``mention`` is a
    regular expression (case-insensitive) that what is said about the input must match: the
    field or reason a rejection has to name. ``forbid`` is text that must never appear in the
    output (content of files the input points at). ``confine``: if the input is accepted, every
    source file of the product lies in the input's folder.
    """

    id: str
    category: str
    what: str
    scene: str
    expect: Expect
    runs: tuple[str, ...]
    build: Builder
    mention: str | None = None
    forbid: tuple[str, ...] = ()
    confine: bool = False


@dataclass(frozen=True, slots=True)
class Run:
    """One CLI process. ``targets`` are corpus-relative paths, ``controls`` real-data-relative paths.

    ``args`` may contain ``{root}`` (the corpus root). ``cwd`` is corpus-relative (default: the
    root); with ``relative`` the targets are passed as written, relative to ``cwd``. A ``batch``
    run covers many inputs in one process (plus the good ``controls``, which must be ingested).
    """

    key: str
    command: str  # "ingest", "validate" or "refs check"
    targets: tuple[str, ...]
    controls: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    fmt: str = "text"  # "json" (ingest only) or "text"
    timeout: float = 20.0
    cwd: str = "."
    relative: bool = False
    batch: bool = False


@dataclass(slots=True)
class Corpus:
    """The cases and the runs that cover them."""

    cases: list[Case] = field(default_factory=list)
    runs: dict[str, Run] = field(default_factory=dict)

    def add(self, case: Case, *runs: Run) -> None:
        assert all(c.id != case.id for c in self.cases), f"duplicate case id {case.id}"
        self.cases.append(case)
        for run in runs:
            self.runs[run.key] = run

    def isolated(self, case: Case, *commands: str, args: tuple[str, ...] = (), targets: tuple[str, ...] | None = None,
                 controls: tuple[str, ...] = (), cwd: str = ".", relative: bool = False, fmt: str = "text") -> None:
        """Add ``case`` with one run of its own per command (``targets`` default to its scene)."""
        commands = commands or ("ingest",)
        keys = tuple(f"{case.id}:{cmd.replace(' ', '-')}" for cmd in commands)
        runs = [Run(k, cmd, (case.scene,) if targets is None else targets, controls, args, fmt, cwd=cwd, relative=relative)
                for k, cmd in zip(keys, commands, strict=True)]
        self.add(dataclasses.replace(case, runs=keys), *runs)
