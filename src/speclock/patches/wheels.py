"""Engine wheels for checking a series against any release: found, downloaded, sha256-verified on every use."""

from __future__ import annotations

import hashlib
import html
import http.client
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import urllib.response
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import atomic_output, atomic_write_json, clean_stale_temps, file_sha256, os_error, plain_name
from speclock.core.heartbeat import Progress
from speclock.core.jsonread import loads
from speclock.core.layout import REPO_ROOT, cache_dir
from speclock.core.names import normalize, wheel_name_parts
from speclock.core.versions import version_key

# Engine wheels downloaded to check a series against another release live in <cache>/wheels, each
# with a sidecar <wheel>.sha256 (JSON: sha256, url, source) saying which hash its bytes must have
# and where that hash came from (a lock, or the index at download time). Every use re-hashes the
# wheel; a wheel that does not match (truncated, corrupted, tampered) is deleted and downloaded again.
WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+!-]*\.whl")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_STALE_TEMP_S = 60.0  # a temp untouched this long is a killed run's leftover (a live download writes constantly)
_TRIES = 3
_RETRY_PAUSE_S = 1.0


@dataclass
class WheelSource:
    filename: str
    url: str
    sha256: str  # "" when the index gave no hash
    source: str  # where the hash came from, for messages


class _Transient(Exception):
    """A network failure worth one more try (not an OSError, so atomic_output does not remap it)."""


def _same_version(a: str, b: str) -> bool:
    try:
        return version_key(a) == version_key(b) and a.partition("+")[2].lower() == b.partition("+")[2].lower()
    except ValueError:
        return False


def wheel_matches(filename: str, package: str, version: str) -> bool:
    """Is `filename` a wheel of package==version (any platform), with a safe plain name?"""
    if not WHEEL_NAME.fullmatch(filename) or filename.startswith(".."):
        return False
    parts = wheel_name_parts(filename)
    return parts is not None and normalize(parts[0]) == normalize(package) and _same_version(parts[1], version)


def index_url() -> str:
    """The package index (PEP 503/691 simple API): SPECLOCK_INDEX_URL, PIP_INDEX_URL, or PyPI."""
    return (os.environ.get("SPECLOCK_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")


def _ssl_context() -> ssl.SSLContext:
    """Honour the user's CA bundle (intercepting proxies): PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return ssl.create_default_context(cafile=os.environ[var])
    return ssl.create_default_context()


def _open(url: str, what: str, accept: str = "*/*") -> http.client.HTTPResponse | urllib.response.addinfourl:
    """urlopen with the errors sorted: 404/410 -> BadInput (never retried), other 4xx -> EnvironmentProblem,
    5xx and connection errors -> _Transient."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("https", "http", "file"):
        raise BadInput(f"{what}: unsupported URL {url!r}", hint="use an https:// (or file://) index")
    if parsed.scheme == "file" and url.endswith("/"):
        url += "index.html"  # a simple index laid out on disk
    req = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "speclock"})
    try:
        # an HTTPResponse for http(s), an addinfourl for file: (typeshed says Any)
        resp: http.client.HTTPResponse | urllib.response.addinfourl = urllib.request.urlopen(
            req, timeout=60, context=_ssl_context() if parsed.scheme == "https" else None
        )
        return resp
    except urllib.error.HTTPError as err:
        if err.code in (404, 410):
            raise BadInput(
                f"{what}: not found at {url} (HTTP {err.code})",
                hint="check the package name and version (pip index versions NAME) and the index URL",
            ) from None
        if err.code < 500:
            raise EnvironmentProblem(
                f"{what}: {url} answered HTTP {err.code} {err.reason}", hint="check access to the index (credentials, proxy)"
            ) from None
        raise _Transient(f"{url} answered HTTP {err.code}") from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, (FileNotFoundError, NotADirectoryError)):
            raise BadInput(f"{what}: not found at {url}", hint="check the index URL") from None
        raise _Transient(f"{url}: {err.reason}") from None
    except (OSError, http.client.HTTPException) as err:
        raise _Transient(f"{url}: {err}") from None


