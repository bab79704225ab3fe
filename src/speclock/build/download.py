"""Copy the bytes at a URL (https or file://) into an open file: retries for the network, a stop
event checked between chunks (Ctrl-C), and errors that say whether the network, the server or the local disk failed."""

from __future__ import annotations

import http.client
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from speclock.core.errors import EnvironmentProblem
from speclock.core.files import os_error

CHUNK = 1 << 16
RETRIES = 3
TIMEOUT_S = 60


class Stopped(Exception):
    """A download noticed the stop event (Ctrl-C or another download's failure)."""


NEVER = threading.Event()  # the stop event of a download nobody stops


def ssl_context() -> ssl.SSLContext:
    """Honour the user's CA bundle (intercepting proxies): PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return ssl.create_default_context(cafile=os.environ[var])
    return ssl.create_default_context()


def local_path(url: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))


def _write(out: BinaryIO, block: bytes, dest: Path) -> None:
    """Write to the local .part file: an OSError here is the local disk's (full, read-only), never the network's."""
    try:
        out.write(block)
    except OSError as err:
        raise os_error(err, dest, "write the download to") from None


def _copy_local(src: Path, out: BinaryIO, dest: Path, stop: threading.Event, on_bytes: Callable[[int], None]) -> None:
    try:
        fh = open(src, "rb")
    except OSError as err:
        raise os_error(err, src, "read the local wheel") from None
    with fh:
        while True:
            if stop.is_set():
                raise Stopped()
            try:
                block = fh.read(CHUNK)
            except OSError as err:
                raise os_error(err, src, "read the local wheel") from None
            if not block:
                return
            _write(out, block, dest)
            on_bytes(len(block))


def download(
    url: str,
    out: BinaryIO,
    dest: Path,
    stop: threading.Event = NEVER,
    on_bytes: Callable[[int], None] = lambda n: None,
    on_size: Callable[[int], None] = lambda n: None,
) -> None:
    """Copy the bytes at `url` into `out` (the open .part file `dest`). For progress: `on_size(n)` with the
    size once known (Content-Length, or the local file's), `on_bytes(n)` after each block.

    Network failures and server errors (5xx, 408, 429) are retried; a 4xx is final ("not found at URL"
    for 404/410); a failure of the local disk is reported as such and not retried."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        src = local_path(url)
        if not src.is_file():
            raise EnvironmentProblem(
                f"the lock names a local file that is not on this machine: {src}",
                hint="re-lock on this machine (`speclock lock --stack NAME`), or put that wheel where the lock says",
            )
        on_size(src.stat().st_size)
        _copy_local(src, out, dest, stop, on_bytes)
        return
    last: BaseException | None = None
    for attempt in range(RETRIES):
        if attempt:
            if stop.wait(2.0 * attempt):  # back off, but wake at once on Ctrl-C
                raise Stopped()
            try:
                out.seek(0)
                out.truncate()
            except OSError as err:
                raise os_error(err, dest, "write the download to") from None
        if stop.is_set():
            raise Stopped()
        try:
            resp = urllib.request.urlopen(url, timeout=TIMEOUT_S, context=ssl_context())
        except urllib.error.HTTPError as err:
            if err.code in (404, 410):
                raise EnvironmentProblem(
                    f"not found at {url} (HTTP {err.code}): the index no longer serves the file the lock names",
                    hint="the index removed the file (a yanked or deleted release): re-lock with "
                    "`speclock lock --stack NAME` and review the diff, or fetch from a mirror that still has it",
                ) from None
            if 400 <= err.code < 500 and err.code not in (408, 429):
                raise EnvironmentProblem(
                    f"{url} was refused by the server (HTTP {err.code} {err.reason})",
                    hint="check access to the index (credentials, proxy) or re-lock",
                ) from None
            last = err  # 5xx, 408, 429: the server may recover
            continue
        except ssl.SSLCertVerificationError as err:
            raise EnvironmentProblem(
                f"could not download {url}: the server's TLS certificate is not trusted ({err.verify_message})",
                hint="behind an intercepting proxy, set PIP_CERT or SSL_CERT_FILE to its CA bundle",
            ) from None
        except (OSError, http.client.HTTPException, ValueError) as err:
            last = err  # DNS, refused connection, timeout, reset: the network
            continue
        with resp:
            if resp.length:
                on_size(resp.length)
            try:
                while True:
                    if stop.is_set():
                        raise Stopped()
                    block = resp.read1(CHUNK)  # what has arrived, so a stop is seen between chunks
                    if not block:
                        break
                    _write(out, block, dest)
                    on_bytes(len(block))
            except (OSError, http.client.HTTPException) as err:
                last = err
                continue
            if resp.length:  # the connection closed before Content-Length bytes came
                last = http.client.IncompleteRead(b"", resp.length)
                continue
        return
    raise EnvironmentProblem(
        f"could not download {url} after {RETRIES} attempts: {last}",
        hint="check network access to the index (and PIP_CERT/SSL_CERT_FILE behind a proxy)",
    )
