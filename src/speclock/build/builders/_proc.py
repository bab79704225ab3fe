"""Running builder commands: stream output with a prefix, keep the tail for error messages."""

from __future__ import annotations

import collections
import subprocess
import sys
from typing import Sequence

from speclock.core.errors import EnvironmentProblem


def stream(cmd: Sequence[str], *, env: dict[str, str] | None = None, prefix: str = "  | ",
           quiet: bool = False) -> tuple[int, str]:
    """Run `cmd`, echoing each output line (progress on long steps); return (rc, last lines)."""
    tail: collections.deque[str] = collections.deque(maxlen=40)
    try:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, bufsize=1, errors="replace")
    except FileNotFoundError:
        raise EnvironmentProblem(f"{cmd[0]} is not installed", hint=f"install {cmd[0]} or choose another --builder") from None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip())
            if not quiet:
                sys.stderr.write(prefix + line)  # progress for people; stdout stays for results (--json)
                sys.stderr.flush()
        return proc.wait(), "\n".join(tail)
    except BaseException:
        # Ctrl-C (or any failure here): stop the builder too, never leave it running behind us
        stop(proc)
        raise


def stop(proc: subprocess.Popen, grace_s: float = 1.5) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: a Ctrl-C ends the command within about 2 s."""
    if proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass


def capture(cmd: Sequence[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, env=env)
    except FileNotFoundError:
        raise EnvironmentProblem(f"{cmd[0]} is not installed", hint=f"install {cmd[0]} or choose another --builder") from None
