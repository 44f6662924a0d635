"""Re-fetch the map view's vendored JavaScript (Leaflet, from the npm registry) and check it against
the recorded sha256 sums, so the copy committed under ``catalog/web/vendor/`` is reproducible.

    python catalog/web/vendor.py            # npm pack, check the tarball and every file, then write them
    python catalog/web/vendor.py --check    # offline: the committed files against SHA256SUMS

The page loads nothing from a CDN: these files are all it needs, so it works with no network.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

#: what is vendored: the npm package, its tarball's integrity (npm's sha512) and the files taken from it
PACKAGE = "leaflet"
VERSION = "1.9.4"
INTEGRITY = "sha512-nxS1ynzJOmOlHp+iL3FyWqK89GtNL8U8rvlMOsQdTTssxZwCXh8N2NB3GDQOL+YR3XnWyZAxwQixURb+FA74PA=="
FILES = {  # path in the tarball -> path under DEST
    "package/LICENSE": "LICENSE",
    "package/dist/leaflet.js": "leaflet.js",
    "package/dist/leaflet.css": "leaflet.css",
    "package/dist/images/layers.png": "images/layers.png",
    "package/dist/images/layers-2x.png": "images/layers-2x.png",
    "package/dist/images/marker-icon.png": "images/marker-icon.png",
    "package/dist/images/marker-icon-2x.png": "images/marker-icon-2x.png",
    "package/dist/images/marker-shadow.png": "images/marker-shadow.png",
}
DEST = Path(__file__).resolve().parent / "vendor" / PACKAGE
SUMS = DEST / "SHA256SUMS"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_sums(path: Path = SUMS) -> dict[str, str]:
    """The recorded ``{relative path: sha256}`` (``sha256sum`` format, so ``sha256sum -c`` reads it too)."""
    sums = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


def check(dest: Path = DEST) -> list[str]:
    """Problems of the committed copy: files missing, changed, or not recorded (empty when it is intact)."""
    if not (dest / "SHA256SUMS").is_file():
        return [f"{dest / 'SHA256SUMS'} is missing; run this script without --check to vendor {PACKAGE}"]
    sums = read_sums(dest / "SHA256SUMS")
    problems = [f"{name} is not recorded in SHA256SUMS" for name in FILES.values() if name not in sums]
    for name, digest in sums.items():
        file = dest / name
        if not file.is_file():
            problems.append(f"{file} is missing")
        elif _sha256(file.read_bytes()) != digest:
            problems.append(f"{file}: sha256 {_sha256(file.read_bytes())}, recorded {digest}")
    return problems


def fetch(dest: Path = DEST) -> None:
    """``npm pack`` the package, check its integrity and each file's recorded sum, and write the files."""
    import base64

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}", "--silent"], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
        tarball = Path(tmp) / f"{PACKAGE}-{VERSION}.tgz"
        algo, _, want = INTEGRITY.partition("-")
        got = base64.b64encode(hashlib.new(algo, tarball.read_bytes()).digest()).decode()
        if got != want:
            raise SystemExit(f"{tarball.name}: integrity {algo}-{got}, expected {INTEGRITY}; "
                             "the registry served another tarball than the one recorded here")
        contents: dict[str, bytes] = {}
        with tarfile.open(tarball) as tar:
            for member, name in FILES.items():
                f = tar.extractfile(member)
                if f is None:
                    raise SystemExit(f"{tarball.name} has no file {member}")
                contents[name] = f.read()
    recorded = read_sums(dest / "SHA256SUMS") if (dest / "SHA256SUMS").is_file() else {}
    for name, data in contents.items():
        if name in recorded and recorded[name] != _sha256(data):
            raise SystemExit(f"{PACKAGE} {VERSION} {name}: sha256 {_sha256(data)}, recorded {recorded[name]}")
    for name, data in contents.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    (dest / "SHA256SUMS").write_text("".join(f"{_sha256(d)}  {n}\n" for n, d in sorted(contents.items())))
    (dest / "VERSION").write_text(f"{PACKAGE} {VERSION} from the npm registry ({INTEGRITY})\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the committed files (no network)")
    args = parser.parse_args(argv)
    if not args.check:
        fetch()
    problems = check()
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{PACKAGE} {VERSION}: {len(FILES)} files under {DEST} match SHA256SUMS")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
