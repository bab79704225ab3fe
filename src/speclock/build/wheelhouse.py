"""The wheelhouse: a sha256-verified, content-addressed store of the locked files, outside git.

Layout: `<cache>/wheelhouse/<sha256>/<filename>`. An entry exists only once its bytes hash to
its name (downloaded to a `.part-*` temp file, verified, then renamed), so a crash never leaves a
half-written entry. Every use re-verifies (hashing again unless the file is provably untouched since
it was last hashed: same inode, size, mtime and ctime); a corrupted, truncated or tampered file is moved aside
and fetched again, and a download that does not match the lock is refused, naming where the bytes
came from. Temp files a killed run left are removed by the next run (clean_leftovers).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import threading
import zipfile
from pathlib import Path

from speclock.build.download import NEVER, Stopped, download, local_path
from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import TEMP_PREFIX, atomic_write_text, clean_stale_temps, confined, file_sha256, os_error, plain_name
from speclock.core.heartbeat import ByteHeartbeat, Progress
from speclock.core.jsonread import loads
from speclock.core.layout import cache_dir
from speclock.spec.lock import LockDoc, LockEntry

PART_PREFIX = ".part-"
# A download writes its .part file at every chunk and gives up after TIMEOUT_S without data, so a
# .part (or writer temp) untouched for this long belongs to no running fetch: a killed run left it.
# Age by mtime needs no lock file shared between processes, and never races a live download.
STALE_S = 600
_HEX64 = re.compile(r"[0-9a-f]{64}")

_parts: set[Path] = set()  # .part files being written now, removed by fetch after an interrupt
_parts_lock = threading.Lock()
# Verified files: path -> (inode, size, mtime_ns, ctime_ns, sha256). A verification is reused only while the
# file is provably untouched since (ctime changes on any write, utime, rename or new link, and cannot be set
# back). Kept across runs in the store's STAMPS file, so an unchanged wheelhouse is not hashed again on every
# build (3.4 GB, seconds); the install step's --require-hashes still checks every byte it installs.
_verified: dict[Path, tuple[int, int, int, int, str]] = {}
_stamps_loaded: set[Path] = set()
_stamps_lock = threading.Lock()
STAMPS = ".verified.json"


def store_dir() -> Path:
    path = cache_dir() / "wheelhouse"
    if (path.exists() or path.is_symlink()) and not path.is_dir():
        raise BadInput(
            f"{path} is a file, where the wheelhouse folder belongs",
            hint="move that file away, or point SPECLOCK_CACHE at another folder",
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, path, "make the wheelhouse folder") from None
    return path


def entry_path(pkg: LockEntry, store: Path | None = None) -> Path:
    """`<store>/<sha256>/<filename>`, confined to the store (read_lock already refused bad names)."""
    root = store or store_dir()
    sha, name = pkg["sha256"], pkg["filename"]
    if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
        raise BadInput(
            f"lock entry {pkg.get('name')!r}: sha256 {sha!r} is not 64 hex digits",
            hint="re-create the lock with `speclock lock --stack NAME`",
        )
    plain_name(name, what=f"filename of {pkg.get('name')!r}")
    return _within(root, sha, name, what="wheelhouse entry")


def _within(root: Path, *names: str, what: str) -> Path:
    """root/names..., each a plain name (checked by the caller): inside root unless one of them is a symbolic link,
    so only then is the path resolved (core.files.confined: two resolves per call, 0.05 s of every build's 300)."""
    path = root.joinpath(*names)
    here = root
    for name in names:
        here = here / name
        if os.path.islink(here):
            return confined(root, "/".join(names), what=what)
    return path


def _remember(path: Path, sha: str) -> None:
    try:
        st = path.stat()
    except OSError:
        return
    _verified[path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha)


def _still_verified(path: Path, sha: str) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return _verified.get(path) == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha)


