"""The installer of the venv step: uv, taken from its locked wheel (stack [python] build_only), hash-checked.

uv installs the ~150 locked wheels several times faster than pip (docs/benchmarks.md, "Build pipeline").
The build context carries `wheels/uv.txt` (uv's pinned line with its sha256, empty when the lock has no
uv: the venv step then installs with pip) and this file as `wheels/uv_unpack.py`, which the venv step runs
with the base image's Python before anything else:

    python3 -B /wheels/uv_unpack.py /wheels/uv.txt /tmp/uv    # -> /tmp/uv/uv

It checks the wheel's sha256 against uv.txt and extracts only the uv binary. Run as a script it needs
nothing but the standard library (the base image has no speclock)."""

from __future__ import annotations

import hashlib
import re
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this file also runs alone, as wheels/uv_unpack.py in the base image: the standard library only
    from speclock.spec.lock import LockDoc, LockEntry

NAME = "uv"
_LINE = re.compile(r"^uv==(?P<version>\S+) --hash=sha256:(?P<sha>[0-9a-f]{64})$")


def uv_package(lock: LockDoc) -> LockEntry | None:
    """The lock's uv entry (among the build-only assets), or None when the stack does not lock uv."""
    return next((p for p in lock["assets"] if p["name"] == NAME), None)


def unpack(requirement_file: Path, dest: Path) -> Path:
    """Verify the uv wheel named by `requirement_file` (beside it) and extract its binary into `dest`."""
    match = _LINE.match(requirement_file.read_text().strip())
    if not match:
        raise SystemExit(f"uv_unpack: {requirement_file} does not hold one pinned uv line with its sha256")
    wheels = sorted(requirement_file.parent.glob(f"uv-{match['version']}-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"uv_unpack: expected one uv {match['version']} wheel in {requirement_file.parent}, found {len(wheels)}")
    digest = hashlib.sha256()
    with open(wheels[0], "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != match["sha"]:
        raise SystemExit(f"uv_unpack: {wheels[0].name} has sha256 {digest.hexdigest()}, the lock says {match['sha']}")
    member = f"uv-{match['version']}.data/scripts/uv"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as zf, open(dest / NAME, "wb") as out:
        out.write(zf.read(member))
    (dest / NAME).chmod(0o755)
    return dest / NAME


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python3 uv_unpack.py UV_REQUIREMENT_FILE DEST_DIR")
    print(unpack(Path(sys.argv[1]), Path(sys.argv[2])))
