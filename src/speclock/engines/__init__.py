"""Inference engines behind one small interface, chosen by name.

Each engine module (`vllm`, `sglang`, `reference`) provides `start(config) -> EngineSession`.
A session generates greedily from token ids and exposes the engine's speculative-decoding
counters as a cumulative `SpecCounters` snapshot; callers take deltas around a run, because
engines count since start (SGLang's `avg_spec_accept_length` is even an average since start).
Heavy imports (torch, vllm, sglang) happen inside the engine modules' functions.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Protocol

from speclock.core.errors import BadInput
from speclock.core.scratch import engine_run_folder
from speclock.drafter.counters import SpecCounters as SpecCounters  # re-exported: engines hand these out
from speclock.drafter.models import draft_aux_ids, read_model_config
from speclock.spec.stack import Stack

# Name -> module. `reference` is speclock's own PyTorch speculative decoder (the judge).
ENGINES: dict[str, str] = {
    "vllm": "speclock.engines.vllm",
    "sglang": "speclock.engines.sglang",
    "reference": "speclock.engines.reference",
}

# Server mode sends one request per prompt, this many at once: the server batches concurrent requests, as it
# does production traffic (1: one at a time).
DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True)
class EngineConfig:
    """What a smoke run asks of an engine: target, optional drafter, k and engine settings."""

    target: Path
    draft: Path | None = None
    num_speculative_tokens: int = 3
    settings: dict[str, Any] = field(default_factory=dict)  # stack [engine].settings
    server_url: str = ""  # attach to a running server instead of starting one in-process
    env: dict[str, str] = field(default_factory=dict)  # stack engine.env: set while the engine runs
    concurrency: int = DEFAULT_CONCURRENCY  # server mode: requests in flight at once (offline engines batch all)
    # engine.k_per_batch_size: (first batch size, last batch size, k) rows, k capped by num_speculative_tokens
    # (speclock.spec.k_schedule); () drafts num_speculative_tokens at every load
    k_per_batch_size: tuple[tuple[int, int, int], ...] = ()


class EngineSession(Protocol):
    """A started engine (or an attached server)."""

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Greedy completions (token ids) for each prompt, in order."""

    def counters(self) -> SpecCounters:
        """Cumulative spec-decode counters now (zeros without a drafter)."""

    def captured_layers(self) -> list[int] | None:
        """Target layers whose hidden states the engine feeds the drafter, as it resolved them."""

    def stop(self) -> None:
        """Release the engine (processes, memory); safe to call twice."""


class EngineModule(Protocol):
    NAME: str

    def start(self, config: EngineConfig) -> EngineSession: ...

    def version(self, package: str) -> str: ...


def visible_arch(stack: Stack) -> str | None:
    """The stack arch name of the visible GPU (sm_100 -> sm_100a when the stack targets that), or None."""
    if not stack.is_gpu:
        return None
    try:
        # heavy, optional (torch): imported only where it is used
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
    except Exception:
        return None
    plain = f"sm_{major}{minor}"
    return plain + "a" if plain + "a" in stack.gpu["archs"] else plain


def get_engine(name: str) -> ModuleType:
    """The engine module for `name` (imported lazily, so missing engines cost nothing)."""
    if name not in ENGINES:
        raise BadInput(f"unknown engine {name!r}", hint=f"known engines: {', '.join(ENGINES)}")
    return importlib.import_module(ENGINES[name])


