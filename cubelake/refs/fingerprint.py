"""A cheap, mtime-independent fingerprint of a referenced local file.

A copied or moved lake (``cp -r``, ``rsync`` without ``-t``, a restore from backup) gives every
file a new mtime, so the mtime alone cannot tell a changed target from a copied one. The
fingerprint is BLAKE3 over the size and the first and last 64 KiB. Not over the whole file: it
is checked whenever a reference set is opened and the mtime differs, and hashing every target
in full (gigabytes per scene) would make opening a copied lake as slow as reading all of it. The
ends are where a rewrite shows: a TIFF's header and tile tables (offsets and byte counts) sit
at the start of a COG and GDAL appends changed tiles at the end, so with the size unchanged a
rewritten tile moves the tables or the tail. An in-place overwrite of bytes in the middle that
keeps the size is not seen; the full BLAKE3 the ingest records for its COG covers that case.
"""

from __future__ import annotations

import os

__all__ = ["FINGERPRINT_SPAN", "file_fingerprint"]

FINGERPRINT_SPAN = 64 * 1024
_PREFIX = "blake3-ends64k:"


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """``blake3-ends64k:<hex>`` of the file's size, first and last 64 KiB (the whole file when smaller)."""
    from blake3 import blake3

    h = blake3()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(size.to_bytes(8, "little"))
        h.update(f.read(FINGERPRINT_SPAN))
        if size > FINGERPRINT_SPAN:
            f.seek(max(FINGERPRINT_SPAN, size - FINGERPRINT_SPAN))
            h.update(f.read(FINGERPRINT_SPAN))
    return _PREFIX + h.hexdigest()
