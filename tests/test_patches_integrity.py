"""Regression tests for the patch-series defects of issue #15: each bad input is refused with exit 2
(or 3 for the environment) naming the file and its line or key, and nothing is read or written
outside the series, the engine's source tree and the wheel cache.

Offline: the engine is a folder laid out like site-packages, and engine wheels come from a local
HTTP index on 127.0.0.1 (SPECLOCK_INDEX_URL); SPECLOCK_CACHE is a tmp folder.
"""

from __future__ import annotations

import errno
import hashlib
import http.server
import io
import json
import os
import subprocess
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot
from test_patches_series import MODULE, write_tiny_stack  # the series tests' tiny engine and stack
from test_patches_series import make_engine as make_tiny_engine

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import atomic_write_json
from speclock.core.layout import REPO_ROOT
from speclock.patches import cli as patches_cli
from speclock.patches import diff as patch_diff
from speclock.patches import probes as patch_probes
from speclock.patches import series as patch_series
from speclock.patches import trees as patch_trees
from speclock.patches import wheels as patch_wheels

HEADER = textwrap.dedent("""\
    speclock-patch: 1
    Title: Outer declares the feature
    Engine: vllm
    Versions: >=9.0, <10
    Why: the engine checks the outer class
    Probe: class-has vllm/tiny.py Outer feature

    """)

DIFF = textwrap.dedent("""\
    --- a/vllm/tiny.py
    +++ b/vllm/tiny.py
    @@ -9,3 +9,6 @@
     class Outer:
         def forward(self, x):
             return self.inner.forward(x)
    +
    +    def feature(self):
    +        return True
    @@ -14,1 +17,1 @@
    -SUPPORTED = ["llama", "qwen"]
    +SUPPORTED = ["llama", "qwen", "deepseek"]
    """)

GOOD = HEADER + DIFF
DIFF_LINE = HEADER.count("\n") + 1  # line number of '--- a/vllm/tiny.py'


def make_engine(root: Path, version: str = "9.9.9") -> Path:
    return make_tiny_engine(root, version)


