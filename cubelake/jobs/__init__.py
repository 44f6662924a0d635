"""Scheduled preprocessing jobs: manifests run idempotently on Dask distributed.

>>> from cubelake.jobs import load_manifest, run_job
>>> record = run_job(load_manifest("manifests/demo.yaml"))          # a LocalCluster
>>> record = run_job(manifest, scheduler="tcp://10.0.0.5:8786")     # an existing cluster
"""

from __future__ import annotations

from .ledger import JobBusyError, Ledger
from .runner import JobEvent, SchedulerError, run_job
from .schedule import is_due, manifest_files
from .spec import MANIFEST_VERSION, Manifest, load_manifest

__all__ = ["MANIFEST_VERSION", "JobBusyError", "JobEvent", "Ledger", "Manifest", "SchedulerError", "is_due",
           "load_manifest", "manifest_files", "run_job"]
