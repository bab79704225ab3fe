"""Running builder commands: stream output with a prefix, keep the tail for error messages."""

from __future__ import annotations

import collections
import contextlib
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from speclock.core.errors import CheckFailed, EnvironmentProblem
from speclock.core.heartbeat import SilenceHeartbeat
from speclock.core.jsonread import parse_json


def tool_json(text: str, command: str, *, expect: type | tuple[type, ...] = dict) -> Any:  # the caller reads its fields
    """A builder's JSON answer; a damaged one is the builder's fault (exit 3), naming the command."""
    return parse_json(text, f"`{command}`", what="output", expect=expect, error=EnvironmentProblem, allow_nan=True)


def stream(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, prefix: str = "  | ", quiet: bool = False, watch: Path | None = None
) -> tuple[int, str]:
    """Run `cmd`, echoing each output line (progress on long steps); return (rc, last lines).

    While it prints nothing (a layer commit writes gigabytes silently), a heartbeat line every 15 s says
    for how long, and how fast the disk holding `watch` (the builder's storage) fills."""
    tail: collections.deque[str] = collections.deque(maxlen=40)
    try:
        proc = subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1, errors="replace"
        )
    except FileNotFoundError:
        raise EnvironmentProblem(f"{cmd[0]} is not installed", hint=f"install {cmd[0]} or choose another --builder") from None
    assert proc.stdout is not None

    def say(text: str) -> None:
        sys.stderr.write(prefix + text + "\n")
        sys.stderr.flush()

    try:
        with SilenceHeartbeat(watch, progress=say) if not quiet else contextlib.nullcontext() as beat:
            for line in proc.stdout:
                tail.append(line.rstrip())
                if beat is not None:  # not quiet
                    beat.seen()
                    sys.stderr.write(prefix + line)  # progress for people; stdout stays for results (--json)
                    sys.stderr.flush()
        return proc.wait(), "\n".join(tail)
    except BaseException:
        # Ctrl-C (or any failure here): stop the builder too, never leave it running behind us
        stop(proc)
        raise


def build_failure(builder: str, rc: int, tail: str) -> Exception:
    """The error for a failed build: a full disk is the machine's problem (exit 3), anything else the build's (1)."""
    if "no space left on device" in tail.lower():
        return EnvironmentProblem(
            f"{builder} build failed: the disk is full (no space left on device):\n{tail[-1200:]}",
            hint="free space (GPU images need about 20 GB while building: the venv layer is written "
            "twice, then copied into docker for the self-check), e.g. remove old images, "
            "then build again",
        )
    return CheckFailed(
        f"{builder} build failed (exit {rc}):\n{tail[-2500:]}",
        hint="read the step output above; fix the input it names and build again",
    )


def stop(proc: subprocess.Popen[str], grace_s: float = 1.5) -> None:
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


def capture(cmd: Sequence[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, env=env)
    except FileNotFoundError:
        raise EnvironmentProblem(f"{cmd[0]} is not installed", hint=f"install {cmd[0]} or choose another --builder") from None
