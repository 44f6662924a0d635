"""The malformed-input corpus through the real CLI: no traceback, no hang, no partial product, named.

Every input of ``tests/corpus`` (derived from the real scenes: truncations, byte flips, bomb
headers, bad ENVI headers/GeoTIFF tags/MTLs/YAML profiles/reference sets, special files, odd
names) is one test per command that covers it. Batches also prove that one bad input never
stops the others: the good real scenes in each batch must be ingested, every input reported
exactly once, and the lake left with complete scenes only.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter
from pathlib import Path

import pytest

from .conftest import CORPUS
from .generate import materialize
from .harness import (
    Result,
    Runner,
    completed,
    display,
    entry_for,
    json_entries,
    lake_state,
    problems,
    run_problems,
    text_entries,
)
from .model import Case, Corpus, Expect
from .ops import remove_special_files

_PARAMS = [pytest.param(case, key, id=f"{case.id}-{CORPUS.runs[key].command.replace(' ', '-')}")
           for case in CORPUS.cases for key in case.runs]
_BATCHES = sorted(k for k, r in CORPUS.runs.items() if r.batch)


def _report(case: Case, result: Result, root: Path, found: list[str]) -> str:
    shown = display(case, result.run, root)
    entries = [] if result.timed_out or result.doc_error else entry_for(shown, result)
    detail = "\n".join(e.text for e in entries) if entries else "\n".join(result.out.strip().split("\n")[-25:])
    rss = f"{result.rss_kib // 1024} MiB" if result.rss_kib else "?"
    lines = [f"{case.id}: {case.what}", f"  input:  {shown!r} (expect {case.expect})",
             f"  run:    {result.command_line()}"[:600],
             f"  result: exit {result.rc}, {result.seconds:.1f} s, peak RSS {rss}", "  problems:",
             *(f"   - {p}" for p in found), "  output about it:", *("    " + ln for ln in detail.split("\n"))]
    return "\n".join(lines)


@pytest.mark.timeout(300)  # the first case of a command runs the whole batch (~45 s alone)
@pytest.mark.integration
@pytest.mark.parametrize(("case", "run_key"), _PARAMS)
def test_malformed_input(case: Case, run_key: str, corpus_runs: Runner, corpus_root: Path) -> None:
    result = corpus_runs.get(run_key)
    run = CORPUS.runs[run_key]
    members = [display(c, run, corpus_root) for c in CORPUS.cases if run_key in c.runs]
    found = problems(case, result, corpus_root, members)
    assert not found, _report(case, result, corpus_root, found)


def _batch_members(key: str, root: Path, real: Path) -> tuple[list[str], list[str]]:
    run = CORPUS.runs[key]
    members = [display(c, run, root) for c in CORPUS.cases if key in c.runs]
    return members, [str(real / c) for c in run.controls]


@pytest.mark.parametrize("batch_key", _BATCHES)
def test_batch_reports_every_input_once_and_still_ingests_the_good_scenes(
        batch_key: str, corpus_runs: Runner, corpus_root: Path, real: Path) -> None:
    result = corpus_runs.get(batch_key)
    members, controls = _batch_members(batch_key, corpus_root, real)
    assert not run_problems(result, members), f"{result.command_line()}: {run_problems(result, members)}"
    if result.run.fmt == "json":
        reported = Counter(e.path for e in json_entries(result.doc))
        extra = sorted(p for p in reported if p not in set(members) | set(controls))
    else:
        reported = Counter({p: len(entry_for(p, result)) for p in [*members, *controls]})
        extra = [head for _, head in text_entries(result.stdout)][: max(0, len(text_entries(result.stdout))
                                                                         - sum(reported.values()))]
    missing = [p for p in members + controls if reported[p] == 0]
    twice = [p for p in members + controls if reported[p] > 1]
    assert not missing, f"never reported: {missing}"
    assert not twice, f"reported twice: {twice}"
    assert not extra, f"reported, but not an input: {extra}"
    for control in controls:
        (entry,) = entry_for(control, result)
        assert entry.outcome in ("ingested", "ok"), f"good scene {control} was not ingested: {entry.text}"
    assert result.rc == 1, f"exit code {result.rc}; expected 1 (some inputs rejected, the good ones ingested)"


@pytest.mark.parametrize("batch_key", [k for k in _BATCHES if CORPUS.runs[k].command == "ingest"])
def test_batch_leaves_only_complete_scenes_of_accepted_inputs(batch_key: str, corpus_runs: Runner, corpus_root: Path,
                                                              real: Path) -> None:
    result = corpus_runs.get(batch_key)
    assert result.lake is not None
    assert not result.timed_out, f"{result.command_line()} hangs"
    state = lake_state(result.lake)
    assert not state.staging, f"leftovers in .staging: {state.staging}"
    assert not state.incomplete, f"incomplete scenes: {state.incomplete}"
    if not completed(result):
        return  # a crashed run reports nothing to compare with (test_batch_reports_... fails for it)
    _, controls = _batch_members(batch_key, corpus_root, real)
    accepted = {e.path for e in json_entries(result.doc) if e.outcome == "ingested"} if result.doc else set()
    allowed = {os.path.realpath(p) for p in accepted} | {os.path.realpath(p) for p in controls}
    stray = sorted(src for src in state.scenes if src not in allowed)
    assert not stray, f"scenes published for inputs not reported as ingested: {stray}"


def test_corpus_has_every_category_and_over_a_hundred_inputs(corpus: Corpus) -> None:
    by_category = Counter(c.category for c in corpus.cases)
    assert len(corpus.cases) >= 100, by_category
    for category, at_least in {"tiff": 40, "envi": 20, "mat": 15, "landsat": 20, "special": 10, "names": 10,
                               "bombs": 6, "profiles": 8, "refs": 10}.items():
        assert by_category[category] >= at_least, (category, by_category)
    assert len({c.id for c in corpus.cases}) == len(corpus.cases)
    expects = Counter(c.expect for c in corpus.cases)
    assert expects[Expect.REJECT] >= 100, expects
    assert expects[Expect.OK] >= 5, expects


def _fingerprint(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*files, *dirs]:
            p = Path(dirpath) / name
            rel = os.fsencode(p.relative_to(root)).hex()
            mode = p.lstat().st_mode
            if stat.S_ISLNK(mode):
                out[rel] = "link:" + os.readlink(p).replace(str(root), "<root>")
            elif stat.S_ISREG(mode):
                data = p.read_bytes().replace(os.fsencode(root), b"<root>")
                out[rel] = hashlib.sha256(data).hexdigest()
            else:
                out[rel] = f"mode:{stat.S_IFMT(mode)}"
    return out


@pytest.mark.integration
def test_corpus_generation_is_deterministic_and_small(corpus: Corpus, real: Path, tmp_path: Path) -> None:
    """Two generations give the same files (paths inside them aside), in a few tens of MiB."""
    first, second = tmp_path / "a", tmp_path / "b"
    try:
        materialize(corpus, first, real)
        materialize(corpus, second, real)
        a, b = _fingerprint(first), _fingerprint(second)
    finally:
        remove_special_files(tmp_path)
    assert a.keys() == b.keys()
    differ = [os.fsdecode(bytes.fromhex(k)) for k in a if a[k] != b[k]]
    assert not differ, f"files differ between two generations: {differ}"
    size = sum(p.stat().st_size for p in first.rglob("*") if p.is_file() and not p.is_symlink())
    assert size < 40 * 1024**2, f"the corpus takes {size / 1024**2:.0f} MiB"
