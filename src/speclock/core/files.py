"""Reading inputs and writing outputs safely: the one place for both.

Every reader of user data (stacks, locks, reports, baselines, build records, manifests,
patches, prompts) goes through `read_text`/`read_json`, so a binary file, a directory where a
file belongs, or JSON of the wrong shape becomes a BadInput (exit 2) that names the file,
never a traceback. Every writer goes through `atomic_write*`/`atomic_output`: the file and its
folder are fsynced, and a crash or Ctrl-C leaves the old file or the new one, never half of one.
Paths that come from data (lock filenames, patch names, stack names) go through `confined`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO, TypeVar, overload

from speclock.core.errors import BadInput
from speclock.core.jsonread import MAX_READ_BYTES as MAX_READ_BYTES  # re-exported: readers import these from here
from speclock.core.jsonread import json_type as json_type
from speclock.core.jsonread import parse_json as parse_json
from speclock.core.jsonread import type_names
from speclock.core.oserrors import file_where_folder_belongs as file_where_folder_belongs
from speclock.core.oserrors import os_error as os_error

# Prefix of every temp file the writers make; `clean_stale_temps` removes those a killed run left.
TEMP_PREFIX = ".speclock-tmp-"

_last_input: list[Path] = []  # the input file most recently read, for messages about unexpected errors


def current_input() -> Path | None:
    """The input file most recently opened by a reader here (named by the CLI on an unexpected error)."""
    return _last_input[-1] if _last_input else None


def note_input(path: str | os.PathLike[str]) -> None:
    _last_input[:] = [Path(path)]


# --- reading ---------------------------------------------------------------------------------


def check_file(path: str | os.PathLike[str], *, what: str = "file", hint: str | None = None) -> Path:
    """`path` if a regular file stands there (or a link to one); else BadInput saying what stands there instead:
    nothing, a dangling link, a link loop, a directory, a FIFO, a device, a socket (never "missing" for those)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ENOENT and path.is_symlink():
            raise BadInput(
                f"{path}: the {what} is a symbolic link to {os.readlink(path)}, which does not exist",
                hint=hint or "point the link at the file, or give the file itself",
            ) from None
        if err.errno == errno.ENOENT:
            raise BadInput(f"no {what} at {path}", hint=hint or "check the path") from None
        raise os_error(err, path, f"read the {what}") from None  # a link loop, a too-long path, a file as a folder
    if stat.S_ISDIR(mode):
        raise BadInput(f"{path}: the {what} is a directory, where a file belongs", hint=hint or "give the file itself")
    if not stat.S_ISREG(mode):  # a FIFO or a device would be read forever
        kind = (
            "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a file"
        )
        raise BadInput(f"{path}: the {what} is {kind}, not a regular file", hint=hint or "give a regular file")
    return path


def absent(path: str | os.PathLike[str]) -> bool:
    """Whether nothing at all is at `path`, not even a link: what "missing" may say. A link loop, a dangling link, a
    folder or a FIFO is there, and `check_file` names it."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError as err:  # a too-long name, a file as a folder
        raise os_error(err, path) from None
    return False


def read_bytes(
    path: str | os.PathLike[str], *, what: str = "file", hint: str | None = None, max_bytes: int | None = None
) -> bytes:
    path = Path(path)
    note_input(path)
    check_file(path, what=what, hint=hint)
    try:
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise BadInput(
                f"{path}: the {what} is {size / 2**20:.1f} MiB, more than the {max_bytes / 2**20:.0f} MiB such a file can be",
                hint=hint or f"give the {what} that speclock wrote",
            )
        return path.read_bytes()
    except OSError as err:
        raise os_error(err, path, f"read the {what}") from None


def read_text(
    path: str | os.PathLike[str], *, what: str = "file", hint: str | None = None, max_bytes: int | None = MAX_READ_BYTES
) -> str:
    """A UTF-8 text file; a binary or non-UTF-8 file is BadInput naming the line of the first bad byte."""
    data = read_bytes(path, what=what, hint=hint, max_bytes=max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise BadInput(
            f"{path}:{line}: the {what} is not UTF-8 text (byte {err.start}: {data[err.start : err.start + 1]!r})",
            hint=hint or f"give the {what} as UTF-8 text",
        ) from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise BadInput(f"{path}:{line}: the {what} holds a NUL byte (a binary file?)", hint=hint or f"give the {what} as text")
    return text


def read_json(
    path: str | os.PathLike[str], *, what: str = "JSON file", expect: type | tuple[type, ...] = dict, hint: str | None = None
) -> Any:  # a parsed document whose shape the caller checks next (see parse_json)
    """A JSON file, through the one parser (`jsonread.parse_json`): capped, no key twice, bounded nesting."""
    return parse_json(read_text(path, what=what, hint=hint), path, what=what, expect=expect, hint=hint)


_T = TypeVar("_T")
_U = TypeVar("_U")


@overload
def expect(
    value: object, types: type[_T], where: str, *, path: str | os.PathLike[str], hint: str | None = None, finite: bool = True
) -> _T: ...
@overload
def expect(
    value: object,
    types: tuple[type[_T], type[_U]],
    where: str,
    *,
    path: str | os.PathLike[str],
    hint: str | None = None,
    finite: bool = True,
) -> _T | _U: ...
@overload
def expect(
    value: object,
    types: tuple[type, ...],
    where: str,
    *,
    path: str | os.PathLike[str],
    hint: str | None = None,
    finite: bool = True,
) -> object: ...
def expect(
    value: object,
    types: type | tuple[type, ...],
    where: str,
    *,
    path: str | os.PathLike[str],
    hint: str | None = None,
    finite: bool = True,
) -> object:
    """Check one field's JSON type (bool is never a number here; numbers must be finite)."""
    want = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, want)
    if ok and isinstance(value, bool) and bool not in want:
        ok = False
    if not ok and float in want and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise BadInput(
            f"{path}: {where} is {json_type(value)} {short_repr(value)}, where {type_names(types)} belongs",
            hint=hint or "give the file that speclock wrote, unedited",
        )
    if finite and isinstance(value, float) and not math.isfinite(value):
        raise BadInput(
            f"{path}: {where} is {value}, where a finite number belongs",
            hint=hint or "give the file that speclock wrote, unedited",
        )
    return value


