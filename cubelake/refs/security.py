"""Allowed roots: a reference set is untrusted input, so every target it names is checked.

A target is allowed when it lies under one of the roots the *caller* trusts: the reference
file's own folder, the roots of a lake the caller names, and roots the caller passes. Nothing
that arrives with the reference set (a ``lake.json`` beside it, say) adds a root. Local paths are
compared after resolving symlinks and ``..``; ``file://`` URLs are local paths too; a relative
path is resolved against the reference file's folder first (:func:`resolve_url`), so ``..`` cannot
climb out; ``s3://`` targets must be in an allowed bucket and prefix; other schemes are refused
unless a root of the same scheme allows them.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from cubelake.errors import UntrustedTargetError
from cubelake.storage import split_url

__all__ = ["AllowedRoots", "resolve_url", "root_to_allow", "split_url"]


def resolve_url(url: str, base: str) -> str:
    """``url`` with a relative local path made absolute against the folder ``base`` (others unchanged).

    The result is only joined and normalised, not checked: :meth:`AllowedRoots.check` resolves
    symlinks and decides whether it may be read.
    """
    where = split_url(url)[1]
    if "://" in url or os.path.isabs(where):  # a URL (object store or file://) or an absolute path
        return url
    if "://" in base:  # a set on an object store: its relative targets lie beside it there
        b_scheme, rest = base.split("://", 1)
        return f"{b_scheme}://{posixpath.normpath(posixpath.join(rest, where))}"
    return os.path.normpath(os.path.join(base, where))


def root_to_allow(url: str) -> str:
    """The root that would allow one target: its folder (local) or its bucket/prefix folder (S3)."""
    scheme, where = split_url(url)
    if scheme == "file":
        return os.path.dirname(where) or where
    parent = posixpath.dirname(where)
    return f"{scheme}://{parent or where}"


def _literal_key(path: str) -> bool:
    """Whether an object path (``bucket/key``) is checked as written: no ``.``, ``..`` or empty segments.

    An object store takes a key literally — ``other/../prefix/x`` and ``/prefix/x`` are keys outside
    ``prefix/`` — so a path that normalising would move is refused, not normalised.
    """
    return not any(s in ("", ".", "..") for s in path.split("/"))


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
                    f"{refs_path}: target {url!r} is a relative path; resolve it against its reference file's folder (resolve_url) first")
            where = os.path.realpath(where)
        elif not _literal_key(where):
            raise UntrustedTargetError(f"{refs_path}: target {url!r} has '.', '..' or empty segments in its "
                                       "key, which an object store takes literally; refused (name the object "
                                       "by its plain key)")
        if any(r.covers(scheme, where) for r in self._roots):
            return
        allowed = ", ".join(self.roots) or "(none)"
        hint = root_to_allow(where if scheme == "file" else url)
        raise UntrustedTargetError(
            f"{refs_path}: target {url!r} is outside the allowed roots ({allowed}); a reference set is untrusted "
            f"input, and only the caller can widen what it may read. If you trust it, allow that root: "
            f"--allow-root {shlex.quote(hint)} (cubelake refs check) or allowed_roots=[{hint!r}] (Python); for a set "
            "kept in a lake whose allowed roots hold the target, name the lake: --lake LAKE (lake=LAKE in Python)")
