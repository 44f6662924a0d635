"""``-m "not s3"`` leaves out exactly the tests that need the S3-protocol server, however they get it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/loaders/test_dataset.py", "tests/loaders/test_open_faults.py", "tests/test_object_lake.py",
         "tests/test_storage.py", "tests/test_readme.py"]
NEEDS_S3 = [  # directly, through s3_bucket / s3_products, and through a README section's s3_env
    "tests/loaders/test_dataset.py::test_zarr_over_s3",
    "tests/loaders/test_open_faults.py::test_a_missing_product_is_not_asked_again",
    "tests/test_object_lake.py::test_conditional_puts_on_the_commit_object",
    "tests/test_storage.py::test_missing_bucket_is_named",
    "sh-emulating-a-link]",  # a README block's id starts with its line number
]
LOCAL = ["tests/loaders/test_dataset.py::test_dataloader_workers_split_chunks_and_cover_the_epoch",
         "tests/test_readme.py::test_every_kind_of_block_is_covered"]


def _collected(marker: str) -> set[str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                          marker, *FILES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return {ln.strip() for ln in res.stdout.splitlines() if "::" in ln}


def test_s3_marker_follows_the_server_fixture() -> None:
    with_s3, without = _collected("s3"), _collected("not s3")
    assert not with_s3 & without
    for test_id in NEEDS_S3:
        assert any(t.endswith(test_id) for t in with_s3), test_id
    for test_id in LOCAL:
        assert test_id in without, test_id
