"""BLAKE3 of files and folder trees: what scene records hold for every product (copy verifies against them)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["file_blake3", "tree_blake3"]


def file_blake3(path: Path) -> str:
    """The BLAKE3 of one file, read in 8 MiB blocks."""
    from blake3 import blake3

    h = blake3()
    with open(path, "rb") as f:
        while block := f.read(8 * 1024 * 1024):
            h.update(block)
    return h.hexdigest()


def tree_blake3(root: Path) -> str:
    """One BLAKE3 over a directory: each file's relative path, size and BLAKE3, in path order."""
    from blake3 import blake3

    h = blake3()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0{file_blake3(p)}\n".encode())
    return h.hexdigest()