_T = TypeVar("_T")


def _retrying(fn: Callable[[], _T], what: str) -> _T:
    last: _Transient | None = None
    for attempt in range(_TRIES):
        try:
            return fn()
        except _Transient as err:
            last = err
            if attempt + 1 < _TRIES:
                time.sleep(_RETRY_PAUSE_S * (attempt + 1))
    raise EnvironmentProblem(
        f"{what}: {last} (tried {_TRIES} times)",
        hint="check network access to the index (and PIP_CERT/SSL_CERT_FILE behind a proxy)",
    )


def locked_wheels(package: str, version: str, locks: Path | None = None) -> list[WheelSource]:
    """Wheels of package==version that a committed lock pins (url and sha256 known in advance)."""
    out = []
    for lock in sorted((locks or REPO_ROOT / "locks").glob("*.lock")):
        try:
            data = loads(lock.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not this command's input: the lock's own reader reports a broken lock
        pkgs = data.get("packages") if isinstance(data, dict) else None
        for pkg in pkgs if isinstance(pkgs, list) else []:
            if (
                isinstance(pkg, dict)
                and all(isinstance(pkg.get(k), str) for k in ("filename", "url", "sha256"))
                and wheel_matches(pkg["filename"], package, version)
                and _SHA256.fullmatch(pkg["sha256"])
                and pkg["url"].startswith("https://")
            ):
                out.append(WheelSource(pkg["filename"], pkg["url"], pkg["sha256"], f"lock {lock.name}"))
    return out


def index_wheels(package: str, version: str) -> list[WheelSource]:
    """Wheels of package==version on the index, with the sha256 it publishes (JSON API or #sha256= links)."""
    page = f"{index_url()}/{normalize(package)}/"
    what = f"looking up {package}=={version}"

    def get() -> tuple[bytes, str]:
        with _open(page, what, accept="application/vnd.pypi.simple.v1+json, text/html;q=0.1") as resp:
            try:
                return resp.read(), resp.headers.get("Content-Type", "")
            except (OSError, http.client.HTTPException) as err:
                raise _Transient(f"{page}: {err}") from None

    body, ctype = _retrying(get, what)
    entries: list[tuple[str, str, str]] = []  # filename, url, sha256
    if "json" in ctype:
        try:
            doc = loads(body)
        except ValueError:
            doc = None
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, list):
            raise EnvironmentProblem(f"{what}: {page} answered JSON without a 'files' list", hint="check the index URL")
        for f in files:
            if isinstance(f, dict) and isinstance(f.get("filename"), str) and isinstance(f.get("url"), str):
                hashes = f.get("hashes")
                sha = hashes.get("sha256") if isinstance(hashes, dict) else None
                entries.append((f["filename"], urllib.parse.urljoin(page, f["url"]), sha if isinstance(sha, str) else ""))
    else:
        text = body.decode("utf-8", "replace")
        for href, label in re.findall(r"<a\s[^>]*?href=\"([^\"]*)\"[^>]*>([^<]*)</a>", text, re.I):
            entries.append((html.unescape(label).strip(), urllib.parse.urljoin(page, html.unescape(href)), ""))
    out = []
    for filename, url, sha in entries:
        base, _, fragment = url.partition("#")
        frag = urllib.parse.parse_qs(fragment).get("sha256", [""])[0]
        sha = (sha or frag).lower()
        if wheel_matches(filename, package, version):
            out.append(
                WheelSource(
                    filename,
                    base,
                    sha if _SHA256.fullmatch(sha) else "",
                    f"index {page}" if sha else "computed at download (the index gave no hash)",
                )
            )
    if not out:
        raise BadInput(
            f"{package}=={version} is not a released version with a wheel at {page}",
            hint=f"list releases with: pip index versions {package}",
        )
    return out


