"""A fake engine for the leftover tests (#40): the reference engine's start, replaced in an engine worker.

Loaded by Python at start-up when this folder is on PYTHONPATH (a smoke worker inherits its parent's sys.path).
With SPECLOCK_FAKE_ENGINE=<file>, `speclock.engines.reference.start` leaves what an engine leaves in the temp
folder (a file, a `vllm_dist_*` file store, a bound IPC socket), starts a child process (an engine's own process),
writes {"tmp", "child", "pid"} to <file>, and then, by SPECLOCK_FAKE_ENGINE_MODE: `fail` raises (an engine that
refuses to start), `hang` sleeps (an engine start that takes minutes).
"""

import os

OUT = os.environ.get("SPECLOCK_FAKE_ENGINE")


def _start(config):
    import json
    import socket
    import subprocess
    import sys
    import tempfile
    import time

    tmp = tempfile.gettempdir()
    with open(os.path.join(tmp, f"vllm_dist_{os.getpid()}"), "w") as fh:
        fh.write("store")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(tmp, f"ipc-{os.getpid()}"))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(f"{OUT}.part", "w") as fh:
        json.dump({"tmp": tmp, "child": child.pid, "pid": os.getpid()}, fh)
    os.replace(f"{OUT}.part", OUT)
    if os.environ.get("SPECLOCK_FAKE_ENGINE_MODE") == "hang":
        time.sleep(120)
    raise RuntimeError("fake engine: refused to start")


if OUT:
    from speclock.core.import_hooks import after_import

    after_import("speclock.engines.reference", lambda module: setattr(module, "start", _start))
