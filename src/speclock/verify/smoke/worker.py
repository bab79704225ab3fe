"""One engine per process: smoke starts each engine (plain, drafted, plain again) in its own worker.

Why a process each: SGLang registers its Prometheus metrics in the process-global registry, so a second
`sglang.Engine` in one process dies with DuplicateTimeseries; and an engine that dies must fail the smoke
at once, never hang it. The worker (`python -m speclock.verify.smoke.worker`) starts one engine with
`speclock.engines.running`, answers commands as JSON lines, and stops. The parent side, `worker_session`,
hands out a proxy with the engine session's methods (generate, counters, captured_layers).

Protocol: the parent writes one JSON command per line to the worker's stdin; the worker answers each on a
private pipe (its original stdout; whatever the engine prints goes to stderr). The first command is the
engine and its config; the answer says it is ready. A worker that dies closes that pipe: the parent sees
end-of-file at once and fails with the worker's exit code and its last stderr lines. Ctrl-C in the parent
kills the worker's process group (it runs in its own session) and the parent raises KeyboardInterrupt.

Nothing is left behind (#40): the engine's temp files and sockets go to a run folder the parent makes and removes
after the worker is gone (speclock.core.scratch), and a worker whose parent dies (a SIGKILLed smoke runs no
cleanup) stops its engine as on Ctrl-C, removes the run folder and exits; if that hangs, it kills what it started.
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Protocol, cast

from speclock.core.errors import BadInput, EnvironmentProblem, SpeclockError
from speclock.core.jsonread import loads
from speclock.core.layout import cache_dir
from speclock.core.scratch import RUN_FOLDER, make_run_folder, remove_run_folder, run_folder_env
from speclock.engines import EngineConfig, EngineSession, SpecCounters, descendants, get_engine, kill_processes, running
from speclock.verify.report_types import GpuInfo

LAST_LINES = 12  # stderr lines of a dead worker quoted in the failure
STOP_WAIT_S = 60.0  # an engine's own shutdown (vLLM joins its engine core); then the worker is killed
PARENT_PID = "SPECLOCK_WORKER_PARENT"  # the parent's pid, for a worker to notice that it is gone
PARENT_POLL_S = 0.2
ORPHAN_GRACE_S = 5.0  # an orphaned worker's own stop (its engine, as on Ctrl-C); then what is left is killed


class WorkerDied(RuntimeError):
    """The engine worker exited (or the engine in it failed) before it answered."""


def _config_doc(config: EngineConfig) -> dict[str, Any]:
    doc = asdict(config)
    doc["target"] = str(config.target)
    doc["draft"] = str(config.draft) if config.draft is not None else None
    return doc


def _config_from(doc: dict[str, Any]) -> EngineConfig:
    doc = dict(doc)
    doc["target"] = Path(doc["target"])
    doc["draft"] = Path(doc["draft"]) if doc.get("draft") else None
    doc["k_per_batch_size"] = tuple(tuple(row) for row in doc.get("k_per_batch_size") or ())  # JSON gave lists
    return EngineConfig(**doc)


def gpu_info() -> GpuInfo | None:
    """Name, driver and CUDA version of the visible GPU (in the engine's process); None without one."""
    try:
        # heavy, optional (torch): imported only where it is used
        import torch

        if not torch.cuda.is_available():
            return None
        info: GpuInfo = {"name": torch.cuda.get_device_name(0), "cuda": str(torch.version.cuda or "")}
    except Exception:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        info["driver"] = ""
    return info


# ---------------------------------------------------------------- the worker process


def _serve(commands: IO[str], answers: IO[str]) -> int:
    """The worker's loop: the first command starts the engine, later ones use it, `stop` ends it."""

    def answer(doc: dict[str, Any]) -> None:
        answers.write(json.dumps(doc) + "\n")
        answers.flush()

    first = loads(commands.readline() or "{}")
    try:
        engine = get_engine(first["engine"])
        ctx = running(engine, _config_from(first["config"]))
        session = ctx.__enter__()
    except BaseException as err:
        answer(_error(err))
        return 1
    try:
        sampling = "sampling" in inspect.signature(session.generate).parameters
        answer({"ready": True, "sampling": sampling, "gpu": gpu_info()})
        for line in commands:
            cmd = loads(line)
            op = cmd.get("op")
            if op == "stop":
                break
            try:
                if op == "generate":
                    answer(_generate(session, cmd, sampling))
                elif op == "counters":
                    answer({"counters": asdict(session.counters())})
                elif op == "captured_layers":
                    answer({"layers": session.captured_layers()})
                else:
                    answer({"error": f"unknown command {op!r}", "kind": "RuntimeError"})
            except Exception as err:  # an engine failure mid-run: reported, then the worker stops
                answer(_error(err))
                ctx.__exit__(type(err), err, err.__traceback__)
                return 1
    except BaseException as err:
        ctx.__exit__(type(err), err, err.__traceback__)
        raise
    ctx.__exit__(None, None, None)
    answer({"stopped": True})
    return 0


class _SamplingGenerate(Protocol):
    """generate() of an engine session that samples (vLLM's): `sampling` is extra keyword arguments of its
    SamplingParams."""

    def __call__(self, prompts: list[list[int]], max_tokens: int, sampling: dict[str, Any] | None = None) -> list[list[int]]: ...


def _generate(session: EngineSession, cmd: dict[str, Any], sampling_ok: bool) -> dict[str, Any]:
    """Generate, timed here (the pipe's cost stays out): all prompts at once, or one request at a time."""
    prompts, max_tokens, sampling = cmd["prompts"], cmd["max_tokens"], cmd.get("sampling")
    if sampling and not sampling_ok:
        raise BadInput("this engine adapter generates greedily only")

    outputs, seconds = timed(session, prompts, max_tokens, sampling, bool(cmd.get("one_at_a_time")))
    return {"outputs": outputs, "seconds": seconds}


def _error(err: BaseException) -> dict[str, Any]:
    message = err.message if isinstance(err, SpeclockError) else str(err)
    doc: dict[str, Any] = {
        "error": message or type(err).__name__,
        "kind": type(err).__name__,
        "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=8)),
    }
    if isinstance(err, SpeclockError):
        doc.update(exit_code=err.exit_code, hint=getattr(err, "hint", "") or "")
    return doc


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _die_with_parent(parent: int) -> None:
    """Stop this worker once its parent is gone. Polled, not PR_SET_PDEATHSIG: that fires when the parent *thread*
    that started the worker ends, which need not be the parent process."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)  # the orderly stop in the main thread: the engine, as on Ctrl-C
    time.sleep(ORPHAN_GRACE_S)
    kill_processes(descendants())  # the engine did not stop in time: its processes go, then this one
    remove_run_folder(_run_folder())
    os._exit(137)


def _run_folder() -> Path | None:
    return Path(os.environ[RUN_FOLDER]) if os.environ.get(RUN_FOLDER) else None


def main() -> int:
    # Answers go to a private copy of stdout; fd 1 becomes stderr, so what the engine prints cannot garble them.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGTERM, _interrupt)  # the parent's stop: the engine is stopped as on Ctrl-C
    parent = int(os.environ.get(PARENT_PID) or 0)
    if parent:
        threading.Thread(target=_die_with_parent, args=(parent,), name="speclock-parent-watch", daemon=True).start()
    try:
        return _serve(sys.stdin, answers)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the parent is gone: nobody reads the answer
        return 1
    finally:
        if parent and os.getppid() != parent:  # orphaned: no parent is left to remove the run folder
            remove_run_folder(_run_folder())


# ---------------------------------------------------------------- the parent side

# Where engines keep their compile caches unless the user chose: under speclock's cache, not ~/.cache/vllm,
# ~/.triton or /tmp/torchinductor_<user> (a smoke on the host wrote ~/.cache/vllm, #26); kept across runs, so
# the second engine start reuses the first one's compiles.
ENGINE_CACHES = {
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TVM_FFI_CACHE_DIR": "tvm-ffi",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "XDG_CACHE_HOME": "xdg",
}


def worker_env(base: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment: this one, sys.path as PYTHONPATH (tests and plugins put folders there), and the
    engines' caches under speclock's cache (a variable the user set wins)."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    root = cache_dir() / "engine-cache"
    for var, sub in ENGINE_CACHES.items():
        env.setdefault(var, str(root / sub))
    if "SPECLOCK_CACHE" not in env:  # speclock's own cache stays where it is, whatever XDG_CACHE_HOME now says
        env["SPECLOCK_CACHE"] = str(cache_dir())
    return env


class WorkerSession:
    """The engine session in a worker process, as the smoke run uses it."""

    def __init__(self, engine_name: str, config: EngineConfig, label: str):
        self.engine_name, self.config, self.label = engine_name, config, label
        self.last_seconds = 0.0
        self.gpu: GpuInfo | None = None
        self.sampling = False  # whether the engine adapter takes sampling parameters (the worker says when ready)
        self._tail: collections.deque[str] = collections.deque(maxlen=LAST_LINES)
        env = worker_env(os.environ)
        self.run_folder = make_run_folder()  # the engine's temp files and sockets; removed by stop()
        env.update(run_folder_env(self.run_folder, env), **{PARENT_PID: str(os.getpid())})
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "speclock.verify.smoke.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=env,
                start_new_session=True,
            )  # Ctrl-C reaches this process; it stops the worker's group
        except BaseException:
            remove_run_folder(self.run_folder)
            raise
        self._log = threading.Thread(target=self._forward_stderr, name=f"speclock-worker-{self.proc.pid}", daemon=True)
        self._log.start()

    def _forward_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._tail.append(line.rstrip())
            sys.stderr.write(line)

    def request(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Send one command, wait for its answer; a dead worker or a failed engine raises at once."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(doc) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker is gone: reading says how
        line = self.proc.stdout.readline()
        if not line:
            raise WorkerDied(self._death())
        reply: dict[str, Any] = loads(line)  # the worker answers each command with one JSON object (_serve)
        if "error" not in reply:
            return reply
        message = f"{reply['kind']}: {reply['error']}"
        if reply.get("exit_code") == BadInput.exit_code:
            raise BadInput(reply["error"], hint=reply.get("hint") or None)
        if reply.get("exit_code") == EnvironmentProblem.exit_code:
            raise EnvironmentProblem(reply["error"], hint=reply.get("hint") or None)
        raise WorkerDied(f"{message}\n{reply.get('traceback', '').rstrip()}")

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        self._log.join(timeout=2)
        tail = "\n".join(f"    {line}" for line in self._tail) or "    (nothing on stderr)"
        return (
            f"the {self.engine_name} engine worker {self.label} (pid {self.proc.pid}) exited "
            f"{'with code ' + str(code) if code is not None else 'without answering'} before it answered; "
            f"its last lines:\n{tail}"
        )

    # the EngineSession methods smoke calls
    def generate(
        self, prompts: list[list[int]], max_tokens: int, sampling: dict[str, Any] | None = None, one_at_a_time: bool = False
    ) -> list[list[int]]:
        reply = self.request(
            {"op": "generate", "prompts": prompts, "max_tokens": max_tokens, "sampling": sampling, "one_at_a_time": one_at_a_time}
        )
        self.last_seconds = float(reply["seconds"])
        outputs: list[list[int]] = reply["outputs"]  # _generate's answer: token ids per prompt
        return outputs

    def counters(self) -> SpecCounters:
        c = self.request({"op": "counters"})["counters"]
        return SpecCounters(c["num_drafts"], c["num_draft_tokens"], c["num_accepted_tokens"], tuple(c["accepted_per_position"]))

    def captured_layers(self) -> list[int] | None:
        layers: list[int] | None = self.request({"op": "captured_layers"})["layers"]  # the session's own answer
        return layers

    def stop(self, *, interrupted: bool = False) -> None:
        clean = False
        if self.proc.poll() is None and not interrupted:
            try:
                clean = bool(self.request({"op": "stop"}).get("stopped"))
                self.proc.wait(timeout=STOP_WAIT_S)
            except (WorkerDied, subprocess.TimeoutExpired, OSError, ValueError):
                clean = False
        if not clean:  # killed, dead or stuck: whatever is left of its group (engine processes) goes too
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the worker and the engine processes it started
            except (ProcessLookupError, PermissionError):
                pass
            kill_processes({self.proc.pid})
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        remove_run_folder(self.run_folder)  # the worker and its engine are gone: what they left goes too


def timed(
    session: EngineSession,
    prompts: list[list[int]],
    max_tokens: int,
    sampling: dict[str, Any] | None = None,
    one_at_a_time: bool = False,
) -> tuple[list[list[int]], float]:
    """Outputs and seconds: all prompts at once, or one request at a time (batch 1). A worker times itself (in its
    own process: the pipe's cost stays out). `sampling` only where the session's generate takes it (callers check)."""
    if isinstance(session, WorkerSession):
        return session.generate(prompts, max_tokens, sampling, one_at_a_time=one_at_a_time), session.last_seconds

    def gen(batch: list[list[int]]) -> list[list[int]]:
        if sampling:
            return cast(_SamplingGenerate, session.generate)(batch, max_tokens, sampling)
        return session.generate(batch, max_tokens)

    t0 = time.perf_counter()
    outputs = [gen([p])[0] for p in prompts] if one_at_a_time else gen(prompts)
    return outputs, time.perf_counter() - t0


class worker_session:
    """`with worker_session("vllm", config, label) as session:` one engine in its own process, always stopped."""

    def __init__(self, engine_name: str, config: EngineConfig, label: str = ""):
        self.engine_name, self.config, self.label = engine_name, config, label
        self.session: WorkerSession | None = None

    def __enter__(self) -> WorkerSession:
        self.session = WorkerSession(self.engine_name, self.config, self.label)
        try:
            ready = self.session.request({"engine": self.engine_name, "config": _config_doc(self.config)})
        except BaseException as err:
            self.session.stop(interrupted=not isinstance(err, Exception))
            raise
        self.session.gpu = ready.get("gpu")
        self.session.sampling = bool(ready.get("sampling"))
        return self.session

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.session is not None:
            self.session.stop(interrupted=exc_type is not None and not issubclass(exc_type, Exception))


if __name__ == "__main__":
    sys.exit(main())
