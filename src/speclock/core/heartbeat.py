"""Progress for long work that prints nothing of its own: a line every few seconds with the bytes done, the
total when known, and the rate. Used for multi-GB downloads (fetch) and for builder steps that go silent
(a layer commit writes gigabytes without a line of output)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

EVERY_S = 10.0  # a download's report interval
SILENCE_S = 15.0  # how long a builder may print nothing before the first heartbeat line

# Where long work sends its progress lines: print, stderr, or a caller's collector (the one spelling of that type).
Progress = Callable[[str], None]


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class ByteHeartbeat:
    """Counts bytes as they come (`add`) and reports at most once every `every_s` seconds:
    `<what>: 312.4 MB of 554.6 MB (56%), 48.2 MB/s`. Quiet for work that ends before the first report."""

    def __init__(
        self,
        what: str,
        total: int | None = None,
        *,
        progress: Progress = print,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.what, self.total, self.progress, self.clock = what, total, progress, clock
        self.every_s = EVERY_S if every_s is None else every_s
        self.done = 0
        self.started = self.last = clock()

    def set_total(self, total: int) -> None:
        self.total = total

    def add(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self.progress(self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((self.clock() if now is None else now) - self.started, 1e-9)
        of = f" of {human_bytes(self.total)} ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return f"  ... {self.what}: {human_bytes(self.done)}{of}, {human_bytes(self.done / elapsed)}/s"


def used_bytes(path: Path) -> int:
    """Bytes in use on the filesystem holding `path` (statvfs: cheap, unlike walking a storage folder)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class SilenceHeartbeat:
    """While a child process prints nothing for `every_s` seconds, report how long it has been silent and
    how much more of the disk holding `watch` is used since the silence began, with the rate (other
    writers on that disk count too: the line says "the disk holding", not the builder's own bytes).
    `seen()` is called for every output line; use as a context manager around the read loop."""

    def __init__(
        self,
        watch: Path | None,
        *,
        progress: Progress,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.watch = watch if watch is not None and watch.exists() else None
        self.progress, self.clock = progress, clock
        self.every_s = SILENCE_S if every_s is None else every_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._mark()

    def _mark(self) -> None:
        with self._lock:
            self.quiet_since = self.clock()
            self.used_at_start = used_bytes(self.watch) if self.watch else 0

    def seen(self) -> None:
        self._mark()

    def line(self) -> str:
        with self._lock:
            quiet = self.clock() - self.quiet_since
            grown = used_bytes(self.watch) - self.used_at_start if self.watch else 0
        disk = (
            f"; {human_bytes(grown)} more used on the disk holding {self.watch}, {human_bytes(grown / max(quiet, 1e-9))}/s"
            if self.watch
            else ""
        )
        return f"(still running, no output for {quiet:.0f} s{disk})"

    def _run(self) -> None:
        reported = None
        while not self._stop.wait(min(self.every_s / 3, 5.0)):
            now = self.clock()
            with self._lock:
                quiet_since = self.quiet_since
            if now - quiet_since >= self.every_s and (
                reported is None or reported < quiet_since or now - reported >= self.every_s
            ):
                reported = now
                self.progress(self.line())

    def __enter__(self) -> SilenceHeartbeat:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
