"""push-image --attestation checks the envelope's subject against the build record's image ID before any registry call
(issue #40, item 8; docs/attestation.md): an attestation of another image is exit 2 and the registry sees no
connection at all. The registry here is a local HTTP server that counts the connections it accepts; the builder is a
stand-in whose push connects to it, as buildah's and docker's do, so a check made after the push shows up in the count."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import urllib.request
from pathlib import Path

import pytest
from fuzz_support import run_cli
from helpers import write_build_record

import speclock.build.push
from speclock.core import dsse

STACK = "cpu-vllm"
IMAGE_ID = "sha256:" + "ab" * 32


class CountingRegistry(http.server.ThreadingHTTPServer):
    """Answers every request 404 and counts the connections it accepts."""

    daemon_threads = True

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_PUT = do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.connections = 0

    def get_request(self):
        conn = super().get_request()
        self.connections += 1
        return conn

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def registry():
    server = CountingRegistry()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


class ConnectingBuilder:
    """Stands in for buildah: its push opens a connection to the registry, as a real push does first."""

    def push(self, ref: str, dest: str, *, insecure: bool) -> str:
        host = dest.split("/", 1)[0]
        try:
            urllib.request.urlopen(f"http://{host}/v2/", timeout=10)
        except OSError:
            pass
        return "sha256:" + "cd" * 32


@pytest.fixture
def build(tmp_path, monkeypatch):
    """A recorded build of the stack whose self-check passed (no image is built: the record is what push reads)."""
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(speclock.build.push, "get_builder", lambda name: ConnectingBuilder())
    return write_build_record(tmp_path / "cache", STACK, image_id=IMAGE_ID, labels={"io.speclock.dirty": "false"})


def _envelope(path: Path, digest: str) -> Path:
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": f"localhost/speclock-{STACK}:0123456789abcdef", "digest": {"sha256": digest}}],
        "predicateType": "https://speclock.dev/smoke/v1",
        "predicate": {},
    }
    payload = base64.b64encode(json.dumps(statement).encode()).decode()
    sig = base64.b64encode(b"\0" * 64).decode()  # push reads the subject; the gate checks signatures
    envelope = {"payload": payload, "payloadType": dsse.INTOTO_PAYLOAD_TYPE, "signatures": [{"keyid": "", "sig": sig}]}
    path.write_text(json.dumps(envelope))
    return path


def test_an_attestation_of_another_image_is_refused_before_any_connection(registry, build, tmp_path):
    other = _envelope(tmp_path / "attestation.intoto.json", "ee" * 32)
    code, _out, err = run_cli("push-image", "--stack", STACK, "--registry", registry.address, "--attestation", str(other))
    assert code == 2, err
    assert f"{other}: subject: the attestation is for sha256:{'ee' * 8}, not for the image {build['ref']} to be pushed" in err
    assert f"image ID sha256:{'ab' * 8}" in err
    assert registry.connections == 0


def test_the_counting_registry_counts_a_push(registry, build, tmp_path):
    """The other side of the test above: an attestation of this build gets as far as the push, which connects."""
    ours = _envelope(tmp_path / "attestation.intoto.json", IMAGE_ID.removeprefix("sha256:"))
    code, _out, err = run_cli("push-image", "--stack", STACK, "--registry", registry.address, "--attestation", str(ours))
    assert code == 3, err  # the stand-in registry serves no manifest: the pushed digest cannot be read back
    assert "subject: the attestation is for" not in err
    assert registry.connections >= 1
