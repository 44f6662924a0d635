"""YAML from untrusted files, bounded before anything is built.

``yaml.safe_load`` refuses arbitrary Python objects but not size: a few lines of anchors and
aliases (a "billion laughs" bomb) expand into a structure that is small in memory, because
aliases share objects, and huge as soon as anything copies or serialises it (a profile's
``stac.properties`` goes into every item). Deep nesting makes PyYAML's recursive constructor
raise ``RecursionError``. So the document is first walked as a stream of parser events
(iterative, nothing constructed) to count the nodes it expands to (an alias counts as the whole
node it repeats) and its depth, and only a document within both limits is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

__all__ = ["YamlLimits", "load_yaml"]


@dataclass(frozen=True, slots=True)
class YamlLimits:
    """Bounds on a YAML document: file size, and once expanded (aliases counted in full): values, characters
    of text, nesting depth."""

    max_bytes: int = 1024 * 1024
    max_nodes: int = 20_000
    max_chars: int = 4 * 1024 * 1024
    max_depth: int = 24


class _Frame:
    __slots__ = ("anchor", "chars", "nodes")

    def __init__(self, anchor: str | None) -> None:
        self.anchor = anchor
        self.nodes = 1  # the collection itself
        self.chars = 0


def _measure(text: str, where: str, limits: YamlLimits) -> None:
    """Raise :class:`ConfigError` when the document expands past ``limits`` (parser events only)."""
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, chars) of the node it names, expanded
    stack: list[_Frame] = [_Frame(None)]
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                stack.append(_Frame(event.anchor))
                if len(stack) - 1 > limits.max_depth:
                    raise ConfigError(f"{where}: YAML nested more than {limits.max_depth} levels deep; refused")
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                done = stack.pop()
                n, c = done.nodes, done.chars
                if done.anchor:
                    sizes[done.anchor] = (n, c)
            elif isinstance(event, yaml.ScalarEvent):
                n, c = 1, len(event.value)
                if event.anchor:
                    sizes[event.anchor] = (n, c)
            elif isinstance(event, yaml.AliasEvent):
                n, c = sizes.get(event.anchor or "", (1, 0))
            else:
                continue
            top = stack[-1]
            top.nodes += n
            top.chars += c
            if sum(f.nodes for f in stack) > limits.max_nodes or sum(f.chars for f in stack) > limits.max_chars:
                raise ConfigError(
                    f"{where}: YAML expands to more than {limits.max_nodes} values or {limits.max_chars} characters "
                    "(aliases repeat whole nodes: an alias bomb?); refused")
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None


def load_yaml(source: str | Path, *, text: str | None = None, limits: YamlLimits | None = None) -> Any:
    """The document in the file ``source`` (or in ``text``, named ``source`` in errors), within ``limits``.

    Raises :class:`~cubelake.errors.ConfigError` naming the file for unreadable, oversized,
    too deep, alias-bomb or malformed YAML.
    """
    limits = limits or YamlLimits()
    where = str(source)
    if text is None:
        path = Path(source)
        try:
            size = path.stat().st_size
            if size > limits.max_bytes:
                raise ConfigError(f"{where}: {size} bytes is over the {limits.max_bytes}-byte limit for a YAML file")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    elif len(text.encode("utf-8", "surrogatepass")) > limits.max_bytes:
        raise ConfigError(f"{where}: over the {limits.max_bytes}-byte limit for a YAML document")
    _measure(text, where, limits)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    except RecursionError:  # pragma: no cover - the depth limit keeps the constructor far from it
        raise ConfigError(f"{where}: YAML nested too deeply; refused") from None
