"""Run the real CLI on the corpus and judge what it did, input by input.

Each run is ``cubelake ...`` in a process of its own session (forked from the test zygote, see
``tests/zygote.py``, or cold with ``CUBELAKE_TEST_COLD_CLI=1``), with a memory
limit (``RLIMIT_AS``) and a wall-clock timeout; its exit code, stdout, stderr, peak RSS and lake
are kept. ``problems(case, result)`` lists everything that is wrong for one input: a hang, a
traceback, a memory blow-up, the input not named (or named with raw control characters), the
wrong outcome or exit code, a partial product, a rejection without a report.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import zygote

from .model import Case, Expect, Run

__all__ = ["MEMORY_LIMIT", "RSS_LIMIT_KIB", "Entry", "LakeState", "Result", "Runner", "Trace", "completed", "display",
           "entry_for", "input_tracebacks", "lake_state", "problems", "run_problems", "shown", "tracebacks"]

MEMORY_LIMIT = 4 * 1024**3  # address space of each CLI process
RSS_LIMIT_KIB = 1536 * 1024  # peak resident memory allowed (the real scenes need ~350 MiB)
_TRACEBACK = "Traceback (most recent call last)"
_BUG = ("this is a cubelake bug", "please report it")

#: Runs the CLI exactly as ``python -m cubelake.cli`` does, after setting the limits, and
#: records the peak RSS (even when the command exits with an error).
_WRAPPER = """
import resource, runpy, sys
limit, rss_file = int(sys.argv.pop(1)), sys.argv.pop(1)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.argv[0] = "cubelake"
try:
    runpy.run_module("cubelake.cli", run_name="__main__", alter_sys=True)
finally:
    with open(rss_file, "w") as f:
        f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
