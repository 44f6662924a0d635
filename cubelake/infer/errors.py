"""Errors of the inference tools (each names the file or setting, what is wrong and how to fix it)."""

from __future__ import annotations

from cubelake.errors import CubelakeError

__all__ = ["InferError", "ModelError"]


class InferError(CubelakeError, ValueError):
    """A prediction or sweep that cannot run as asked."""


class ModelError(InferError):
    """A model file cubelake cannot load or run (names the file, what is wrong, and what to do)."""
