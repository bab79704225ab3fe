"""Advisory file locks between speclock processes on one machine (two CI jobs, two test workers): a cache
entry that takes minutes to make is made by one process while the others wait, then reuse it."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path

from speclock.core.files import os_error


@contextlib.contextmanager
def exclusive(path: Path, *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block; `on_wait` is called once if
    another process holds it. The kernel drops the lock when the holder exits, killed or not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a")  # held open for the whole block
    except OSError as err:
        raise os_error(err, path, "open the lock file") from None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield
