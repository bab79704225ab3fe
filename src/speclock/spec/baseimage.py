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

from speclock.core.errors import CheckFailed, EnvironmentProblem
from speclock.core.files import TEMP_PREFIX, atomic_write_text, file_sha256, move_aside, os_error, pid_alive, publish
from speclock.core.heartbeat import Progress
from speclock.core.layout import cache_dir
from speclock.spec.lock_types import BaseRecipe, LockBase
from speclock.spec.stack import Stack


def recipe(stack: Stack, source_date_epoch: int, extra_packages: list[str] | None = None) -> BaseRecipe:
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


def recipe_command(rec: BaseRecipe, out: Path) -> list[str]:
    cmd = ["mmdebstrap", f"--mode={rec['mode']}", f"--variant={rec['variant']}", f"--format={rec['format']}"]
    if rec["packages"]:
        cmd.append("--include=" + ",".join(rec["packages"]))
    return cmd + [rec["suite"], str(out), rec["mirror"]]


def recipe_hash(rec: BaseRecipe) -> str:
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()


def cached_tar(rec: BaseRecipe) -> Path:
    return cache_dir() / "base" / f"{recipe_hash(rec)[:24]}.tar"


def _sidecar(tar: Path) -> Path:
    return tar.with_name(tar.name + ".sha256")  # the tarball's sha256, written when it was built


def _partial_name(out: Path, pid: int) -> Path:
    return out.with_name(f"{TEMP_PREFIX}{out.name}.partial-{pid}")


def _clean_partials(folder: Path) -> None:
    """Remove tarballs a killed run left half-written. mmdebstrap may write nothing for minutes, so age
    cannot tell a live build from a dead one: the builder's pid in the name can (a live pid keeps it)."""
    try:
        entries = list(folder.glob(f"{TEMP_PREFIX}*.partial-*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name.rpartition(".partial-")[2]
        if not pid.isdigit():
            continue
        if pid_alive(int(pid)):
            continue  # that build is still running (or runs under another user): leave it
        try:
            entry.unlink()
        except OSError:
            pass


def _reusable(out: Path) -> str | None:
    """The sha256 of the cached tarball, verified against the one recorded when it was built; None when
    there is none or it no longer matches (truncated, corrupt: moved aside to be rebuilt)."""
    if not out.is_file():
        return None
    side = _sidecar(out)
    actual = file_sha256(out)
    try:
        recorded = side.read_text(encoding="ascii").strip() if side.is_file() else None
    except (OSError, UnicodeDecodeError):
        recorded = None
    if recorded is None:  # a cache from before the sidecar: record what it is now
        atomic_write_text(side, actual + "\n")
        return actual
    if recorded == actual:
        return actual
    move_aside(out, out.with_name(out.name + ".corrupt"), what="the corrupt base tarball")
    return None


def build_rootfs(rec: BaseRecipe, *, progress: Progress = print) -> Path:
    """Build (or reuse) the rootfs tarball for a recipe; atomic: a failed or interrupted run leaves nothing behind."""
    return _built_rootfs(rec, progress=progress)[0]


def _built_rootfs(rec: BaseRecipe, *, progress: Progress = print) -> tuple[Path, str]:
    """(tarball, its sha256): reused when its hash still matches the recorded one, built otherwise."""
    out = cached_tar(rec)
    sha = _reusable(out)
    if sha:
        return out, sha
    if not shutil.which("mmdebstrap"):
        raise EnvironmentProblem(
            "mmdebstrap is not installed; it builds the Debian base root filesystem",
            hint="apt-get install mmdebstrap (as root), or use base.kind = 'image' in the stack",
        )
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "building the Debian base needs root (mmdebstrap --mode=root)",
            hint="run as root, or use base.kind = 'image' in the stack",
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, out.parent, "make the base cache folder") from None
    _clean_partials(out.parent)
    tmp = _partial_name(out, os.getpid())
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(rec["source_date_epoch"]))
    progress(
        f"building base rootfs: Debian {rec['suite']} {rec['variant']} + {', '.join(rec['packages']) or 'nothing'} (mmdebstrap, ~20-60 s)"
    )
    started = time.monotonic()
    try:
        proc = subprocess.run(recipe_command(rec, tmp), env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise EnvironmentProblem(
                f"mmdebstrap failed:\n{proc.stderr.strip()[-1500:]}",
                hint=f"check that the mirror {rec['mirror']} is reachable and the packages exist in {rec['suite']}",
            )
        try:  # mmdebstrap wrote the file itself: record its hash, then publish it under its name
            sha = file_sha256(tmp)
            atomic_write_text(_sidecar(out), sha + "\n")
            publish(tmp, out)
        except OSError as err:
            raise os_error(err, out, "store the base tarball as") from None
    finally:
        tmp.unlink(missing_ok=True)
    progress(f"  base rootfs built in {time.monotonic() - started:.0f} s: {out}")
    return out, sha


def lock_base(
    stack: Stack,
    *,
    previous_epoch: int | None = None,
    extra_packages: list[str] | None = None,
    progress: Progress = print,
) -> LockBase:
    """The lock's `base` entry: the recipe and the sha256 of the tarball it produces (or the image ref).

    `extra_packages`: the kernel builder base (`kernel_base` in the lock) is the same recipe plus these."""
    if stack.base["kind"] == "image":
        return {"kind": "image", "ref": stack.base["ref"]}
    # A fixed epoch (midnight UTC of the lock day) makes the tarball byte-identical across rebuilds.
    today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    epoch = previous_epoch or int(today.timestamp())
    rec = recipe(stack, epoch, extra_packages)
    tar, sha = _built_rootfs(rec, progress=progress)
    return {
        "kind": "debian-rootfs",
        "recipe": rec,
        "command": " ".join(recipe_command(rec, Path("base.tar"))),
        "sha256": sha,
        "size": tar.stat().st_size,
        "source_date_epoch": epoch,
    }


def verified_rootfs(base: LockBase, *, progress: Progress = print) -> Path:
    """The cached tarball for a locked base, rebuilt if missing and checked against the lock's sha256.

    A cached tarball that does not match is moved aside and built again before the mirror is blamed
    (a truncated cache is not a moved mirror)."""
    out = cached_tar(base["recipe"])
    for _ in range(2):
        reused = out.is_file()
        tar, actual = _built_rootfs(base["recipe"], progress=progress)
        if actual == base["sha256"]:
            return tar
        bad = move_aside(tar, tar.with_name(tar.name + ".mismatch"), what="the mismatching base tarball")
        if not reused:
            break
        progress(f"  the cached base tarball does not match the lock; building it again (kept at {bad})")
    raise CheckFailed(
        f"the base rootfs built from the locked recipe has sha256 {actual[:16]}..., the lock says {base['sha256'][:16]}... "
        f"(the Debian mirror has moved on since the lock was made; the odd tarball is kept at {bad})",
        hint="re-lock (`invoke lock`) to take the mirror's current state, and review the change",
    )
