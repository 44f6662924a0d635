"""Allowed roots: a reference set is untrusted input, so every target it names is checked.

A target is allowed when it lies under one of the roots: the lake (or the reference file's own
folder outside a lake), plus roots the user allows explicitly. Local paths are compared after
resolving symlinks and ``..``; ``file://`` URLs are local paths too; ``s3://`` targets must be in
an allowed bucket and prefix; relative paths and other schemes are refused unless a root of the
same scheme allows them.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from cubelake.errors import UntrustedTargetError

__all__ = ["AllowedRoots", "split_url"]


def split_url(url: str) -> tuple[str, str]:
    """``(scheme, rest)``: ``("file", absolute path)`` for local targets, else e.g. ``("s3", "bucket/key")``."""
    if "://" not in url:
        return "file", url
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return "file", "//" + parts.netloc + unquote(parts.path)  # a UNC-style host: never under a local root
        return "file", unquote(parts.path)
    return scheme, parts.netloc + parts.path


def _norm_key(path: str) -> str | None:
    """An object key without ``.``/``..`` segments or empty segments; ``None`` if it tries to climb."""
    segs = path.split("/")
    if any(s in (".", "..") for s in segs):
        return None
    return path


@dataclass(frozen=True, slots=True)
class _Root:
    scheme: str
    where: str  # real local path, or "bucket/prefix"

    def covers(self, scheme: str, where: str) -> bool:
        if scheme != self.scheme:
            return False
        if scheme == "file":
            return where == self.where or where.startswith(self.where.rstrip(os.sep) + os.sep)
        root = self.where.rstrip("/")
        return where == root or where.startswith(root + "/")


class AllowedRoots:
    """Roots under which reference targets may lie."""

    def __init__(self, roots: Iterable[str]) -> None:
        self._roots: list[_Root] = []
        for r in roots:
            scheme, where = split_url(str(r))
            if scheme == "file":
                where = os.path.realpath(os.path.expanduser(where))
            self._roots.append(_Root(scheme, where))

    @property
    def roots(self) -> list[str]:
        return [r.where if r.scheme == "file" else f"{r.scheme}://{r.where}" for r in self._roots]

    def check(self, url: str, *, refs_path: str = "the reference set") -> None:
        """Raise :class:`UntrustedTargetError` unless ``url`` lies under an allowed root."""
        scheme, where = split_url(url)
        if scheme == "file":
            if not os.path.isabs(where):
                raise UntrustedTargetError(
                    f"{refs_path}: target {url!r} is a relative path; references must name absolute paths or URLs")
            where = os.path.realpath(where)
        else:
            key = _norm_key(where)
            if key is None:
                raise UntrustedTargetError(f"{refs_path}: target {url!r} has '.'/'..' segments; refused")
            where = posixpath.normpath(key) if key else key
        if any(r.covers(scheme, where) for r in self._roots):
            return
        allowed = ", ".join(self.roots) or "(none)"
        raise UntrustedTargetError(
            f"{refs_path}: target {url!r} is outside the allowed roots ({allowed}); a reference set is untrusted "
            "input. If you trust it, allow that root explicitly (allowed_roots=[...] in Python, --allow-root on the "
            "command line, or `cubelake refs allow ROOT --lake LAKE` for a lake)")
