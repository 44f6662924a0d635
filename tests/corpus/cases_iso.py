"""Corpus entries that get a CLI process of their own: special files, odd names, bombs, bad profiles.

They run alone because one of them may hang (a FIFO), blow up memory (a bomb) or needs its own
option (``--profile``, ``--variable``); a batch would hide which. Odd names also get a batch of
corrupt copies (``names:*`` runs) next to these isolated valid copies.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import ops
from .cases_landsat import PASSWD
from .cases_raster import (
    ENMAP,
    ENVI_HDR,
    HYDICE,
    LT5B1,
    MODEL64,
    NAIP_BIGTIFF,
    RGBA_ZSTD,
    envi_pair,
    hydice_v5,
    v5_dims_bomb,
    v73_file,
)
from .model import Builder, Case, Corpus, Expect, Run

__all__ = ["NAMES", "NAMES_RUNS", "add_bombs", "add_names", "add_profiles", "add_special", "name_cases"]

#: Odd file names (as str; the non-UTF-8 one through os.fsdecode, i.e. with a surrogate escape).
NAMES: dict[str, str] = {
    "newline": "new\nline.tif",
    "cr-tab": "tab\there\rcr.tif",
    "ansi-escape": "\x1b[31mred\x1b[0m.tif",
    "non-utf8": os.fsdecode(b"latin1_caf\xe9.tif"),
    "long": "L" * 246 + ".tif",
    "leading-dash": "-leading-dash.tif",
    "unicode-spaces": "spaces and \u00fcn\u00efc\u00f6d\u00e9 \u2603.tif",
    "rich-markup": "[bold]markup[/bold].tif",
    "percent": "%s%n%x.tif",
}
NAMES_RUNS = ("names:ingest", "names:validate")
_NOT_REGULAR = r"fifo|pipe|regular|special|socket|device|not a file"


def _copy(src: str, dst: str) -> Builder:
    return lambda root, real: ops.copy(real / src, root / dst) and None


def add_special(c: Corpus) -> None:
    """FIFOs, sockets, devices, symlinks and folders where a scene file is expected."""
    r = Expect.REJECT
    fifo = [("tif", "x.tif"), ("mtl", "LT5_fifo_MTL.txt"), ("mat", "x.mat"), ("hdr", "x.hdr")]
    for tag, name in fifo:
        scene = f"iso/special/fifo_{tag}/{name}"
        case = Case(f"special-fifo-{tag}", "special", f"a FIFO named {name} (opening it for reading blocks)", scene, r,
                    (), lambda root, real, s=scene: ops.make_fifo(root / s) and None, mention=_NOT_REGULAR)
        commands = ("ingest", "validate") if tag == "tif" else ("ingest",)
        c.isolated(case, *commands)
    data_fifo = "iso/special/fifo_envi_data/rdn.hdr"

    def envi_fifo(root: Path, real: Path) -> None:
        envi_pair(data_fifo, lambda t: t, data="none")(root, real)
        ops.make_fifo(root / data_fifo.removesuffix(".hdr"))

    c.isolated(Case("special-fifo-envi-data", "special", f"{ENVI_HDR} whose data file is a FIFO", data_fifo, r, (),
                    envi_fifo))
    folder = "iso/special/fifo_folder"

    def fifo_folder(root: Path, real: Path) -> None:
        ops.make_fifo(root / folder / "x.tif")
        ops.copy(real / LT5B1, root / folder / "good.tif")

    run = "special-fifo-in-folder:ingest"
    c.add(Case("special-fifo-in-folder", "special", "a FIFO named x.tif in a folder that is walked", f"{folder}/x.tif",
               r, (run,), fifo_folder, mention=_NOT_REGULAR))
    c.add(Case("special-fifo-folder-good", "special", f"{LT5B1} next to that FIFO (must still be ingested)",
               f"{folder}/good.tif", Expect.OK, (run,), lambda root, real: None),
          _run(run, folder))
    links = [("broken-symlink", "broken.tif", "does-not-exist.tif", r), ("dev-zero", "zero.tif", "/dev/zero", r),
             ("dev-null", "null.tif", "/dev/null", r), ("dev-zero-mtl", "LT5_zero_MTL.txt", "/dev/zero", r),
             ("dev-zero-hdr", "zero.hdr", "/dev/zero", r), ("dev-zero-mat", "zero.mat", "/dev/zero", r)]
    for cid, name, target, exp in links:
        scene = f"iso/special/{cid}/{name}"
        c.isolated(Case(f"special-{cid}", "special", f"{name}: a symlink to {target}", scene, exp, (),
                        lambda root, real, s=scene, t=target: ops.symlink(root / s, t) and None))
    loop = "iso/special/symlink-loop/a.tif"

    def symlink_loop(root: Path, real: Path) -> None:
        ops.symlink(root / loop, "b.tif")
        ops.symlink(root / loop.replace("a.tif", "b.tif"), "a.tif")

    c.isolated(Case("special-symlink-loop", "special", "a.tif -> b.tif -> a.tif", loop, r, (), symlink_loop))
    sock = "iso/special/socket/x.tif"
    c.isolated(Case("special-socket", "special", "a Unix socket named x.tif", sock, r, (),
                    lambda root, real: ops.make_socket(root / sock) and None, mention=_NOT_REGULAR))
    empty = "iso/special/empty_dir/x.tif"
    c.isolated(Case("special-empty-dir", "special", "an empty folder named x.tif, given explicitly", empty, Expect.REFUSE,
                    (), lambda root, real: (root / empty).mkdir(parents=True) and None))
    loopdir = "iso/special/dir_symlink_loop"

    def dir_loop(root: Path, real: Path) -> None:
        ops.copy(real / LT5B1, root / loopdir / "good.tif")
        ops.symlink(root / loopdir / "loop", ".")

    c.isolated(Case("special-dir-symlink-loop", "special", "a folder holding a symlink to itself and a good band file",
                    f"{loopdir}/good.tif", Expect.OK, (), dir_loop), targets=(loopdir,))


def _run(key: str, folder: str) -> Run:
    return Run(key, "ingest", (folder,), fmt="json", batch=True)


def name_cases() -> list[Case]:
    """Corrupt copies (a third of the real LZW band) under odd names, for the ``names`` batch."""
    out = []
    for key, name in NAMES.items():
        stem = name[: -len(".tif")]
        bad = (stem[:-4] if key == "long" else stem) + "_bad.tif"
        scene = f"b_names/{bad}"
        out.append(Case(f"names-bad-{key}", "names", f"{LT5B1} cut to a third, named {bad!r}", scene, Expect.REJECT,
                        NAMES_RUNS, lambda root, real, s=scene: ops.truncate(real / LT5B1, root / s, 0.33) and None))
    return out


def add_names(c: Corpus) -> None:
    """Valid copies of the real LZW band under odd names, each ingested alone; must ingest and print safely."""
    for key, name in NAMES.items():
        folder = f"iso/names/{key}"
        # GDAL cannot open a name that is not UTF-8 (rasterio passes names as UTF-8): issue 11 asks for a
        # rejection naming the file and what is wrong with it
        expect, mention = (Expect.REJECT, "not valid UTF-8") if key == "non-utf8" else (Expect.OK, None)
        case = Case(f"names-ok-{key}", "names", f"{LT5B1} (valid) named {name!r}", f"{folder}/{name}", expect, (),
                    _copy(LT5B1, f"{folder}/{name}"), mention=mention)
        if key == "leading-dash":  # as a user passes it: after "--", relative to its folder
            c.isolated(case, "ingest", targets=("--", name), cwd=folder, relative=True)
        else:
            c.isolated(case, "ingest")


def add_bombs(c: Corpus) -> None:
    """Headers that claim enormous sizes on small files: refused from the header, fast, in bounded memory."""
    r = Expect.REJECT
    big, huge = 1_000_000, 4_000_000_000
    tiffs = [
        ("tiff-1e6x1e6x1000", LT5B1, "ImageWidth = ImageLength = RowsPerStrip = 10^6, SamplesPerPixel = 1000",
         ((256, big, 4), (257, big, 4), (278, big, 4), (277, 1000, None))),
        ("tiff-bands64-1e6", MODEL64, "64 band-sequential strips claiming 10^6 x 10^6 each",
         ((256, big, 4), (257, big, 4), (278, big, 4))),
        ("tiff-tiled-1e6", RGBA_ZSTD, "a 16x16-tiled ZSTD COG claiming 10^6 x 10^6", ((256, big, 4), (257, big, 4))),
        ("bigtiff-4e9", NAIP_BIGTIFF, "a BigTIFF claiming 4x10^9 x 4x10^9", ((256, huge, 4), (257, huge, 4))),
    ]
    for cid, src, what, changes in tiffs:
        scene = f"iso/bombs/{cid}.tif"
        c.isolated(Case(f"bomb-{cid}", "bombs", f"{src}: {what}", scene, r, (),
                        lambda root, real, src=src, s=scene, ch=changes: ops.tiff_set(real / src, root / s, ch) and None))
    envi = "iso/bombs/envi_1e6.hdr"
    c.isolated(Case("bomb-envi-1e6x1e6x1000", "bombs", f"{ENVI_HDR} claiming samples = lines = 10^6, bands = 1000",
                    envi, r, (), envi_pair(envi, _envi_bomb)))
    v5 = "iso/bombs/v5_dims.mat"
    c.isolated(Case("bomb-mat-v5-dims", "bombs", f"{HYDICE} crop (v5) whose dims claim 10^6 x 10^6 x 1000", v5, r, (),
                    lambda root, real: v5_dims_bomb(real, root / v5, (big, big, 1000)) and None))
    v73 = "iso/bombs/v73_dims.mat"
    c.isolated(Case("bomb-mat-v73-dims", "bombs", "v7.3 file with a chunked 1000 x 10^6 x 10^6 uint16 dataset, nothing written",
                    v73, r, (), lambda root, real: v73_file(root / v73, {}, (1000, big, big)) and None))
    deep = "iso/bombs/deep/LT5_deep_MTL.json"
    c.isolated(Case("bomb-mtl-json-deep", "bombs", "an MTL JSON nested 100000 levels deep", deep, r, (),
                    lambda root, real: ops.write_text(root / deep, '{"a":' * 100_000 + "1" + "}" * 100_000) and None))


def _envi_bomb(text: str) -> str:
    for key, value in (("samples", "1000000"), ("lines", "1000000"), ("bands", "1000")):
        text = text.replace(text[text.index(key):].split("\n", 1)[0], f"{key} = {value}", 1)
    return text


def _profile_text(real_profile: str, extra: str) -> str:
    return real_profile.rstrip("\n") + "\n" + extra


def _alias_bomb(levels: int = 9) -> list[str]:
    lines = ['    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return lines


def add_profiles(c: Corpus, real_profile: Path) -> None:
    """Bad ``--profile`` files derived from the bundled enmap-l2a.yaml: a usage error (exit 2) naming the file."""
    base = real_profile.read_text()
    bomb = "\n".join(_alias_bomb())
    n = 10_000
    texts: list[tuple[str, str, str | bytes, str | None, tuple[str, ...]]] = [
        ("alias-bomb-nested", "9 levels of 9 aliases under stac.properties (9^9 strings when expanded)",
         _profile_text(base, "  properties:\n" + bomb + "\n"), r"alias|expan|large|size|nest", ()),
        ("alias-bomb-top", "the same alias bomb at the top level",
         _profile_text(base, "bomb:\n" + bomb.replace("    l", "  l") + "\n"), None, ()),
        ("deep-lists", f"a list nested {n} levels under stac.properties",
         _profile_text(base, "  properties:\n    deep: " + "[" * n + "]" * n + "\n"), r"deep|nest|depth", ()),
        ("deep-maps", f"a mapping nested {n} levels under stac.properties",
         _profile_text(base, "  properties:\n    deep: " + "{a: " * n + "1" + "}" * n + "\n"), r"deep|nest|depth", ()),
        ("wrong-types", "chunk: big, nodata: none, bad_bands.indices: all",
         base.replace("chunk: 256", "chunk: big").replace("nodata: -32768", "nodata: none")
         .replace("  use_file_bbl: true", "  use_file_bbl: true\n  indices: all"), r"chunk|nodata|indices", ()),
        ("not-mapping", "a YAML list", "- enmap\n- l2a\n", None, ()),
        ("invalid-yaml", "an unclosed flow sequence", base + "extra: [unclosed\n", None, ()),
        ("sidecar-escape", "spectral.sidecar = ../../../../../../../../etc/passwd",
         base.replace("  overlap: drop", "  overlap: drop\n  sidecar: ../../../../../../../../etc/passwd"), "sidecar",
         (PASSWD,)),
        ("sidecar-absolute", "spectral.sidecar = /etc/passwd",
         base.replace("  overlap: drop", "  overlap: drop\n  sidecar: /etc/passwd"), "sidecar", (PASSWD,)),
        ("binary", "YAML with non-UTF-8 bytes", base.encode() + b"\nname: \xff\xfe\x00\x81garbage\n", None, ()),
        ("empty", "an empty file", "", None, ()),
    ]
    for cid, what, text, mention, forbid in texts:
        scene = f"iso/profiles/{cid}.yaml"
        c.isolated(Case(f"profile-{cid}", "profiles", f"--profile: {what}", scene, Expect.USAGE, (),
                        lambda root, real, s=scene, t=text: _write(root / s, t), mention=mention, forbid=forbid),
                   "ingest", args=("--profile", "{root}/" + scene), targets=(), controls=(ENMAP,))
    csv = "iso/profiles/wavelengths.csv"
    c.isolated(Case("profile-csv-garbage", "profiles", "--profile wavelengths.csv with a non-numeric wavelength", csv,
                    Expect.USAGE, (), lambda root, real: _write(root / csv, "wavelength_nm,fwhm_nm\n418.2,7\nabc,7\n"),
                    mention="wavelength"),
               "ingest", args=("--profile", "{root}/" + csv), targets=(), controls=(ENMAP,))
    v5 = "iso/mat_args/hydice_crop.mat"
    for cid, args, what in [("wrong-variable", ("--variable", "nosuch"), "--variable names no variable of the file"),
                            ("label-variable", ("--variable", "map"), "--variable names the 2-D label map"),
                            ("axes-bp-on-3d", ("--axes", "bp"), "--axes bp (2-D order) on a 3-D cube")]:
        c.isolated(Case(f"mat-arg-{cid}", "mat", f"{HYDICE} (20x16 crop, v5) with {what}", v5, Expect.REJECT, (),
                        lambda root, real: hydice_v5(real, root / v5) and None,
                        mention=args[1] if cid == "wrong-variable" else None),
                   "ingest", args=args)


def _write(path: Path, text: str | bytes) -> None:
    if isinstance(text, bytes):
        ops.write_bytes(path, text)
    else:
        ops.write_text(path, text)