def _load_stamps(store: Path) -> None:
    """Merge the store's recorded verifications into _verified, once per store and process (a damaged
    record is ignored: everything is hashed again)."""
    with _stamps_lock:
        if store in _stamps_loaded:
            return
        _stamps_loaded.add(store)
        try:
            data = loads((store / STAMPS).read_text())
        except (OSError, ValueError):
            return
        if not isinstance(data, dict):
            return
        for rel, stamp in data.items():
            if (
                isinstance(rel, str)
                and isinstance(stamp, list)
                and len(stamp) == 5
                and all(isinstance(x, int) for x in stamp[:4])
                and isinstance(stamp[4], str)
            ):
                _verified.setdefault(store / rel, (stamp[0], stamp[1], stamp[2], stamp[3], stamp[4]))


def save_stamps(store: Path) -> None:
    """Record this process's verifications of files in `store` (atomic; best effort: a read-only store
    only means hashing again next time)."""
    with _stamps_lock:
        entries = {p.relative_to(store).as_posix(): list(v) for p, v in _verified.items() if p.parent.parent == store}
    try:
        atomic_write_text(store / STAMPS, json.dumps(entries, sort_keys=True) + "\n")
    except (OSError, BadInput):
        pass


def ensure_entry(
    pkg: LockEntry,
    store: Path | None = None,
    *,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
) -> tuple[Path, str]:
    """Make sure the verified file for `pkg` is in the store. Returns (path, what happened). With `progress`,
    a download reports its bytes, total and rate every 10 s (a 600 MB wheel takes minutes on a slow link).

    A cached file is hashed on every call; a corrupt or truncated one is quarantined and fetched again."""
    stop = stop or NEVER
    path = entry_path(pkg, store)
    _load_stamps(path.parent.parent)
    if path.is_file():
        if _still_verified(path, pkg["sha256"]):
            return path, "cached"
        if file_sha256(path) == pkg["sha256"]:
            _remember(path, pkg["sha256"])
            return path, "cached"
        # Corrupted, truncated or tampered: keep the evidence out of the store, fetch a good copy.
        quarantine = path.parent.parent / ".quarantine"
        try:
            quarantine.mkdir(exist_ok=True)
            os.replace(path, quarantine / f"{pkg['sha256'][:12]}-{pkg['filename']}")
        except OSError as err:
            raise os_error(err, path, "move the corrupt wheelhouse entry aside") from None
        outcome = "refetched (cached copy failed its sha256)"
    elif path.exists() or path.is_symlink():
        raise BadInput(
            f"{path} is not a regular file, where a wheelhouse entry belongs", hint=f"remove it (rm -r {path}) and fetch again"
        )
    else:
        outcome = "downloaded"
    mirror = pkg.get("mirror_url", "")
    if mirror.startswith("file://") and local_path(mirror).is_file():
        url, source = mirror, f"the local mirror {local_path(mirror)}"  # same bytes, no network
    else:
        url, source = pkg["url"], (str(local_path(pkg["url"])) if pkg["url"].startswith("file://") else pkg["url"])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=PART_PREFIX, dir=path.parent)
    except OSError as err:
        raise os_error(err, path.parent, "make a wheelhouse entry in") from None
    tmp = Path(tmp_name)
    with _parts_lock:
        _parts.add(tmp)
    try:
        with os.fdopen(fd, "wb") as out:
            if progress:
                beat = ByteHeartbeat(pkg["filename"], progress=progress)
                download(url, out, tmp, stop, on_bytes=beat.add, on_size=beat.set_total)
            else:
                download(url, out, tmp, stop)
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as err:
                raise os_error(err, tmp, "write the download to") from None
        if stop.is_set():
            raise Stopped()
        actual = file_sha256(tmp)
        if actual != pkg["sha256"]:
            raise CheckFailed(
                f"{pkg['filename']} from {source} has sha256 {actual}, the lock says {pkg['sha256']}: refused",
                hint="the source served different bytes than when the lock was made; investigate before "
                "re-locking (`speclock lock --stack NAME`)",
            )
        try:
            os.replace(tmp, path)
        except OSError as err:
            raise os_error(err, path, "store the verified download as") from None
    finally:
        tmp.unlink(missing_ok=True)
        with _parts_lock:
            _parts.discard(tmp)
    _remember(path, pkg["sha256"])
    return path, outcome


