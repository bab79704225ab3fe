"""sha256 of the files a build reads, remembered by their stat (device, inode, size, mtime_ns, ctime_ns) across
builds, so a warm rebuild hashes only what changed since the last one (docs/benchmarks.md, "Warm rebuild (#37)").

Sound as the wheelhouse's stamps are (build.wheelhouse): every write moves a file's ctime, which no user call can
set back, and a rename or a new copy gives another inode. One gap remains, the one git calls "racily clean": the
kernel stamps mtime and ctime from a coarse clock, so a second write of the same size within one tick of the
first leaves the stat as it was. A digest is therefore remembered only for a file whose stat is older than
RACY_S when it is hashed; a file edited just now is hashed again on every build until it is older.

build-image keeps one memo per staged context (`remembering`, under the context's lock); `save` writes it
atomically, best effort (a memo that cannot be written or read only means hashing again), with the entries this
build looked up only. Outside `remembering` the memo lives for the process."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from speclock.core.errors import SpeclockError
from speclock.core.files import atomic_write_text, file_sha256
from speclock.core.jsonread import loads

RACY_S = 2.0  # seconds: a stat younger than this at hashing time is not remembered (see above)
Stamp = tuple[int, int, int, int, int]


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class DigestMemo:
    """{absolute path: (stamp, sha256)}: a file's digest while its stat is the one it was hashed at."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.known: dict[str, tuple[Stamp, str]] = {}
        self.used: set[str] = set()
        self.hashed = 0  # files read in this process (tests and benchmarks read it)
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            data = loads(path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(data, dict):
            return
        for name, entry in data.items():
            if (
                isinstance(entry, list)
                and len(entry) == 6
                and all(isinstance(x, int) and not isinstance(x, bool) for x in entry[:5])
                and isinstance(entry[5], str)
            ):
                self.known[name] = ((entry[0], entry[1], entry[2], entry[3], entry[4]), entry[5])

    def sha256(self, path: str | os.PathLike[str]) -> str:
        """The file's sha256: remembered while its stat is unchanged, hashed otherwise."""
        name = os.path.abspath(path)
        self.used.add(name)
        try:
            before = stamp(os.stat(name))
        except OSError:
            return file_sha256(name)  # names the problem as the one helper does
        kept = self.known.get(name)
        if kept is not None and kept[0] == before:
            return kept[1]
        digest = file_sha256(name)
        self.hashed += 1
        after = stamp(os.stat(name))
        if after == before and time.time_ns() - max(after[3], after[4]) > RACY_S * 1e9:
            self.known[name] = (after, digest)
        else:  # written while read, or just now: never remembered
            self.known.pop(name, None)
        return digest

    def save(self) -> None:
        if self.path is None:
            return
        entries = {name: [*st, sha] for name, (st, sha) in sorted(self.known.items()) if name in self.used}
        try:
            atomic_write_text(self.path, json.dumps(entries) + "\n")
        except (OSError, SpeclockError):
            pass


_active = DigestMemo()


def sha256(path: str | os.PathLike[str]) -> str:
    """The file's sha256 through the memo in use (build-image's, else this process's)."""
    return _active.sha256(path)


@contextlib.contextmanager
def remembering(path: Path) -> Iterator[DigestMemo]:
    """Use the memo kept at `path` while the block runs, and save it after (also when the block fails)."""
    global _active
    before, _active = _active, DigestMemo(path)
    try:
        yield _active
    finally:
        memo, _active = _active, before
        memo.save()
