"""OSErrors turned into the error a user can act on: bad input (exit 2) naming the path and what stands there, or an
environment problem (exit 3: a full disk, a read-only filesystem, no permission)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from speclock.core.errors import BadInput, EnvironmentProblem, SpeclockError


def _stat_errno(path: Path) -> int | None:
    try:
        os.stat(path)
    except OSError as err:
        return err.errno
    return None


def file_where_folder_belongs(where: str | os.PathLike[str]) -> str:
    """The one message for a path that must be (or lead through) a folder but meets a file (or a link loop)."""
    path = Path(where)
    for part in [path, *path.parents]:
        if os.path.islink(part) and _stat_errno(part) == errno.ELOOP:
            return f"{where}: {part} is a symbolic link loop, where a folder belongs"
        if os.path.lexists(part) and _stat_errno(part) is None and not part.is_dir():
            return f"{where}: {part} is a file, where a folder belongs"
    return f"{where}: a part of this path is a file, where a folder belongs"


_NAME_MAX, _PATH_MAX = 255, 4096  # Linux's limits, as the kernel counts them (bytes)

# Filesystems of the kernel (no disk behind them): no folder of the user's can be made there.
PSEUDO_FILESYSTEMS = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "securityfs",
    "debugfs",
    "tracefs",
    "configfs",
    "bpf",
    "pstore",
    "efivarfs",
    "mqueue",
    "fusectl",
    "binfmt_misc",
    "autofs",
    "nsfs",
    "rpc_pipefs",
}


def filesystem_type(path: str | os.PathLike[str]) -> str | None:
    """The type of the filesystem that holds `path` (the longest mount point above it in /proc/self/mounts)."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _cannot_create(where: str) -> SpeclockError | None:
    """mkdir's ENOENT, EACCES or EPERM where the parent folder exists: say why nothing can be made there."""
    parent = Path(where).parent
    if not parent.is_dir():
        return None
    kind = filesystem_type(parent)
    if kind in PSEUDO_FILESYSTEMS:
        return BadInput(
            f"{where} cannot be created: {parent} is on the kernel's {kind} filesystem, which holds no folders of "
            f"users (not a disk)",
            hint="choose a folder on a disk, e.g. under your home or /tmp",
        )
    return None


def _copy_error(failures: list[object]) -> SpeclockError:
    """shutil.copytree's error, which carries a list of (source, destination, reason) and no errno or file name: the
    first failure named (a dangling link, as a drafter folder whose weights link to a moved file, is bad input)."""
    first = failures[0]
    src, dst, why = (list(first) + ["?", "?", "?"])[:3] if isinstance(first, (list, tuple)) else ("?", "?", first)
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    if "No such file or directory" in str(why):
        return BadInput(
            f"{src} does not exist{more}: a link to a file that is not there?",
            hint="check the path, and restore the file a symbolic link there points to",
        )
    return EnvironmentProblem(f"could not copy {src} to {dst}: {why}{more}", hint="check the disk and the files' permissions")


def os_error(err: OSError, path: str | os.PathLike[str] | None = None, action: str = "access") -> SpeclockError:
    """Turn an OSError into the error a user can act on: bad input or an environment problem."""
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
        return _copy_error(err.args[0])
    where = str(path or err.filename or "?")
    code = err.errno
    if code == errno.ENOSPC or code == errno.EDQUOT:
        return EnvironmentProblem(
            f"disk full: could not {action} {where}",
            hint=f"free space on the disk that holds {where} (df -h), then run the command again",
        )
    if code == errno.EROFS:
        return EnvironmentProblem(
            f"read-only filesystem: could not {action} {where}",
            hint="the disk that holds it is mounted read-only: point the command at a writable folder (in an image, /tmp)",
        )
    if code in (errno.ENOENT, errno.EACCES, errno.EPERM) and action.startswith("create"):
        cannot = _cannot_create(where)
        if cannot is not None:
            return cannot
    if code in (errno.EACCES, errno.EPERM):
        return EnvironmentProblem(
            f"permission denied: could not {action} {where}",
            hint="run as a user that may write there, or point the command at another folder",
        )
    if code == errno.EISDIR:
        return BadInput(f"{where} is a directory, where a file belongs", hint="give the path of the file itself")
    if code in (errno.ENOTDIR, errno.EEXIST):
        # mkdir of an existing file says EEXIST, a path through one says ENOTDIR: the same mistake, one message
        return BadInput(file_where_folder_belongs(where), hint="remove or rename it, or choose another path")
    if code == errno.ENOENT:
        return BadInput(f"{where} does not exist", hint="check the path")
    if code == errno.ELOOP:
        return BadInput(f"{where}: too many symbolic links (a link loop)", hint="replace the link with the file")
    if code == errno.ENAMETOOLONG:
        return BadInput(
            f"{where[:200]}{'...' if len(where) > 200 else ''}: the path is too long (over {_NAME_MAX} bytes in one "
            f"name, or over {_PATH_MAX} in all)",
            hint="give a shorter path",
        )
    return EnvironmentProblem(
        f"could not {action} {where}: {err.strerror or err}", hint="check the disk and the file's permissions"
    )