def remove_parts() -> None:
    """Remove the .part files of downloads still running (after a stop): their threads die at exit."""
    with _parts_lock:
        leftover = list(_parts)
    for part in leftover:
        part.unlink(missing_ok=True)


def clean_leftovers(store: Path) -> list[Path]:
    """Remove temp files (`.part-*`, writer temps) that a killed fetch left in the store's entry folders.

    Only in the store's own `<sha256>/` folders and the store root, and only files untouched for
    STALE_S seconds, so a fetch running at the same time keeps its temp files."""
    removed = clean_stale_temps(store, prefixes=(PART_PREFIX, TEMP_PREFIX), older_than_s=STALE_S)
    try:
        folders = [d for d in store.iterdir() if _HEX64.fullmatch(d.name) and d.is_dir() and not d.is_symlink()]
    except OSError:
        return removed
    for folder in folders:
        removed += clean_stale_temps(folder, prefixes=(PART_PREFIX, TEMP_PREFIX), older_than_s=STALE_S)
    return removed


def link_into(lock: LockDoc, dest: Path, *, store: Path | None = None) -> None:
    """Lay out a build's wheel directory: hard links (or copies) to verified store entries.

    Callers fetch first (build and upgrade do: `fetch` hashes every entry on every build); an entry
    that changed since this process verified it (truncated, rewritten) is verified again and, when
    corrupt, fetched again (ensure_entry). Entries this process never fetched are linked as they are."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, dest, "make the build's wheel folder") from None
    for pkg in lock["packages"] + lock["assets"]:
        src = entry_path(pkg, store)
        if not src.is_file():
            raise BadInput(f"{pkg['filename']} is not in the wheelhouse", hint=f"run `invoke fetch --stack {lock['stack']}`")
        if src in _verified and not _still_verified(src, pkg["sha256"]):
            src, _ = ensure_entry(pkg, store)
        target = _within(dest, plain_name(pkg["filename"], what="filename"), what="wheel")
        try:
            if target.is_file() and not target.is_symlink() and os.path.samestat(target.stat(), src.stat()):
                continue  # linked already: relinking would change the entry's ctime (and void its stamp)
            if target.exists() or target.is_symlink():
                target.unlink()
            try:
                os.link(src, target)
            except OSError as err:
                if err.errno == errno.ENOSPC:
                    raise
                shutil.copyfile(src, target)
        except OSError as err:
            raise os_error(err, target, "place the wheel at") from None


# --- wheels cached outside the lock (tools that `pip download` put in cache_dir()/wheels: cuobjdump) ---


def _wheel_sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def record_cached_wheel(path: Path) -> str:
    """After downloading a wheel into a cache: record its sha256 beside it (atomically)."""
    sha = file_sha256(path)
    atomic_write_text(_wheel_sidecar(path), sha + "\n")
    return sha


def cached_wheel_intact(path: Path) -> bool:
    """Before using a cached wheel: True when it still hashes to the recorded sha256. A wheel cached
    before sidecars existed is accepted once if it is a complete zip (a truncated one is not), and
    recorded. False means: delete it and download it again."""
    path = Path(path)
    if not path.is_file():
        return False
    side = _wheel_sidecar(path)
    try:
        recorded = side.read_text(encoding="ascii").strip() if side.is_file() else None
    except (OSError, UnicodeDecodeError):
        recorded = None
    if recorded is not None:
        return _HEX64.fullmatch(recorded) is not None and file_sha256(path) == recorded
    try:
        with zipfile.ZipFile(path) as zf:
            if zf.testzip() is not None:
                return False
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return False
    record_cached_wheel(path)
    return True


def requirements_text(packages: list[LockEntry]) -> str:
    """A pip requirements file with exact pins and hashes (`--require-hashes` mode)."""
    return "".join(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}\n" for p in packages)
