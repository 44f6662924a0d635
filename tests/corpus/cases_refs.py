"""Bad kerchunk reference sets for ``cubelake refs check``, edited from real references.

The good set references the tiles of a copy of a real DEFLATE COG (built with ``build_refs``
and written with ``write_refs``, as ``cubelake refs build`` does); each variant changes one entry:
byte ranges that are negative, 2^40 long, fractional or past the end, a NUL in the target, a
target outside the allowed roots, and a ``lake.json`` planted next to the set to widen them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import ops
from .cases_landsat import PASSWD
from .model import Case, Corpus, Expect

__all__ = ["add_refs"]

RX_COG = "geotiff_rioxarray/cog.tif"
SHARED = "refs/shared"
_RANGE = r"offset|length|range|byte|size|integer|negative|beyond|end of"
_UNTRUSTED = r"outside|allowed|untrusted|trust"
MTIME_NS = 1_700_000_000_000_000_000

Doc = dict[str, Any]


def _good(root: Path, real: Path) -> Doc:
    """The good reference set (built once per corpus) as its JSON document."""
    from cubelake.refs import build_refs, write_refs

    target, good = root / SHARED / "cog.tif", root / SHARED / "good.json"
    if not good.exists():
        ops.copy(real / RX_COG, target)
        os.utime(target, ns=(MTIME_NS, MTIME_NS))  # recorded in the references: fixed, for a deterministic corpus
        write_refs(build_refs(str(target)), good, "json")
    return dict(json.loads(good.read_text()))


def _chunk(value: Callable[[list[Any]], list[Any]]) -> Callable[[Doc, Path], Doc]:
    def edit(doc: Doc, root: Path) -> Doc:
        refs = doc["refs"]
        refs["data/0.0.0"] = value(refs["data/0.0.0"])
        return doc

    return edit


def _set_targets(doc: Doc, targets: Any) -> None:
    """Replace ``cubelake:targets`` in the root attributes and in the consolidated metadata."""
    refs = doc["refs"]
    attrs = json.loads(refs[".zattrs"])
    attrs["cubelake:targets"] = targets
    refs[".zattrs"] = json.dumps(attrs)
    zmeta = json.loads(refs[".zmetadata"])
    zmeta["metadata"][".zattrs"] = attrs
    refs[".zmetadata"] = json.dumps(zmeta)


def _retarget(url: str) -> Callable[[Doc, Path], Doc]:
    """Point every chunk (and the recorded target, with its real size and mtime) at ``url``."""

    def edit(doc: Doc, root: Path) -> Doc:
        path = url.replace("{root}", str(root))
        doc["templates"] = {"t0": path}
        st = os.stat(path)
        _set_targets(doc, [{"url": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}])
        return doc

    return edit


def _zarray(doc: Doc, root: Path) -> Doc:
    refs = doc["refs"]
    za = json.loads(refs["data/.zarray"])
    za["shape"] = [10**12] * 3
    refs["data/.zarray"] = json.dumps(za)
    zmeta = json.loads(refs[".zmetadata"])
    zmeta["metadata"]["data/.zarray"] = za
    refs[".zmetadata"] = json.dumps(zmeta)
    return doc


def _targets_text(doc: Doc, root: Path) -> Doc:
    _set_targets(doc, "abc")
    return doc


def _template(doc: Doc, root: Path) -> Doc:
    doc["templates"]["t0"] = str(root / SHARED / "cog\x00.tif")
    return doc


def _variant(scene: str, edit: Callable[[Doc, Path], Doc] | None, text: Callable[[str], str] | None = None,
             setup: Callable[[Path], None] | None = None) -> Callable[[Path, Path], None]:
    def build(root: Path, real: Path) -> None:
        doc = _good(root, real)
        if setup is not None:
            setup(root)
        out = json.dumps(edit(doc, root) if edit else doc)
        ops.write_text(root / scene, text(out) if text else out)

    return build


def _plant(root: Path) -> None:
    ops.write_text(root / "refs/planted/lake.json",
                   json.dumps({"format": "cubelake-lake", "version": 1, "allowed_roots": ["/"]}) + "\n")


def _fifo(root: Path) -> None:
    ops.make_fifo(root / "refs/fifo/cog.tif")
    os.utime(root / "refs/fifo/cog.tif", ns=(MTIME_NS, MTIME_NS))


def add_refs(c: Corpus) -> None:
    r, sh = Expect.REFUSE, SHARED
    rows: list[tuple[str, str, str, Expect, Callable[[Path, Path], None], str | None, tuple[str, ...]]] = [
        ("good", f"{sh}/good_copy.json", "the reference set as built (control: ok)", Expect.OK,
         _variant(f"{sh}/good_copy.json", None), None, ()),
        ("negative-offset", f"{sh}/neg_offset.json", "a chunk at offset -100", r,
         _variant(f"{sh}/neg_offset.json", _chunk(lambda v: [v[0], -100, v[2]])), _RANGE, ()),
        ("huge-length", f"{sh}/huge_length.json", "a chunk 2^40 bytes long", r,
         _variant(f"{sh}/huge_length.json", _chunk(lambda v: [v[0], v[1], 2**40])), _RANGE, ()),
        ("float-offset", f"{sh}/float_offset.json", "a chunk at offset 63215.5", r,
         _variant(f"{sh}/float_offset.json", _chunk(lambda v: [v[0], v[1] + 0.5, v[2]])), _RANGE, ()),
        ("text-length", f"{sh}/text_length.json", "a chunk of length 'abc'", r,
         _variant(f"{sh}/text_length.json", _chunk(lambda v: [v[0], v[1], "abc"])), _RANGE, ()),
        ("past-eof", f"{sh}/past_eof.json", "a chunk starting past the end of its target", r,
         _variant(f"{sh}/past_eof.json", _chunk(lambda v: [v[0], 10_000_000, v[2]])), _RANGE, ()),
        ("nul-target", f"{sh}/nul_target.json", "a NUL byte in the target path", r,
         _variant(f"{sh}/nul_target.json", _template), None, ()),
        ("etc-passwd", f"{sh}/etc_passwd.json", "every chunk in /etc/passwd", r,
         _variant(f"{sh}/etc_passwd.json", _retarget("/etc/passwd")), _UNTRUSTED, (PASSWD,)),
        ("planted-lake-json", "refs/planted/evil.json",
         "targets /etc/passwd, with a lake.json allowing '/' planted next to it", r,
         _variant("refs/planted/evil.json", _retarget("/etc/passwd"), setup=_plant), _UNTRUSTED, (PASSWD,)),
        ("undefined-template", f"{sh}/undefined_template.json", "a chunk naming template {{t9}}", r,
         _variant(f"{sh}/undefined_template.json", _chunk(lambda v: ["{{t9}}", v[1], v[2]])), None, ()),
        ("cut", f"{sh}/cut.json", "the JSON cut at 50%", r,
         _variant(f"{sh}/cut.json", None, lambda t: t[: len(t) // 2]), None, ()),
        ("deep", f"{sh}/deep.json", "JSON nested 100000 levels", r,
         _variant(f"{sh}/deep.json", None, lambda t: "[" * 100_000 + "]" * 100_000), None, ()),
        ("target-fifo", "refs/fifo/fifo.json", "the target is a FIFO (reading it blocks)", r,
         _variant("refs/fifo/fifo.json", _retarget("{root}/refs/fifo/cog.tif"), setup=_fifo),
         r"fifo|pipe|regular|special|not a file", ()),
        ("targets-text", f"{sh}/targets_text.json", "cubelake:targets = 'abc'", r,
         _variant(f"{sh}/targets_text.json", _targets_text), None, ()),
        ("zarray-huge-shape", f"{sh}/huge_shape.json", "data/.zarray shape [10^12]*3 on 4 chunks", Expect.ROBUST,
         _variant(f"{sh}/huge_shape.json", _zarray), None, ()),
    ]
    for cid, scene, what, expect, build, mention, forbid in rows:
        c.isolated(Case(f"refs-{cid}", "refs", f"{RX_COG} references: {what}", scene, expect, (), build,
                        mention=mention, forbid=forbid), "refs check")