def short_repr(value: object) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return f"({text[:60]}{'...' if len(text) > 60 else ''})"


# --- confinement -----------------------------------------------------------------------------


def confined(root: str | os.PathLike[str], name: str, *, what: str, source: str | os.PathLike[str] | None = None) -> Path:
    """`root/name`, refused (BadInput) when `name` is absolute, has `..`, or resolves outside `root`."""
    where = f"{source}: " if source else ""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise BadInput(f"{where}{what} {name!r} is not a valid name", hint="give a plain relative name")
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or "\\" in name:
        raise BadInput(
            f"{where}{what} {name!r} leaves its folder {root}",
            hint=f"a {what} must be a plain name inside {root} (no '/' at the start, no '..')",
        )
    target = Path(root) / name
    try:
        root_real, real = Path(root).resolve(), target.resolve()
    except (RuntimeError, OSError) as err:  # a link loop: RuntimeError up to Python 3.12, OSError(ELOOP) from 3.13
        raise BadInput(
            f"{where}{what} {name!r}: {target} is a symbolic link loop ({err})",
            hint="replace the looping link with the file or folder itself",
        ) from None
    if real != root_real and root_real not in real.parents:
        raise BadInput(
            f"{where}{what} {name!r} resolves outside {root} (to {real})",
            hint=f"keep {what}s inside {root}; remove the symbolic link that leads out",
        )
    return target


def plain_name(name: object, *, what: str, source: str | os.PathLike[str] | None = None) -> str:
    """A single path component (a file name from data): no separators, no '..'."""
    where = f"{source}: " if source else ""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise BadInput(
            f"{where}{what} {name!r} is not a plain file name",
            hint=f"a {what} has no '/' and is not '..'; re-create the file with the command that made it",
        )
    return name


# --- writing ---------------------------------------------------------------------------------


def fsync_dir(path: str | os.PathLike[str]) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@overload
def atomic_output(
    path: str | os.PathLike[str], *, binary: Literal[False] = False, mode: int | None = None
) -> AbstractContextManager[TextIO]: ...
@overload
def atomic_output(
    path: str | os.PathLike[str], *, binary: Literal[True], mode: int | None = None
) -> AbstractContextManager[BinaryIO]: ...
@overload
def atomic_output(
    path: str | os.PathLike[str], *, binary: bool, mode: int | None = None
) -> AbstractContextManager[TextIO | BinaryIO]: ...
def atomic_output(
    path: str | os.PathLike[str], *, binary: bool = False, mode: int | None = None
) -> AbstractContextManager[TextIO | BinaryIO]:
    """Write `path` through a temp file in its folder; on success fsync, rename, fsync the folder.

    On any failure (Ctrl-C included) the temp file is removed and `path` is untouched. Yields a binary
    file with binary=True, else a UTF-8 text file.
    """
    return _atomic_output(Path(path), binary=binary, mode=mode)


@contextlib.contextmanager
def _atomic_output(path: Path, *, binary: bool, mode: int | None) -> Iterator[TextIO | BinaryIO]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}.")
    except OSError as err:
        raise os_error(err, path, "write") from None
    try:
        fh: TextIO | BinaryIO
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes 0600 files; give the mode open() would (0666 less the umask) unless told.
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise os_error(err, path, "write") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def publish(tmp: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Put a finished file that another writer made at `tmp` (a library, a subprocess) in place as `dest`,
    atomically: fsync it, rename it over `dest`, fsync the folder. OSError propagates: the caller names what it stored."""
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dest)
    fsync_dir(Path(dest).parent)


def move_aside(path: str | os.PathLike[str], to: str | os.PathLike[str], *, what: str) -> Path:
    """Rename a bad file (corrupt, mismatching) out of the way, kept for a look; OSError becomes a user error."""
    try:
        os.replace(path, to)
    except OSError as err:
        raise os_error(err, path, f"move {what} aside") from None
    return Path(to)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once at import: os.umask is process-wide, not safe to flip while threads write


def _umask() -> int:
    return _UMASK


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> Path:
    with atomic_output(path, binary=True, mode=mode) as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, mode: int | None = None) -> Path:
    with atomic_output(path, mode=mode) as fh:
        fh.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike[str], data: object, *, indent: int | None = 2, sort_keys: bool = False) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=indent, sort_keys=sort_keys, allow_nan=False) + "\n")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid may still run (a leftover named by its writer's pid is kept while it does).
    Alive under another user, or not a valid pid: True (leave its files alone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def clean_stale_temps(
    folder: str | os.PathLike[str], *, prefixes: tuple[str, ...] = (TEMP_PREFIX,), older_than_s: float = 0.0
) -> list[Path]:
    """Remove temp files a killed run left in `folder` (not recursive). Returns what was removed."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith(prefixes) and entry.is_file() and not entry.is_symlink():
            try:
                if now - entry.stat().st_mtime >= older_than_s:
                    entry.unlink()
                    removed.append(entry)
            except OSError:
                pass
    return removed


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes (the one helper; OSError becomes a user error)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while block := fh.read(chunk):
                h.update(block)
    except OSError as err:
        raise os_error(err, path, "read") from None
    return h.hexdigest()
