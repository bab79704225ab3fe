"""The base root filesystem: built locally and reproducibly from Debian's mirror, or an image by digest.

A `debian-rootfs` base is an mmdebstrap tarball made with a fixed SOURCE_DATE_EPOCH: the same
recipe on the same mirror state gives the same bytes, so its sha256 goes into the lock and every
build checks it. The tarball is cached by recipe hash outside git and imported as a local image.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from speclock.errors import CheckFailed, EnvironmentProblem
from speclock.layout import cache_dir
from speclock.stack import Stack


def recipe(stack: Stack, source_date_epoch: int, extra_packages: list[str] | None = None) -> dict[str, Any]:
    base = stack.base
    return {
        "tool": "mmdebstrap",
        "suite": base["suite"],
        "mirror": base["mirror"],
        "variant": base["variant"],
        "packages": sorted(set(base["packages"]) | set(extra_packages or [])),
        "source_date_epoch": source_date_epoch,
        "format": "tar",
        "mode": "root",
    }


def recipe_command(rec: dict[str, Any], out: Path) -> list[str]:
    cmd = ["mmdebstrap", f"--mode={rec['mode']}", f"--variant={rec['variant']}", f"--format={rec['format']}"]
    if rec["packages"]:
        cmd.append("--include=" + ",".join(rec["packages"]))
    return cmd + [rec["suite"], str(out), rec["mirror"]]


def recipe_hash(rec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()


def cached_tar(rec: dict[str, Any]) -> Path:
    return cache_dir() / "base" / f"{recipe_hash(rec)[:24]}.tar"


def build_rootfs(rec: dict[str, Any], *, progress=print) -> Path:
    """Build (or reuse) the rootfs tarball for a recipe; atomic: a failed run leaves nothing behind."""
    out = cached_tar(rec)
    if out.is_file():
        return out
    if not shutil.which("mmdebstrap"):
        raise EnvironmentProblem("mmdebstrap is not installed; it builds the Debian base root filesystem",
                                 hint="apt-get install mmdebstrap (as root), or use base.kind = 'image' in the stack")
    if os.geteuid() != 0:
        raise EnvironmentProblem("building the Debian base needs root (mmdebstrap --mode=root)",
                                 hint="run as root, or use base.kind = 'image' in the stack")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(rec["source_date_epoch"]))
    progress(f"building base rootfs: Debian {rec['suite']} {rec['variant']} + {', '.join(rec['packages']) or 'nothing'} (mmdebstrap, ~20-60 s)")
    started = time.monotonic()
    proc = subprocess.run(recipe_command(rec, tmp), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise EnvironmentProblem(f"mmdebstrap failed:\n{proc.stderr.strip()[-1500:]}",
                                 hint=f"check that the mirror {rec['mirror']} is reachable and the packages exist in {rec['suite']}")
    os.replace(tmp, out)
    progress(f"  base rootfs built in {time.monotonic() - started:.0f} s: {out}")
    return out


def lock_base(stack: Stack, *, previous_epoch: int | None = None, extra_packages: list[str] | None = None,
              progress=print) -> dict[str, Any]:
    """The lock's `base` entry: the recipe and the sha256 of the tarball it produces (or the image ref).

    `extra_packages`: the kernel builder base (`kernel_base` in the lock) is the same recipe plus these."""
    if stack.base["kind"] == "image":
        return {"kind": "image", "ref": stack.base["ref"]}
    # A fixed epoch (midnight UTC of the lock day) makes the tarball byte-identical across rebuilds.
    today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    epoch = previous_epoch or int(today.timestamp())
    rec = recipe(stack, epoch, extra_packages)
    tar = build_rootfs(rec, progress=progress)
    from speclock.lock import file_sha256

    return {"kind": "debian-rootfs", "recipe": rec, "command": " ".join(recipe_command(rec, Path("base.tar"))),
            "sha256": file_sha256(tar), "size": tar.stat().st_size, "source_date_epoch": epoch}


def verified_rootfs(base: dict[str, Any], *, progress=print) -> Path:
    """The cached tarball for a locked base, rebuilt if missing and checked against the lock's sha256."""
    from speclock.lock import file_sha256

    tar = build_rootfs(base["recipe"], progress=progress)
    actual = file_sha256(tar)
    if actual != base["sha256"]:
        bad = tar.with_name(tar.name + ".mismatch")
        os.replace(tar, bad)
        raise CheckFailed(
            f"the base rootfs built from the locked recipe has sha256 {actual[:16]}..., the lock says {base['sha256'][:16]}... "
            f"(the Debian mirror has moved on since the lock was made; the odd tarball is kept at {bad})",
            hint="re-lock (`invoke lock`) to take the mirror's current state, and review the change")
    return tar
