"""The corpus is written once per session; its CLI runs start together, two at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .generate import build_corpus, materialize
from .harness import Runner
from .model import Corpus
from .ops import remove_special_files

CORPUS: Corpus = build_corpus()


@pytest.fixture(scope="session")
def corpus() -> Corpus:
    return CORPUS


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory: pytest.TempPathFactory, real: Path) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("corpus")
    materialize(CORPUS, root, real)
    yield root
    remove_special_files(root)


@pytest.fixture(scope="session")
def corpus_runs(request: pytest.FixtureRequest, corpus_root: Path, real: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    """Runs every CLI run the selected tests need, longest first, as soon as the first one asks."""
    runner = Runner(CORPUS.runs, corpus_root, real, tmp_path_factory.mktemp("corpus_lakes"))
    keys = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        keys += [params[k] for k in ("run_key", "batch_key") if k in params]
    runner.prefetch(keys)
    yield runner
    runner.close()
