"""A local wheel index for the fetch tests: an HTTP server on 127.0.0.1 in a thread (no network).

`serve(path, data, mode)` publishes bytes under a path; modes: "ok", "slow" (trickles the body, so a
test can interrupt a running download), "404", "410", "wrong" (serves other bytes than published),
"stall" (sends the headers, then nothing for 30 s).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import shutil
import threading
import time
from pathlib import Path

from speclock.spec.stack import canonical_sha256

ROOT = Path(__file__).resolve().parents[1]
# The base of the committed cpu-vllm lock: what the stack copies below give (lock --check compares it).
COMMITTED_BASE = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())["base"]


class WheelServer:
    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}
        self.hits: dict[str, int] = {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                owner.hits[self.path] = owner.hits.get(self.path, 0) + 1
                data, mode = owner.files.get(self.path, (b"", "404"))
                if mode in ("404", "410"):
                    self.send_error(int(mode))
                    return
                if mode == "wrong":
                    data = b"not the published bytes"
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    if mode == "stall":  # headers, then nothing: the client blocks in a read
                        time.sleep(30)
                        return
                    if mode == "slow":
                        for i in range(0, len(data), 4096):
                            self.wfile.write(data[i : i + 4096])
                            self.wfile.flush()
                            time.sleep(0.05)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def serve(self, path: str, data: bytes, mode: str = "ok") -> str:
        self.files[path] = (data, mode)
        return self.base + path

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def wheel_entry(server: WheelServer, name: str, version: str = "1.0", *, data: bytes | None = None, mode: str = "ok") -> dict:
    """A lock entry for a (fake) wheel served by `server`."""
    filename = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    data = data if data is not None else f"wheel {name} {version}\n".encode() * 50
    url = server.serve(f"/files/{filename}", data, mode)
    return {"name": name, "version": version, "filename": filename, "url": url, "sha256": hashlib.sha256(data).hexdigest()}


def make_stack(folder: Path, server: WheelServer) -> Path:
    """A copy of stacks/cpu-vllm.toml whose torch index is the local server (so its host is allowed)."""
    stacks = folder / "stacks"
    stacks.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "stacks" / "cpu-vllm.toml").read_text()
    text = text.replace('index = "https://download.pytorch.org/whl/cpu"', f'index = "{server.base}/simple"')
    assert server.base in text
    # the tiny locks made here resolve none of cpu-vllm's packages: no [prune] (docs/prune.md) to record
    text = re.sub(r"\n\[prune\]\n.*?(?=\n\[)", "\n", text, flags=re.S)
    assert "[prune]" not in text
    path = stacks / "cpu-vllm.toml"
    path.write_text(text)
    return path


def seal(doc: dict) -> dict:
    """Recompute lock_sha256 (what anyone editing a lock can do)."""
    doc["lock_sha256"] = canonical_sha256({k: v for k, v in doc.items() if k != "lock_sha256"})
    return doc


def make_lock(path: Path, entries: list[dict], *, assets: list[dict] | None = None) -> Path:
    doc = {
        "schema": "speclock.lock/v1",
        "stack": "cpu-vllm",
        "stack_sha256": "0" * 64,
        "packages": entries,
        "assets": assets or [],
        "excluded": [],
        "base": COMMITTED_BASE,
        "source_date_epoch": COMMITTED_BASE["source_date_epoch"],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(seal(doc), indent=1))
    return path


def copy_committed_lock(dest: Path, name: str = "cpu-vllm") -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "locks" / f"{name}.lock", dest)
    return dest
