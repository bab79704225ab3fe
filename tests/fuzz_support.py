"""Shared checks for the bad-input tests: run the CLI in-process, assert the one rule.

The rule (issue: a verdict no bad input can crash, forge or bypass): every input ends in exit
0, 1 (only where a check may legitimately fail), 2 (bad input) or 3 (environment), prints no
traceback, and writes nothing outside the outputs the command was told to write.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from speclock.cli import main

ALLOWED = (0, 2, 3)


def run_cli(*argv: str, env: dict | None = None) -> tuple[int, str, str]:
    """Run `speclock ARGV` in this process; returns (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as stop:  # argparse
                code = stop.code if isinstance(stop.code, int) else 2
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, out.getvalue(), err.getvalue()


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file under the roots with (size, mtime_ns): compare two to see what a command wrote."""
    files = {}
    for root in roots:
        if root.is_file():
            st = root.stat()
            files[str(root)] = (st.st_size, st.st_mtime_ns)
            continue
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                p = Path(dirpath, name)
                with contextlib.suppress(OSError):
                    st = p.lstat()
                    files[str(p)] = (st.st_size, st.st_mtime_ns)
    return files


def assert_clean_refusal(code: int, stderr: str, *, allowed: tuple[int, ...] = ALLOWED, names: str | None = None) -> None:
    """Exit code in `allowed`, no traceback; a refusal (2, 3) says what to do and, if given, names `names`."""
    assert code in allowed, f"exit {code}, expected one of {allowed}:\n{stderr[-2000:]}"
    assert "Traceback (most recent call last)" not in stderr, stderr[-3000:]
    assert "unexpected failure" not in stderr, stderr[-2000:]
    if code in (2, 3):
        assert "error:" in stderr, stderr[-2000:]
        if names:
            assert names in stderr, f"the message does not name {names!r}:\n{stderr[-2000:]}"


def assert_nothing_written(before: dict, after: dict, *, except_under: tuple[Path, ...] = ()) -> None:
    changed = [
        p
        for p in set(before) | set(after)
        if before.get(p) != after.get(p) and not any(p.startswith(str(e)) for e in except_under)
    ]
    assert not changed, f"written outside the intended outputs: {sorted(changed)[:10]}"