def package_version(package: str) -> str:
    """Installed version of a distribution, or '' when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def aux_layer_ids(draft: Path, num_target_layers: int) -> tuple[list[int], str]:
    """The drafter's configured aux hidden-state layer ids and where they came from (config checked: BadInput)."""
    ids = draft_aux_ids(read_model_config(draft, what="drafter"))
    if ids:
        return ids, "draft config"
    n = num_target_layers
    return [2, n // 2, n - 3], "engine default (2, N//2, N-3)"


# --- starting and stopping engines: Ctrl-C must not leave an engine process behind ------------

STOP_GRACE_S = 1.0  # after Ctrl-C: how long stop() may take before the engine's processes are killed
KILL_GRACE_S = 0.4  # after SIGTERM, before SIGKILL


def descendants(root: int | None = None) -> set[int]:
    """PIDs of every live descendant of `root` (this process), from /proc; empty where there is no /proc."""
    root = root or os.getpid()
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("ascii", "replace")
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] == "Z":  # a zombie is already gone
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_processes(pids: set[int], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM each process and its own process group (a server started with a new session), then SIGKILL."""
    own_group = os.getpgrp()

    def send(sig: int) -> None:
        for pid in pids:
            try:
                pgid = os.getpgid(pid)
                if pgid != own_group and pgid == pid:  # it leads its own group: take the group with it
                    os.killpg(pgid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.waitpid(pid, os.WNOHANG)  # reap our own children so they do not linger as zombies
            except (ChildProcessError, OSError):
                pass

    def alive() -> set[int]:
        live = set()
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except (ChildProcessError, OSError):
                pass
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    stat = fh.read().decode("ascii", "replace")
                if stat[stat.rindex(")") + 2 :].split()[0] != "Z":
                    live.add(pid)
            except (OSError, ValueError, IndexError):
                continue
        return live

    if not pids:
        return
    send(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and alive():
        time.sleep(0.02)
    left = alive()
    if left:
        pids = left
        send(signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and alive():
            time.sleep(0.02)


class running:
    """`with running(engine, config) as session:` starts the engine and always stops it.

    On Ctrl-C (or any exit that is not an ordinary exception) stop() gets STOP_GRACE_S, then every
    process the engine started (its server, its engine-core workers, their process groups) is
    killed, so the command ends within about 2 s and leaves no engine behind. The engine's temp files
    and sockets go to a run folder (speclock.core.scratch), removed after the engine's processes.
    """

    def __init__(self, engine: ModuleType, config: EngineConfig):
        self.engine, self.config = engine, config
        self.session: EngineSession | None = None
        self._before: set[int] = set()
        self._folder = ExitStack()

    def __enter__(self) -> EngineSession:
        self._before = descendants()
        if not self.config.server_url:  # an attached server keeps its files where its own process put them
            self._folder.enter_context(engine_run_folder())
        # engine.env goes into this process's environment: the engine reads it here (vLLM's envs are read
        # when used) and its worker processes inherit it. Restored when the engine stops.
        self._saved_env = {k: os.environ.get(k) for k in self.config.env}
        os.environ.update({str(k): str(v) for k, v in self.config.env.items()})
        try:
            session: EngineSession = self.engine.start(self.config)  # the engine module's start (EngineModule)
            self.session = session
        except BaseException as err:
            try:
                self._cleanup(interrupted=not isinstance(err, Exception))
            finally:
                self._restore_env()
                self._folder.close()
            raise
        return session

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._cleanup(interrupted=exc_type is not None and not issubclass(exc_type, Exception))
        finally:
            self._restore_env()
            self._folder.close()

    def _restore_env(self) -> None:
        for key, value in getattr(self, "_saved_env", {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}

    def _cleanup(self, *, interrupted: bool) -> None:
        session, self.session = self.session, None
        if not interrupted:
            if session is not None:
                session.stop()  # as always: in this thread, as long as the engine needs
            else:  # the start failed: nothing will stop what it had started
                kill_processes(descendants() - self._before)
            return
        # Ctrl-C: the engine gets STOP_GRACE_S to stop itself (in a thread, so a stuck shutdown cannot
        # hold the command), then whatever it started is killed.
        if session is not None:

            def stop() -> None:
                try:
                    session.stop()
                except BaseException:
                    pass

            t = threading.Thread(target=stop, name="speclock-engine-stop", daemon=True)
            t.start()
            t.join(STOP_GRACE_S)
        kill_processes(descendants() - self._before)
