"""A per-run folder for an engine's temporary files, removed when the engine stops, also after a failure.

Engines put their scratch files in the system's temp folder and leave them there when they fail (#40): vLLM its
ZMQ IPC sockets (`ipc://$VLLM_RPC_BASE_PATH/<uuid>`, default `tempfile.gettempdir()`), its file-store rendezvous
(`vllm_dist_<hex>`), its Prometheus folder; torch its default compile cache (`torchinductor_<user>`); SGLang its
IPC names. All of them follow TMPDIR (Python's `tempfile`), VLLM_RPC_BASE_PATH names vLLM's socket folder: both
point at one folder per engine run, made in the system's temp folder (socket paths must stay under 108 bytes).

The engine worker's parent makes the folder and removes it after the worker is gone; `running` makes one for an
engine started in-process (soak) unless it runs inside a worker, whose folder it then uses.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

PREFIX = "speclock-run-"
RUN_FOLDER = "SPECLOCK_RUN_TMP"  # set for an engine worker: the folder its parent made (and removes)


def make_run_folder() -> Path:
    """A new, private folder in the system's temp folder (named with this process's pid, for a person looking)."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def run_folder_env(folder: Path, current: Mapping[str, str]) -> dict[str, str]:
    """The variables that send an engine's temp files and sockets into `folder` (a socket folder the user chose in
    `current` stays; the run folder is made inside the user's TMPDIR)."""
    env = {"TMPDIR": str(folder), RUN_FOLDER: str(folder)}
    if "VLLM_RPC_BASE_PATH" not in current:
        env["VLLM_RPC_BASE_PATH"] = str(folder)
    return env


def remove_run_folder(folder: Path | None) -> None:
    """Remove a run folder and what the engine left in it; one that is gone already is fine."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def engine_run_folder() -> Iterator[Path]:
    """In this process: temp files and sockets go to a run folder while the block runs, removed after it.

    Inside an engine worker the parent's folder is used (and left for the parent to remove)."""
    given = os.environ.get(RUN_FOLDER)
    if given and Path(given).is_dir():
        yield Path(given)
        return
    folder = make_run_folder()
    env = run_folder_env(folder, os.environ)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    tempfile.tempdir = None  # tempfile caches its folder: forget it, so gettempdir() reads TMPDIR again
    try:
        yield folder
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        tempfile.tempdir = None
        remove_run_folder(folder)
