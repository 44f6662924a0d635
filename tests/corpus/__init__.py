"""A generated malformed-input corpus, run through the real CLI (issue 11, "What it must show").

* ``model.py``: a Case (input, runs, what must hold) and a Run (one CLI process);
* ``ops.py``: byte-level damage (truncate, flip, rewrite TIFF tags, special files);
* ``cases_*.py``: the inputs, by family, each derived from a file of ../shared/data/real;
* ``generate.py``: every case and run; ``python -m tests.corpus.generate DIR`` writes and lists them;
* ``harness.py``: runs ``python -m cubelake.cli`` (memory limit, timeout) and judges each input;
* ``test_malformed_corpus.py``: one test per input and command, plus per-batch tests;
* ``diagnose.py``: ``python -m tests.corpus.diagnose [ID ...]`` runs inputs alone (which one breaks a batch).

Run: ``.venv/bin/python -m pytest tests/corpus -q`` (about two minutes on two cores).
"""