def _rank(sources: list[WheelSource]) -> list[WheelSource]:
    """This interpreter's own wheel first (pip's choice), any other platform's after (its sources are the same)."""
    try:
        # optional (packaging, not a speclock dependency): imported only where it is used
        from packaging.tags import sys_tags
        from packaging.utils import parse_wheel_filename

        order = {str(t): n for n, t in enumerate(sys_tags())}

        def key(s: WheelSource) -> tuple[int, str]:
            try:
                return (
                    min((order.get(str(t), 1 << 30) for t in parse_wheel_filename(s.filename)[3]), default=1 << 30),
                    s.filename,
                )
            except Exception:
                return (1 << 30, s.filename)
    except ImportError:

        def key(s: WheelSource) -> tuple[int, str]:
            return (0 if "x86_64" in s.filename or "none-any" in s.filename else 1, s.filename)

    return sorted(sources, key=key)


def _sidecar(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + ".sha256")


def _read_sidecar(wheel: Path) -> tuple[str, str] | None:
    try:
        doc = loads(_sidecar(wheel).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing or damaged: the hash is looked up again
    if isinstance(doc, dict) and isinstance(doc.get("sha256"), str) and _SHA256.fullmatch(doc["sha256"]):
        return doc["sha256"], str(doc.get("source") or "sidecar")
    return None


def _discard(path: Path) -> None:
    for p in (path, _sidecar(path)):
        try:
            p.unlink(missing_ok=True)
        except OSError as err:
            raise os_error(err, p, "remove the corrupt cached wheel") from None


def _write_block(fh: BinaryIO, block: bytes) -> None:
    fh.write(block)  # one place for writes, so a test can make the disk full


def _download(src: WheelSource, dest: Path, log: Progress) -> Path:
    target = dest / plain_name(src.filename, what="wheel file name", source=src.url)
    what = f"downloading {src.filename}"

    def once() -> str:
        h = hashlib.sha256()
        with _open(src.url, what) as resp, atomic_output(target, binary=True) as fh:
            while True:
                try:
                    block = resp.read(1 << 20)
                except (OSError, http.client.HTTPException) as err:
                    raise _Transient(f"{src.url}: transfer broke: {err}") from None
                if not block:
                    break
                h.update(block)
                _write_block(fh, block)
            digest = h.hexdigest()
            if src.sha256 and digest != src.sha256:  # a short or altered transfer: the temp file is dropped
                raise _Transient(f"the bytes from {src.url} have sha256 {digest}, the {src.source} says {src.sha256}")
        return digest

    log(f"downloading {src.filename} from {src.url} into {dest}")
    digest = _retrying(once, what)
    atomic_write_json(_sidecar(target), {"sha256": digest, "url": src.url, "source": src.source})
    return target


def fetch_wheel(package: str, version: str, log: Progress = print) -> Path:
    """The engine's wheel (no dependencies) from the cache, verified by sha256 on every use; downloaded if
    absent or corrupt. The expected hash comes from a committed lock, else from the index at download time."""
    dest = cache_dir() / "wheels"
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, dest, "create the wheel cache") from None
    clean_stale_temps(dest, older_than_s=_STALE_TEMP_S)
    locked = locked_wheels(package, version)
    known = {s.filename: s for s in locked}
    looked_up: list[WheelSource] | None = None
    for wheel in sorted(w for w in dest.glob("*.whl") if wheel_matches(w.name, package, version)):
        if wheel.name in known:
            want, source = known[wheel.name].sha256, known[wheel.name].source
        else:
            side = _read_sidecar(wheel)
            if side is None:  # no record of its hash (an older cache): ask the index
                looked_up = looked_up if looked_up is not None else index_wheels(package, version)
                match = next((s for s in looked_up if s.filename == wheel.name and s.sha256), None)
                side = (match.sha256, match.source) if match else None
            want, source = side if side else ("", "nothing")
        if want and file_sha256(wheel) == want:
            if not _read_sidecar(wheel):
                atomic_write_json(_sidecar(wheel), {"sha256": want, "url": "", "source": source})
            return wheel
        log(f"cached {wheel} does not match its sha256 (from {source}): deleting it and downloading it again")
        _discard(wheel)
    sources = _rank(locked or (looked_up if looked_up is not None else index_wheels(package, version)))
    return _download(sources[0], dest, log)