def write_stack(root: Path, series: list[str]) -> Path:
    return write_tiny_stack(root, series)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A series folder, a stack, an engine tree and a cache, all under tmp_path."""
    pdir = tmp_path / "patches"
    (pdir / "vllm").mkdir(parents=True)
    monkeypatch.setenv("SPECLOCK_PATCHES_DIR", str(pdir))
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECLOCK_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens: no network by accident
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(patch_wheels, "_RETRY_PAUSE_S", 0.0)
    site = make_engine(tmp_path / "engine")

    class Env:
        root = tmp_path
        patches_dir = pdir
        engine = site

        def series(self, files: dict[str, str | bytes]) -> Path:
            for name, text in files.items():
                path = pdir / "vllm" / name
                path.write_bytes(text if isinstance(text, bytes) else text.encode())
            return write_stack(tmp_path, list(files))

    return Env()


def check(stack: Path, *extra: str, site: Path | None = None):
    args = ["patches", "check", "--stack", str(stack), *extra]
    if site is not None:
        args += ["--site-packages", str(site)]
    return run_cli(*args)


# ---------------------------------------------------------------- the diff reader refuses what it does not understand


def test_the_committed_series_still_reads():
    for path in sorted((REPO_ROOT / "patches").rglob("*.patch")):
        p = patch_diff.parse_patch(path)
        assert p.files and all(f.hunks for f in p.files)


def test_the_good_patch_applies(env):
    stack = env.series({"0001-outer.patch": GOOD})
    code, out, err = check(stack, site=env.engine)
    assert code == 0, err
    assert "APPLIES" in out


def test_a_malformed_hunk_header_is_exit_2_not_applies_with_the_hunk_dropped(env):
    """The defect: '@@ -14,1 +17,1' (no closing @@) was skipped with its body, and the patch 'APPLIES'."""
    bad = GOOD.replace("@@ -14,1 +17,1 @@", "@@ -14,1 +17,1")
    stack = env.series({"0002-x.patch": bad})
    before = snapshot(env.root)
    code, out, err = check(stack, site=env.engine)
    line = bad.split("\n").index("@@ -14,1 +17,1") + 1
    assert_clean_refusal(code, err, allowed=(2,), names=f"0002-x.patch:{line}: malformed hunk header '@@ -14,1 +17,1'")
    assert "APPLIES" not in out and "git diff" in err
    assert_nothing_written(before, snapshot(env.root))


@pytest.mark.parametrize(
    "mutate, line_of, message",
    [
        (lambda t: t.replace("@@ -9,3 +9,6 @@", "@@ -a,b +c @@"), "@@ -a,b +c @@", "malformed hunk header"),
        (lambda t: t.replace("@@ -9,3 +9,6 @@", "@@ -9,3 +9,6 @@@"), "@@ -9,3 +9,6 @@@", "malformed hunk header"),
        (lambda t: t.replace("@@ -9,3 +9,6 @@", "@@ -9,3 +9,7 @@"), "@@ -14,1 +17,1 @@", "3/6 lines, header says 3/7"),
        (
            lambda t: t.replace("@@ -9,3 +9,6 @@", "@@ -9,2 +9,5 @@"),
            "         return self.inner.forward(x)",
            "2/2 lines, header says 2/5",
        ),
        (
            lambda t: t.replace("+    def feature(self):", "*    def feature(self):"),
            "*    def feature(self):",
            "is not a hunk line",
        ),
        (
            lambda t: t.replace(
                "+++ b/vllm/tiny.py\n@@ -9,3 +9,6 @@", "+++ b/vllm/tiny.py\n--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -9,3 +9,6 @@"
            ),
            "+++ b/vllm/tiny.py",
            "has no hunks",
        ),
        (lambda t: t[: t.index("--- a/")], None, "no unified diff after the header"),
        (lambda t: t + "this is not part of any hunk\n", "this is not part of any hunk", "trailing garbage"),
        (lambda t: t + " extra context\n", " extra context", "outside any hunk"),
        (lambda t: t.replace("\n", "\r\n"), "speclock-patch: 1\r", "CRLF"),
        (lambda t: t.replace("+++ b/vllm/tiny.py", "+++ b/../../outside.py"), "+++ b/../../outside.py", "leaves the engine"),
        (lambda t: t.replace("+++ b/vllm/tiny.py", "+++ /etc/tiny.py"), "+++ /etc/tiny.py", "absolute path"),
        (lambda t: t.replace("--- a/vllm/tiny.py", "--- /dev/null"), "--- /dev/null", "creates or deletes a file"),
        (
            lambda t: t.replace("--- a/vllm/tiny.py", "diff --git a/x b/x\nGIT binary patch\n--- a/vllm/tiny.py"),
            "GIT binary patch",
            "unsupported git diff line",
        ),
        (
            lambda t: t + "--- a/vllm/tiny.py\n+++ b/vllm/tiny.py\n@@ -1,1 +1,1 @@\n-a\n+b\n",
            "+++ b/vllm/tiny.py",
            "second file header",
        ),
    ],
)
def test_a_malformed_diff_is_exit_2_naming_file_and_line(env, mutate, line_of, message):
    bad = mutate(GOOD)
    stack = env.series({"0001-outer.patch": bad})
    code, out, err = check(stack, site=env.engine)
    lines = bad.split("\n")
    if line_of is None:
        names = "0001-outer.patch:"
    else:
        # the last occurrence for lines that repeat (the reader reports where the problem is found)
        line = max(n for n, text in enumerate(lines, 1) if text == line_of)
        names = f"0001-outer.patch:{line}:"
    assert_clean_refusal(code, err, allowed=(2,), names=names)
    assert message in err, err
    assert "APPLIES" not in out


def test_apply_of_a_malformed_patch_writes_nothing(env):
    stack = env.series({"0001-outer.patch": GOOD.replace("@@ -14,1 +17,1 @@", "@@ -14,1 +17,1")})
    before = snapshot(env.root)
    code, _, err = run_cli(
        "patches",
        "apply",
        "--stack",
        str(stack),
        "--site-packages",
        str(env.engine),
        "--no-runtime-probes",
        "--record",
        str(env.root / "rec.json"),
    )
    assert_clean_refusal(code, err, allowed=(2,), names="0001-outer.patch:")
    assert_nothing_written(before, snapshot(env.root))


@pytest.mark.parametrize(
    "probe, message",
    [
        ("class-has vllm/tiny.py Outer", "needs at least 3 arguments"),
        ("class-has ../../etc/passwd Outer feature", "leaves the engine"),
        ("class-has /etc/passwd Outer feature", "absolute path"),
        ("class-has vllm/tiny.py 9Outer feature", "is not a Python name"),
        ("list-admits vllm/tiny.py SUPPORTED.x deepseek", "is not a Python name"),
        ("eagle3-supported Kimi;rm", "is not a Python name"),
        ("grep vllm/tiny.py x y", "unknown probe kind"),
    ],
)
def test_a_probe_of_the_wrong_shape_is_exit_2_naming_patch_line_and_key(env, probe, message):
    stack = env.series({"0001-outer.patch": GOOD.replace("Probe: class-has vllm/tiny.py Outer feature", f"Probe: {probe}")})
    code, _, err = check(stack, site=env.engine)
    assert_clean_refusal(code, err, allowed=(2,), names="0001-outer.patch:6: Probe:")
    assert message in err


def test_engine_probe_output_of_the_wrong_shape_is_an_environment_problem(monkeypatch):
    for stdout in ("[1, 2]", '{"Kimi": 3}', '{"Kimi": {"resolved": "yes"}}', "{}"):
        monkeypatch.setattr(
            patch_probes, "engine_subprocess", lambda *a, out=stdout, **k: subprocess.CompletedProcess([], 0, out + "\n", "")
        )
        with pytest.raises(EnvironmentProblem, match="eagle3 probe"):
            patch_probes.eagle3_probe("vllm", ["Kimi"])


# ---------------------------------------------------------------- encoding


@pytest.mark.parametrize(
    "data, line",
    [
        (GOOD.encode().replace(b"Why: the engine", b"Why: the \xff\xfe engine"), 5),
        (GOOD.encode().replace(b"    def feature", b"    def fe\x00ature"), DIFF_LINE + 7),
        (b"\x89PNG\r\n\x1a\n\x00\x00binary", 1),
    ],
)
def test_a_binary_or_non_utf8_patch_is_exit_2_naming_file_and_line(env, data, line):
    stack = env.series({"0001-outer.patch": data})
    code, out, err = check(stack, site=env.engine)
    assert_clean_refusal(code, err, allowed=(2,), names=f"0001-outer.patch:{line}:")
    assert "UTF-8" in err or "NUL" in err


def test_a_non_utf8_engine_file_is_exit_2_naming_it(env):
    (env.engine / "vllm" / "tiny.py").write_bytes(MODULE.encode() + b"# \xff\n")
    stack = env.series({"0001-outer.patch": GOOD})
    code, _, err = check(stack, site=env.engine)
    assert_clean_refusal(code, err, allowed=(2,), names="tiny.py:15:")


# ---------------------------------------------------------------- confinement of series entries and targets


@pytest.mark.parametrize(
    "entry",
    [
        "../outside.patch",
        "../../outside.patch",
        "faults/../../outside.patch",
        "/etc/passwd",
        "",
        "a\\b.patch",
        "./0001-outer.patch",
        "faults//x.patch",
    ],
)
def test_a_series_entry_outside_patches_is_refused_before_anything_is_read(env, monkeypatch, entry):
    (env.patches_dir / "outside.patch").write_text(GOOD)
    (env.root / "outside.patch").write_text(GOOD)
    (env.patches_dir / "vllm" / "0001-outer.patch").write_text(GOOD)
    stack = write_stack(env.root, ["0001-outer.patch", entry])
    read: list[str] = []
    real = patch_diff.read_text
    for module in (patch_diff, patch_trees):  # the package's file readers: patch files and engine sources
        monkeypatch.setattr(module, "read_text", lambda path, **kw: (read.append(str(path)), real(path, **kw))[1])
    before = snapshot(env.root)
    code, _, err = check(stack, site=env.engine)
    assert_clean_refusal(code, err, allowed=(2,), names=f"{stack}: key 'patches.series'")
    assert repr(entry) in err
    assert read == [], f"read before refusing: {read}"
    assert_nothing_written(before, snapshot(env.root))


def test_a_series_entry_symlinked_out_of_patches_is_refused(env):
    (env.root / "outside.patch").write_text(GOOD)
    (env.patches_dir / "vllm" / "0001-outer.patch").symlink_to(env.root / "outside.patch")
    stack = write_stack(env.root, ["0001-outer.patch"])
    code, _, err = check(stack, site=env.engine)
    assert_clean_refusal(code, err, allowed=(2,), names="'0001-outer.patch'")
    assert "resolves outside" in err


def test_a_subfolder_of_the_series_is_still_allowed(env):
    (env.patches_dir / "vllm" / "faults").mkdir()
    (env.patches_dir / "vllm" / "faults" / "9001-x.patch").write_text(GOOD)
    stack = write_stack(env.root, ["faults/9001-x.patch"])
    code, out, err = check(stack, site=env.engine)
    assert code == 0, err


def test_apply_never_writes_through_a_symlinked_file(env):
    # A linked copy of an engine tree (files linked to the installed engine) is patched by replacing
    # each link with a new file: the file the link pointed at is never written.
    outside = env.root / "elsewhere"
    outside.mkdir()
    (outside / "tiny.py").write_text(MODULE)
    (env.engine / "vllm" / "tiny.py").unlink()
    (env.engine / "vllm" / "tiny.py").symlink_to(outside / "tiny.py")
    stack = env.series({"0001-outer.patch": GOOD})
    code, _, err = run_cli("patches", "apply", "--stack", str(stack), "--site-packages", str(env.engine), "--no-runtime-probes")
    assert code == 0, err
    assert (outside / "tiny.py").read_text() == MODULE
    patched = env.engine / "vllm" / "tiny.py"
    assert not patched.is_symlink() and patched.read_text() != MODULE


def test_apply_refuses_a_target_folder_linked_out_of_the_engine_tree(env):
    outside = env.root / "elsewhere"
    outside.mkdir()
    (env.engine / "vllm").rename(outside / "vllm")  # the package folder now lives outside, linked in
    (env.engine / "vllm").symlink_to(outside / "vllm", target_is_directory=True)
    stack = env.series({"0001-outer.patch": GOOD})
    before = snapshot(env.root)
    code, _, err = run_cli("patches", "apply", "--stack", str(stack), "--site-packages", str(env.engine), "--no-runtime-probes")
    assert_clean_refusal(code, err, allowed=(2,), names="vllm")
    assert "resolves outside" in err
    assert (outside / "vllm" / "tiny.py").read_text() == MODULE
    assert_nothing_written(before, snapshot(env.root))


def test_apply_writes_through_speclock_files_and_records(env):
    stack = env.series({"0001-outer.patch": GOOD})
    record = env.root / "out" / "rec.json"
    before = snapshot(env.root)
    code, _, err = run_cli(
        "patches",
        "apply",
        "--stack",
        str(stack),
        "--site-packages",
        str(env.engine),
        "--no-runtime-probes",
        "--record",
        str(record),
    )
    assert code == 0, err
    assert json.loads(record.read_text())["ok"] is True
    assert "def feature" in (env.engine / "vllm" / "tiny.py").read_text()
    assert_nothing_written(before, snapshot(env.root), except_under=(env.engine / "vllm", record))
    assert not [p for p in env.root.rglob("*") if p.name.startswith(".speclock-tmp")]


def test_the_record_writer_sorts_keys_and_creates_folders(tmp_path):
    atomic_write_json(tmp_path / "a" / "b.json", {"z": 1, "a": 2}, sort_keys=True)  # what apply --record uses
    assert (tmp_path / "a" / "b.json").read_text() == '{\n  "a": 2,\n  "z": 1\n}\n'


# ---------------------------------------------------------------- --engine-version at parse time


@pytest.mark.parametrize("value", ["garbage", "", "1..2", "../0.17.1", "0.17.1 ; rm -rf", "0.17.1/../x"])
def test_engine_version_garbage_is_exit_2_at_parse_time(env, monkeypatch, value):
    stack = env.series({"0001-outer.patch": GOOD})
    monkeypatch.setattr(patches_cli, "fetch_wheel", lambda *a, **k: pytest.fail("fetched for a bad version"))
    code, _, err = run_cli("patches", "check", "--stack", str(stack), "--engine-version", value)
    assert_clean_refusal(code, err, allowed=(2,), names="--engine-version")
    assert "is not a version" in err


# ---------------------------------------------------------------- engine wheels: verified on every use


def make_wheel(version: str = "9.9.9") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr("vllm/tiny.py", MODULE)
        z.writestr(f"vllm-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return buf.getvalue()


class Index:
    """A PEP 691 simple index on 127.0.0.1 serving one wheel; records every request."""

    def __init__(
        self,
        wheel: bytes,
        filename: str = "vllm-9.9.9-py3-none-any.whl",
        sha256: str | None = None,
        html: bool = False,
        missing_wheel: bool = False,
    ):
        self.wheel, self.filename, self.requests = wheel, filename, []
        self.sha256 = sha256 if sha256 is not None else hashlib.sha256(wheel).hexdigest()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                index.requests.append(self.path)
                if self.path == "/simple/vllm/":
                    if html:
                        body = (
                            f'<html><body><a href="/files/{index.filename}#sha256={index.sha256}">'
                            f"{index.filename}</a></body></html>"
                        ).encode()
                        ctype = "text/html"
                    else:
                        body = json.dumps(
                            {
                                "meta": {"api-version": "1.0"},
                                "name": "vllm",
                                "files": [
                                    {
                                        "filename": index.filename,
                                        "url": f"/files/{index.filename}",
                                        "hashes": {"sha256": index.sha256} if index.sha256 else {},
                                    }
                                ],
                            }
                        ).encode()
                        ctype = "application/vnd.pypi.simple.v1+json"
                elif self.path == f"/files/{index.filename}" and not missing_wheel:
                    body, ctype = index.wheel, "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(monkeypatch):
    made = []

    def start(**kw) -> Index:
        idx = Index(make_wheel(), **kw)
        made.append(idx)
        monkeypatch.setenv("SPECLOCK_INDEX_URL", idx.url)
        return idx

    yield start
    for idx in made:
        idx.close()


def wheels_dir(env) -> Path:
    return env.root / "cache" / "wheels"


def test_a_downloaded_wheel_is_checked_and_its_hash_recorded(env, index):
    idx = index()
    stack = env.series({"0001-outer.patch": GOOD})
    code, out, err = check(stack, "--json")
    assert code == 0, err
    assert [p["state"] for p in json.loads(out)["patches"]] == ["applies"]
    wheel = wheels_dir(env) / idx.filename
    assert wheel.read_bytes() == idx.wheel
    side = json.loads((wheels_dir(env) / (idx.filename + ".sha256")).read_text())
    assert side["sha256"] == idx.sha256 and side["source"].startswith("index ")


def test_a_truncated_cached_wheel_is_refetched(env, index):
    idx = index()
    stack = env.series({"0001-outer.patch": GOOD})
    assert check(stack)[0] == 0
    wheel = wheels_dir(env) / idx.filename
    wheel.write_bytes(idx.wheel[: len(idx.wheel) // 2])  # the defect: this was used as is, forever
    idx.requests.clear()
    code, out, err = check(stack)
    assert code == 0, err
    assert "does not match its sha256" in err and str(wheel) in err
    assert wheel.read_bytes() == idx.wheel
    assert f"/files/{idx.filename}" in idx.requests


def test_a_cached_wheel_without_a_recorded_hash_is_checked_against_the_index(env, index):
    idx = index()
    wheels_dir(env).mkdir(parents=True)
    (wheels_dir(env) / idx.filename).write_bytes(idx.wheel[:100])  # an older cache: no sidecar, and corrupt
    stack = env.series({"0001-outer.patch": GOOD})
    code, _, err = check(stack)
    assert code == 0, err
    assert (wheels_dir(env) / idx.filename).read_bytes() == idx.wheel


def test_a_download_with_the_wrong_hash_is_refused_naming_where_it_came_from(env, index):
    idx = index(sha256="0" * 64)
    stack = env.series({"0001-outer.patch": GOOD})
    code, out, err = check(stack)
    assert_clean_refusal(code, err, allowed=(3,), names=f"/files/{idx.filename}")
    assert "sha256" in err and "0" * 64 in err
    assert not list(wheels_dir(env).iterdir())  # neither the wheel nor a temp file stays


def test_an_html_index_with_sha256_fragments_works(env, index):
    idx = index(html=True)
    stack = env.series({"0001-outer.patch": GOOD})
    code, _, err = check(stack)
    assert code == 0, err
    assert json.loads((wheels_dir(env) / (idx.filename + ".sha256")).read_text())["sha256"] == idx.sha256


def test_a_404_is_not_retried_and_says_not_found_at_url(env, index):
    idx = index(missing_wheel=True)
    stack = env.series({"0001-outer.patch": GOOD})
    started = time.monotonic()
    code, _, err = check(stack)
    assert_clean_refusal(code, err, allowed=(2,), names=f"not found at {idx.url[: -len('/simple')]}/files/{idx.filename}")
    assert idx.requests.count(f"/files/{idx.filename}") == 1
    assert time.monotonic() - started < 5


def test_a_version_the_index_does_not_have_is_exit_2(env, index):
    index()
    stack = env.series({"0001-outer.patch": GOOD})
    code, _, err = check(stack, "--engine-version", "9.9.8")
    assert_clean_refusal(code, err, allowed=(2,), names="vllm==9.9.8")
    assert "pip index versions vllm" in err


def test_disk_full_says_disk_full_and_leaves_no_temp(env, index, monkeypatch):
    index()
    stack = env.series({"0001-outer.patch": GOOD})

    def full(fh, block):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(patch_wheels, "_write_block", full)
    code, _, err = check(stack)
    assert_clean_refusal(code, err, allowed=(3,), names="disk full")
    assert "network" not in err
    assert not list(wheels_dir(env).iterdir())


def test_leftover_temps_of_a_killed_download_are_cleaned(env, index):
    index()
    wheels_dir(env).mkdir(parents=True)
    stale = wheels_dir(env) / ".speclock-tmp-vllm-9.9.9-py3-none-any.whl.abc123"
    stale.write_bytes(b"half a wheel")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    stack = env.series({"0001-outer.patch": GOOD})
    assert check(stack)[0] == 0
    assert not stale.exists()


def test_an_index_that_cannot_be_reached_is_exit_3(env):
    stack = env.series({"0001-outer.patch": GOOD})
    code, _, err = check(stack)  # SPECLOCK_INDEX_URL points at port 9 (nothing there)
    assert_clean_refusal(code, err, allowed=(3,), names="127.0.0.1:9")


def test_a_lock_pins_the_hash_of_a_locked_engine_wheel():
    found = patch_wheels.locked_wheels("vllm", "0.17.1")
    assert found and all(len(s.sha256) == 64 and s.source.startswith("lock ") for s in found)
    assert not patch_wheels.locked_wheels("vllm", "9.9.9")


@pytest.mark.parametrize(
    "name",
    [
        "../vllm-9.9.9-py3-none-any.whl",
        "vllm-9.9.9-py3-none-../../x.whl",
        "vllm-9.9.9-py3-none-any.zip",
        "/abs/vllm-9.9.9-py3-none-any.whl",
    ],
)
def test_a_wheel_name_from_data_that_is_not_a_plain_wheel_name_never_matches(name):
    assert not patch_wheels.wheel_matches(name, "vllm", "9.9.9")


def test_bad_input_from_unit_helpers():
    with pytest.raises(BadInput, match="leaves the engine"):
        patch_trees.DirTree(Path("/tmp")).read("../etc/passwd")


@pytest.mark.parametrize("record", ["dir", "under-a-file"])
def test_apply_refuses_an_unwritable_record_before_patching(env, record):
    stack = env.series({"0001-outer.patch": GOOD})
    (env.root / "dir").mkdir()
    (env.root / "file").write_text("x")
    path = env.root / "dir" if record == "dir" else env.root / "file" / "rec.json"
    before = snapshot(env.root)
    code, _, err = run_cli(
        "patches",
        "apply",
        "--stack",
        str(stack),
        "--site-packages",
        str(env.engine),
        "--no-runtime-probes",
        "--record",
        str(path),
    )
    assert_clean_refusal(code, err, allowed=(2,), names="--record")
    assert_nothing_written(before, snapshot(env.root))


def test_a_python_that_does_not_exist_is_exit_2(env):
    stack = env.series({"0001-outer.patch": GOOD})
    code, _, err = run_cli(
        "patches", "apply", "--stack", str(stack), "--python", str(env.root / "no-python"), "--no-runtime-probes"
    )
    assert_clean_refusal(code, err, allowed=(2,), names="no-python")


def test_ctrl_c_during_apply_puts_every_file_back(env, monkeypatch):
    stack = env.series({"0001-outer.patch": GOOD})
    real, calls = patch_series._refresh_bytecode, []

    def interrupted(source):
        calls.append(source)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(source)

    monkeypatch.setattr(patch_series, "_refresh_bytecode", interrupted)
    code, _, err = run_cli("patches", "apply", "--stack", str(stack), "--site-packages", str(env.engine), "--no-runtime-probes")
    assert code == 130, err
    assert (env.engine / "vllm" / "tiny.py").read_text() == MODULE
    assert not [p for p in env.root.rglob("*") if p.name.startswith(".speclock-tmp")]