"""


@dataclass
class Result:
    run: Run
    argv: list[str]
    rc: int | None
    out: str  # stdout and stderr, decoded (invalid UTF-8 as \\x escapes)
    stdout: str
    seconds: float
    timed_out: bool
    rss_kib: int | None
    lake: Path | None
    doc: Any = None  # parsed stdout of a --format json run
    doc_error: str | None = None

    def command_line(self) -> str:
        return "cubelake " + " ".join(repr(a) if not a.isprintable() or " " in a else a for a in self.argv)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUBELAKE_") and k not in ("PYTHONIOENCODING",)}
    env.update(LC_ALL="C.UTF-8", LANG="C.UTF-8", NO_COLOR="1", TERM="dumb", COLUMNS="240", PYTHONDONTWRITEBYTECODE="1")
    return env


def _argv(run: Run, root: Path, real: Path, lake: Path | None) -> list[str]:
    targets = list(run.targets) if run.relative else [str(root / t) for t in run.targets]
    targets += [str(real / c) for c in run.controls]
    args = [a.replace("{root}", str(root)) for a in run.args]
    if run.command == "ingest":
        assert lake is not None
        fmt = ["--format", "json"] if run.fmt == "json" else []
        return ["ingest", "--lake", str(lake), *fmt, *args, *targets]
    return [*run.command.split(), *args, *targets]


def _start(argv: list[str], rss_path: str, cwd: Path) -> subprocess.Popen[bytes] | zygote.WarmProcess:
    """The CLI under the wrapper, in its own session: forked from the zygote without torch (a ``cubelake``
    command's imports done, nothing more resident), or cold with ``CUBELAKE_TEST_COLD_CLI=1``."""
    args = [str(MEMORY_LIMIT), rss_path, *argv]
    if zygote.cold():
        return subprocess.Popen([sys.executable, "-c", _WRAPPER, *args], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    return zygote.WarmProcess(args, env=_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              code=_WRAPPER, light=True)


def execute(run: Run, root: Path, real: Path, lakes: Path) -> Result:
    """Run one CLI process; kill its whole session if it outlives ``run.timeout``."""
    lake = lakes / run.key.replace(":", "__") / "lake" if run.command == "ingest" else None
    argv = _argv(run, root, real, lake)
    with tempfile.NamedTemporaryFile("r", suffix=".rss", delete=False) as rss:
        rss_path = rss.name
    t0 = time.monotonic()
    proc = _start(argv, rss_path, root / run.cwd)
    timed_out = False
    try:
        raw_out, raw_err = proc.communicate(timeout=run.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        raw_out, raw_err = proc.communicate()
    seconds = time.monotonic() - t0
    stdout = raw_out.decode("utf-8", "backslashreplace")
    stderr = raw_err.decode("utf-8", "backslashreplace")
    rss_text = Path(rss_path).read_text().strip()
    os.unlink(rss_path)
    result = Result(run, argv, None if timed_out else proc.returncode, stdout + "\n" + stderr, stdout, seconds,
                    timed_out, int(rss_text) if rss_text else None, lake)
    if run.fmt == "json" and not timed_out:
        try:
            result.doc = json.loads(raw_out.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            result.doc_error = f"{type(exc).__name__}: {exc}"
    return result


class Runner:
    """Runs each CLI run once per session, two at a time (the machine has two cores)."""

    def __init__(self, runs: dict[str, Run], root: Path, real: Path, lakes: Path, workers: int = 2) -> None:
        self._runs, self._root, self._real, self._lakes = runs, root, real, lakes
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="corpus")
        self._futures: dict[str, Future[Result]] = {}

    def prefetch(self, keys: list[str]) -> None:
        """Start ``keys`` now, longest runs (batches) first."""
        for key in sorted(set(keys), key=lambda k: (not self._runs[k].batch, k)):
            self._submit(key)

    def _submit(self, key: str) -> Future[Result]:
        if key not in self._futures:
            self._futures[key] = self._pool.submit(execute, self._runs[key], self._root, self._real, self._lakes)
        return self._futures[key]

    def get(self, key: str) -> Result:
        return self._submit(key).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# -- reading the output ------------------------------------------------------------------------


def _unsafe(ch: str) -> bool:
    return not ch.isprintable()


def display(case: Case, run: Run, root: Path) -> str:
    """The input's path as the CLI is expected to show it (before any escaping)."""
    if run.relative:
        return next(t for t in run.targets if t != "--")
    return str(root / case.scene)


def shown(text: str) -> re.Pattern[str]:
    """A pattern for ``text`` as printed safely: control characters and undecodable bytes shown as
    some escape (``\\n``, ``?``, ``\\xe9`` ...), never raw, on one line."""
    parts = re.split(r"([^\S ]|[\x00-\x1f\x7f-\x9f]|[\ud800-\udfff])", text)
    pattern = ""
    for i, part in enumerate(parts):
        pattern += re.escape(part) if i % 2 == 0 else r"[^\n]{0,16}?"
    return re.compile(pattern)


@dataclass
class Entry:
    """What one run said about one input."""

    outcome: str  # ingested / unchanged / rejected / failed (ingest), ok / rejected (validate)
    text: str  # every message about it (errors and warnings included)
    errors: int
    warnings: str
    path: str | None = None


_HEAD = re.compile(r"^(ingested|unchanged|rejected|failed|ok)\s+(.*)$")


def text_entries(output: str) -> list[tuple[Entry, str]]:
    """``(entry, head line)`` for each scene block of a text ingest/validate report."""
    out: list[tuple[Entry, str]] = []
    lines = output.split("\n")
    for i, line in enumerate(lines):
        m = _HEAD.match(line)
        if not m:
            continue
        body = []
        for nxt in lines[i + 1:]:
            if not nxt.startswith(" "):
                break
            body.append(nxt)
        text = "\n".join([line, *body])
        warnings = "\n".join(b for b in body if b.strip().startswith("warning:"))
        errors = sum(b.strip().startswith("error:") for b in body)
        out.append((Entry(m.group(1), text, errors, warnings), line))
    return out


def json_entries(doc: Any) -> list[Entry]:
    out = []
    for r in doc.get("results", []) if isinstance(doc, dict) else []:
        errors = r.get("errors") or []
        warnings = r.get("warnings") or []
        text = "\n".join([str(r.get("message", "")), *(f"{i.get('code')}: {i.get('message')} {i.get('where') or ''}"
                                                        for i in [*errors, *warnings])])
        wtext = "\n".join(f"{i.get('code')}: {i.get('message')} {i.get('where') or ''}" for i in warnings)
        out.append(Entry(str(r.get("outcome")), text, len(errors), wtext, path=r.get("path")))
    return out


def entry_for(path: str, result: Result) -> list[Entry]:
    """Every entry the run printed for ``path`` (exact path in JSON; safely shown path in text)."""
    if result.run.fmt == "json":
        return [e for e in json_entries(result.doc) if e.path == path]
    pat = re.compile(shown(path).pattern + r"(?=  |$)")
    return [e for e, head in text_entries(result.stdout) if pat.search(head)]


# -- the lake ----------------------------------------------------------------------------------


@dataclass
class LakeState:
    scenes: dict[str, Path] = field(default_factory=dict)  # source path -> scene folder
    incomplete: list[str] = field(default_factory=list)
    staging: list[str] = field(default_factory=list)
    rejected: dict[str, Path] = field(default_factory=dict)  # source path -> report

    def sources(self, scene: Path) -> list[str]:
        rec = json.loads((scene / "scene.json").read_text())
        return [str(f["path"]) for f in rec.get("source", {}).get("files", [])]


def _complete(scene: Path) -> str | None:
    """Why a published scene folder is not complete, or None."""
    try:
        rec = json.loads((scene / "scene.json").read_text())
        json.loads((scene / "item.json").read_text())
        json.loads((scene / "validation.json").read_text())
    except (OSError, ValueError) as exc:
        return f"{scene.name}: scene.json/item.json/validation.json missing or unreadable ({exc})"
    for kind, info in rec.get("products", {}).items():
        p = scene / info["path"]
        if not p.exists():
            return f"{scene.name}: product {kind} {p.name} missing"
        if p.is_file() and "bytes" in info and p.stat().st_size != info["bytes"]:
            return f"{scene.name}: product {kind} is {p.stat().st_size} bytes, scene.json says {info['bytes']}"
        if kind == "zarr" and not (p / "zarr.json").is_file():
            return f"{scene.name}: Zarr product without zarr.json"
    return None


def lake_state(lake: Path) -> LakeState:
    state = LakeState()
    if not lake.is_dir():
        return state
    for d in sorted((lake / "scenes").iterdir()) if (lake / "scenes").is_dir() else []:
        why = _complete(d)
        if why:
            state.incomplete.append(why)
            continue
        src = json.loads((d / "scene.json").read_text()).get("source", {}).get("path")
        state.scenes[str(src)] = d
    staging = lake / ".staging"
    state.staging = sorted(p.name for p in staging.iterdir()) if staging.is_dir() else []
    for p in sorted((lake / "rejected").glob("*.json")) if (lake / "rejected").is_dir() else []:
        try:
            src = json.loads(p.read_text()).get("source", {}).get("path")
        except (OSError, ValueError):
            continue
        state.rejected[str(src)] = p
    return state


# -- judging -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """One printed traceback: the exception it ends in, and the lines just before it (the log line)."""

    last: str
    before: str


def tracebacks(out: str) -> list[Trace]:
    """Every traceback in ``out`` (chained ones as one, ending in the last exception)."""
    lines = out.split("\n")
    found: list[Trace] = []
    i = 0
    while i < len(lines):
        if _TRACEBACK not in lines[i]:
            i += 1
            continue
        before = "\n".join(lines[max(0, i - 3): i])
        last, i = _traceback_end(lines, i)
        found.append(Trace(last, before))
    return found


def _traceback_end(lines: list[str], i: int) -> tuple[str, int]:
    """The exception line of the traceback whose header is ``lines[i]``, and the line after it."""
    col = lines[i].index(_TRACEBACK)
    last = lines[i].strip()
    j = i + 1
    while j < len(lines):
        rel = lines[j][col:] if len(lines[j]) > col else lines[j].strip()
        j += 1
        if not rel.strip() or rel.startswith(" ") or rel.startswith(_TRACEBACK):
            continue
        if rel.startswith(("During handling of the above", "The above exception was")):
            continue
        last = rel.strip()
        nxt = next((ln[col:] for ln in lines[j:] if ln[col:].strip()), "")
        if not nxt.startswith(("During handling of the above", "The above exception was")):
            break
    return last, j


def completed(result: Result) -> bool:
    """Whether the command got to report its inputs (a batch whose process crashed did not)."""
    if result.timed_out:
        return False
    if result.run.fmt == "json":
        return result.doc is not None
    if result.run.command in ("ingest", "validate") and result.run.batch:
        return re.search(r"^\d+ scene\(s\):", result.stdout, re.MULTILINE) is not None
    return True


def _about(trace: Trace, paths: list[str]) -> bool:
    return any(shown(p).search(trace.before) for p in paths)


def run_problems(result: Result, members: list[str] | None = None) -> list[str]:
    """What is wrong with the run as a whole (every input of it shares these).

    In a batch that completed, a traceback logged right after a line naming one of ``members``
    is that input's problem (see :func:`input_tracebacks`), not the run's.
    """
    run, out = result.run, result.out
    if result.timed_out:
        return [f"hangs: no exit after {run.timeout:.0f} s (killed)"]
    found = []
    traces = tracebacks(out)
    if run.batch and not completed(result) and traces:
        after = f", printed after {traces[-1].before.strip()[-300:]!r}" if traces[-1].before.strip() else ""
        found.append(f"the whole run crashed (no report for any input): traceback ending in {traces[-1].last!r}{after}")
    elif run.batch and not completed(result):
        found.append(f"the whole run stopped without a report (exit {result.rc})")
    else:
        loose = [t for t in traces if not (run.batch and members and _about(t, members))]
        found += [f"prints a traceback ending in {t.last!r}" for t in loose]
    bug = next((n for n in _BUG if n in out), None)
    if not run.batch and bug:
        line = next(ln for ln in out.split("\n") if bug in ln)
        found.append(f"says {bug!r}: {line.strip()[:300]!r}")
    if "MemoryError" in out or "ran out of memory" in out or result.rc in (-signal.SIGKILL, 137):
        found.append(f"memory blow-up (exit {result.rc}, limit {MEMORY_LIMIT // 1024**3} GiB address space)")
    elif result.rc is not None and result.rc < 0:
        found.append(f"killed by signal {-result.rc}")
    if result.rss_kib is not None and result.rss_kib > RSS_LIMIT_KIB:
        found.append(f"peak RSS {result.rss_kib // 1024} MiB over {RSS_LIMIT_KIB // 1024} MiB")
    if run.fmt == "json" and result.doc_error:
        found.append(f"--format json stdout is not JSON ({result.doc_error})")
    return found


def input_tracebacks(path: str, result: Result) -> list[str]:
    """Tracebacks a completed batch printed about the input at ``path``."""
    if not result.run.batch or not completed(result):
        return []
    return [f"prints a traceback for it ending in {t.last!r}" for t in tracebacks(result.out) if _about(t, [path])]


def _source_keys(case: Case, root: Path) -> set[str]:
    p = root / case.scene
    keys = {str(p), os.path.abspath(p)}
    with contextlib.suppress(OSError, RuntimeError):  # a symlink loop
        keys.add(str(p.resolve()))
    return keys


def _lake_problems(case: Case, result: Result, root: Path, accepted: bool) -> list[str]:
    if result.lake is None:
        return []
    state = lake_state(result.lake)
    keys = _source_keys(case, root)
    found = [f"partial product: .staging holds {state.staging}"] if state.staging else []
    found += [f"partial product: {why}" for why in state.incomplete]
    scene = next((state.scenes[k] for k in keys if k in state.scenes), None)
    if accepted:
        if scene is None:
            found.append("reported ingested, but no complete scenes/<id> for it in the lake")
        elif case.confine:
            home = os.path.realpath((root / case.scene).parent)
            outside = [s for s in state.sources(scene) if not os.path.realpath(s).startswith(home + os.sep)]
            if outside:
                found.append(f"ingested source files outside the input's folder: {outside}")
    else:
        if scene is not None:
            found.append(f"rejected, yet a scene is published for it: {scene}")
        if not any(k in state.rejected for k in keys):
            found.append("rejected, but no report in rejected/ names it")
    return found


def scrub(text: str, case: Case, result: Result, root: Path) -> str:
    """``text`` without the input's paths and name, so that a ``mention`` must be in the message
    itself (a file named ``..._wavelength_nonnumeric.hdr`` names no field)."""
    text = re.sub(re.escape(str(root)) + r"\S*", "<path>", text)
    if result.lake is not None:
        text = re.sub(re.escape(str(result.lake.parent.parent)) + r"\S*", "<path>", text)
    name = Path(display(case, result.run, root)).name
    for part in (name, name.rsplit(".", 1)[0]):
        text = re.sub(re.escape(part), "<name>", text, flags=re.IGNORECASE)
    return text


def _outcome_problems(case: Case, result: Result, entry: Entry, root: Path) -> tuple[list[str], bool | None]:
    """Problems with the reported outcome; and whether the input counts as accepted (None: failed)."""
    mention = re.compile(case.mention, re.IGNORECASE) if case.mention else None
    accepted = entry.outcome in ("ingested", "ok", "unchanged")
    rejected = entry.outcome == "rejected"
    found: list[str] = []
    if not (accepted or rejected):
        return [f"outcome {entry.outcome!r}: {entry.text[:400]!r}"], None
    if case.expect is Expect.OK and not accepted:
        found.append(f"a sound input was rejected: {entry.text[:400]!r}")
    if case.expect is Expect.REJECT and accepted:
        found.append(f"accepted although {case.what}: {entry.text[:300]!r}")
    warnings, said = scrub(entry.warnings, case, result, root), scrub(entry.text, case, result, root)
    if case.expect is Expect.REJECT_OR_WARN and accepted and not (mention and mention.search(warnings)):
        found.append(f"accepted without a warning matching /{case.mention}/ although {case.what}: "
                     f"warnings {entry.warnings[:300]!r}")
    if rejected and case.expect in (Expect.REJECT, Expect.REJECT_OR_WARN):
        if entry.errors == 0:
            found.append("rejected without any error listed")
        if mention and not mention.search(said):
            found.append(f"the rejection does not name /{case.mention}/: {entry.text[:400]!r}")
    if rejected and result.rc != 1 and case.expect is not Expect.OK:
        found.append(f"exit code {result.rc} for a rejected input (expected 1)")
    if accepted and case.expect is Expect.OK and not result.run.batch and result.rc != 0:
        found.append(f"exit code {result.rc} for a sound input alone (expected 0)")
    return found, accepted


def _whole_run_problems(case: Case, result: Result, root: Path) -> list[str]:
    """USAGE / REFUSE / refs check: judged by exit code and output, not per-scene entries."""
    name = shown(Path(display(case, result.run, root)).name)
    found = []
    ok = case.expect is Expect.OK or (case.expect is Expect.ROBUST and result.rc == 0)
    if case.expect is Expect.USAGE and result.rc != 2:
        found.append(f"exit code {result.rc}, expected 2 (usage error)")
    if case.expect is Expect.REFUSE and result.rc not in (1, 2):
        found.append(f"exit code {result.rc}, expected 1 (refused)")
    if case.expect is Expect.ROBUST and result.rc not in (0, 1):
        found.append(f"exit code {result.rc}, expected 0 or 1")
    if case.expect is Expect.OK and result.rc != 0:
        found.append(f"exit code {result.rc} for a sound input (expected 0)")
    if not ok and not name.search(result.out):
        found.append(f"the output never names {Path(display(case, result.run, root)).name!r}")
    if not ok and case.mention and not re.search(case.mention, scrub(result.out, case, result, root), re.IGNORECASE):
        found.append(f"the message does not name /{case.mention}/")
    if result.lake is not None and lake_state(result.lake).scenes:
        found.append(f"scenes were published although the run was refused: {sorted(lake_state(result.lake).scenes)}")
    return found


def problems(case: Case, result: Result, root: Path, members: list[str] | None = None) -> list[str]:
    """Everything wrong with what ``result``'s run did for ``case`` (empty: all holds).

    ``members``: the displayed paths of every input of the run (to tell whose traceback is whose).
    """
    shown_path = display(case, result.run, root)
    found = run_problems(result, members or [shown_path])
    if not completed(result):
        return found
    found += input_tracebacks(shown_path, result)
    raw = any(_unsafe(ch) for ch in shown_path) and shown_path in result.out
    if raw:
        found.append(f"prints the file name raw, control characters included: {shown_path!r}")
    for text in case.forbid:
        if text in result.out:
            found.append(f"echoes {text!r} (content of a file the input points at)")
    if case.expect in (Expect.USAGE, Expect.REFUSE) or result.run.command == "refs check":
        return found + _whole_run_problems(case, result, root)
    if result.doc_error or (result.run.fmt == "json" and result.doc is None):
        return found
    entries = entry_for(shown_path, result)
    if not entries and raw:
        return found  # reported, but only with the raw name: its lines cannot be told apart
    if len(entries) != 1:
        what = "never names it (not reported)" if not entries else f"reports it {len(entries)} times"
        return [*found, f"{result.run.command} {what}"]
    if result.run.batch:
        bug = next((n for n in _BUG if n in entries[0].text), None)
        found += [f"says {bug!r}: {entries[0].text[:300]!r}"] if bug else []
    outcome, accepted = _outcome_problems(case, result, entries[0], root)
    found += outcome
    if accepted is not None and result.run.command == "ingest":
        found += _lake_problems(case, result, root, accepted)
    return found
