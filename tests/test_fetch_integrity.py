"""Locks, fetch and the wheelhouse against bad input (issue #15): one regression test per defect.

No network: wheels come from a local HTTP server on 127.0.0.1 (tests/fetch_server.py) or file://.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fetch_server import ROOT, WheelServer, copy_committed_lock, make_lock, make_stack, seal, wheel_entry
from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot

from speclock.build import fetch, wheelhouse
from speclock.core.errors import BadInput
from speclock.core.files import file_sha256
from speclock.engines import envs as engine_envs
from speclock.spec import baseimage
from speclock.spec.lock import read_lock
from speclock.spec.stack import load_stack


@pytest.fixture
def server():
    srv = WheelServer()
    yield srv
    srv.close()


@pytest.fixture
def env(tmp_path):
    return {"SPECLOCK_CACHE": str(tmp_path / "cache")}


def fetch_cli(stack: Path, lock: Path, env: dict, *extra: str) -> tuple[int, str, str]:
    return run_cli("fetch", "--stack", str(stack), "--lock", str(lock), *extra, env=env)


def store_files(tmp_path: Path) -> list[Path]:
    store = tmp_path / "cache" / "wheelhouse"
    return sorted(p for p in store.rglob("*") if p.is_file()) if store.is_dir() else []


# --- lock filenames and provenance --------------------------------------------------------------


@pytest.mark.parametrize(
    "filename", ["../../evil.whl", "../evil.whl", "/tmp/evil.whl", "..", "a/b.whl", "x\x00.whl", ".hidden.whl"]
)
def test_filename_that_leaves_the_wheelhouse_is_refused_before_writing(tmp_path, server, env, filename):
    entry = wheel_entry(server, "demo-a")
    entry["filename"] = filename
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [entry])
    stack = make_stack(tmp_path, server)
    before = snapshot(tmp_path)
    code, _, err = fetch_cli(stack, lock, env)
    assert_clean_refusal(code, err, allowed=(2,), names=str(lock))
    assert "packages[0] (demo-a)" in err and "'filename'" in err
    assert_nothing_written(before, snapshot(tmp_path))
    assert not (tmp_path / "cache").exists() and not (tmp_path / "evil.whl").exists()
    assert server.hits == {}  # refused before any download


def _mutate(server, change):
    entry = wheel_entry(server, "demo-a", "1.0")
    change(entry)
    return entry


PROVENANCE = {
    "foreign https host": (lambda e: e.update(url="https://evil.example/files/" + e["filename"]), "which no stack allows"),
    "plain http elsewhere": (lambda e: e.update(url="http://evil.example/" + e["filename"]), "only https"),
    "odd port on an allowed host": (
        lambda e: e.update(url="https://files.pythonhosted.org:8443/" + e["filename"]),
        "which no stack allows",
    ),
    "invalid port": (lambda e: e.update(url="https://files.pythonhosted.org:99999/" + e["filename"]), "invalid port"),
    "ftp scheme": (lambda e: e.update(url="ftp://files.pythonhosted.org/" + e["filename"]), "scheme 'ftp'"),
    "credentials in url": (lambda e: e.update(url="https://u:p@files.pythonhosted.org/" + e["filename"]), "credentials"),
    "filename is not the url's": (lambda e: e.update(filename="demo_a-1.0-py2-none-any.whl"), "is not the file its url names"),
    "version differs from wheel": (lambda e: e.update(version="2.0"), "the entry says demo-a 2.0"),
    "name differs from wheel": (lambda e: e.update(name="demo-b"), "the entry says demo-b 1.0"),
    "sha256 too short": (lambda e: e.update(sha256="ab" * 31), "64 lower-case hex"),
    "sha256 upper case": (lambda e: e.update(sha256=e["sha256"].upper()), "64 lower-case hex"),
    "mirror not file://": (lambda e: e.update(mirror_url="https://files.pythonhosted.org/" + e["filename"]), "mirror_url"),
    "mirror names another file": (
        lambda e: e.update(mirror_url="file:///opt/wheels/other-1.0-py3-none-any.whl"),
        "mirror_url names",
    ),
    "file url with a host": (lambda e: e.update(url="file://evil.example/x/" + e["filename"]), "with a host"),
}


@pytest.mark.parametrize("case", sorted(PROVENANCE))
def test_crafted_lock_with_recomputed_hash_fails_provenance(tmp_path, server, env, case):
    change, says = PROVENANCE[case]
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [_mutate(server, change)])
    stack = make_stack(tmp_path, server)
    for argv in (
        ("lock", "--check", "--stack", str(stack), "--lock", str(lock)),
        ("fetch", "--stack", str(stack), "--lock", str(lock)),
    ):
        code, _, err = run_cli(*argv, env=env)
        assert_clean_refusal(code, err, allowed=(2,), names=str(lock))
        assert "packages[0]" in err and says in err, err
    assert server.hits == {}


def test_wheel_names_are_compared_normalised(tmp_path, server):
    entry = wheel_entry(server, "Demo.Pkg_x", "1.0")  # file demo.pkg_x-1.0-..., entry name Demo.Pkg_x
    entry["name"] = "demo-pkg-x"
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [entry])
    assert read_lock(lock, stack=load_stack(make_stack(tmp_path, server)))["packages"][0]["name"] == "demo-pkg-x"


def test_unrecomputed_edit_is_refused_as_a_hash_mismatch(tmp_path):
    doc = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())
    doc["packages"][0]["url"] = doc["packages"][0]["url"].replace("files.pythonhosted.org", "evil.example")
    path = tmp_path / "locks" / "cpu-vllm.lock"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    code, _, err = run_cli("lock", "--check", "--lock", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names=str(path))
    assert "lock_sha256" in err


def _committed_with(tmp_path, change) -> Path:
    doc = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())
    change(doc)
    path = tmp_path / "locks" / "cpu-vllm.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(seal(doc)))
    return path


@pytest.mark.parametrize(
    "field,value",
    [("suite", "--customize-hook=touch /pwned"), ("mirror", "http://x y/"), ("mode", "unshare"), ("variant", "custom")],
)
def test_base_recipe_values_a_stack_cannot_give_are_refused(tmp_path, field, value):
    path = _committed_with(tmp_path, lambda d: d["base"]["recipe"].update({field: value}))
    code, _, err = run_cli("lock", "--check", "--lock", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names=f"base.recipe.{field}")
    assert str(path) in err


def test_crafted_recipe_with_an_honest_stack_hash_fails_lock_check(tmp_path):
    path = _committed_with(tmp_path, lambda d: d["base"]["recipe"].update(mirror="https://evil.example/debian"))
    code, _, err = run_cli("lock", "--check", "--lock", str(path))
    assert code == 1, err
    assert "base.recipe.mirror: lock has 'https://evil.example/debian', stack says 'http://deb.debian.org/debian'" in err


@pytest.mark.parametrize("stack", sorted(p.stem for p in (ROOT / "stacks").glob("*.toml")))
def test_committed_locks_pass_the_provenance_checks(stack):
    code, out, err = run_cli("lock", "--check", "--stack", stack)
    assert code == 0, err
    assert "in sync" in out


# --- lock readers: encoding and shape -----------------------------------------------------------

SHAPES = {
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
    "NUL bytes": (b"{\x00\x00}", "NUL byte"),
    "not utf-8": (b'{"schema": "\xff\xfe"}', "not UTF-8"),
    "torn json": (b'{"schema": "speclock.lock/v1", "packages": [', "not valid JSON"),
    "a list at the top": (b"[1, 2]", "holds a JSON list"),
    "NaN": (b'{"schema": NaN}', "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_lock_that_is_not_a_json_object_is_bad_input(tmp_path, case):
    data, says = SHAPES[case]
    path = tmp_path / "cpu-vllm.lock"
    path.write_bytes(data)
    code, _, err = run_cli("lock", "--check", "--lock", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names=str(path))
    assert says in err


WRONG_SHAPE = {
    "packages not a list": (lambda d: d.update(packages={"a": 1}), "packages is object"),
    "entry is a string": (lambda d: d["packages"].__setitem__(0, "torch"), "packages[0] is string"),
    "entry is a list": (lambda d: d["assets"].__setitem__(0, []), "assets[0] is list"),
    "filename a number": (lambda d: d["packages"][1].update(filename=7), ".filename is number"),
    "name missing": (lambda d: d["packages"][2].pop("name"), "key 'name' is missing"),
    "base a string": (lambda d: d.update(base="debian"), "base is string"),
    "base recipe packages a string": (lambda d: d["base"]["recipe"].update(packages="python3"), "base.recipe.packages"),
    "stack a path": (lambda d: d.update(stack="../x"), "stack '../x' is not a plain file name"),
    "excluded a string": (lambda d: d.update(excluded="torchvision"), "excluded is string"),
    "schema missing": (lambda d: d.pop("schema"), "schema is 'None'"),
    "lock_sha256 a list": (lambda d: d.update(lock_sha256=[]), "lock_sha256 is list"),
}


@pytest.mark.parametrize("case", sorted(WRONG_SHAPE))
def test_lock_of_the_wrong_shape_names_the_key(tmp_path, case):
    change, says = WRONG_SHAPE[case]
    doc = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())
    change(doc)
    if isinstance(doc.get("lock_sha256"), str):
        seal(doc)  # so the shape check, not the hash, is what refuses it
    path = copy_committed_lock(tmp_path / "locks" / "cpu-vllm.lock")
    path.write_text(json.dumps(doc))
    code, _, err = run_cli("lock", "--check", "--lock", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names=str(path))
    assert says in err, err


# --- the wheelhouse: verified on every use --------------------------------------------------------


def test_truncated_cached_wheel_is_refetched(tmp_path, server, env):
    entries = [wheel_entry(server, "demo-a"), wheel_entry(server, "demo-b")]
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", entries)
    stack = make_stack(tmp_path, server)
    assert fetch_cli(stack, lock, env)[0] == 0
    cached = tmp_path / "cache" / "wheelhouse" / entries[0]["sha256"] / entries[0]["filename"]
    cached.write_bytes(cached.read_bytes()[:100])  # truncated, as by a full disk or a killed copy
    code, out, err = fetch_cli(stack, lock, env)
    assert code == 0, err
    assert "refetched (cached copy failed its sha256)" in out and "1 cached" in out
    assert file_sha256(cached) == entries[0]["sha256"]


def test_link_into_reverifies_an_entry_changed_after_fetch(tmp_path, server, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    entry = wheel_entry(server, "demo-a")
    lock = {"stack": "cpu-vllm", "packages": [entry], "assets": []}
    store = tmp_path / "store"
    fetch.fetch(lock, store=store, progress=lambda m: None)
    cached = wheelhouse.entry_path(entry, store)
    # fetch records its verification (a build then trusts it while the file's stat is unchanged) ...
    stamps = json.loads((store / wheelhouse.STAMPS).read_text())
    assert stamps[cached.relative_to(store).as_posix()][4] == entry["sha256"]
    # ... and a changed file is hashed again, not trusted by its stamp.
    cached.write_bytes(cached.read_bytes()[:10])
    wheelhouse.link_into(lock, tmp_path / "ctx", store=store)
    assert file_sha256(tmp_path / "ctx" / entry["filename"]) == entry["sha256"]


def test_truncated_base_tarball_is_not_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    tar = tmp_path / "cache" / "base" / "x.tar"
    tar.parent.mkdir(parents=True)
    tar.write_bytes(b"t" * 1000)
    assert baseimage._reusable(tar) == hashlib.sha256(b"t" * 1000).hexdigest()  # records the sidecar
    tar.write_bytes(b"t" * 10)
    assert baseimage._reusable(tar) is None
    assert not tar.exists() and tar.with_name("x.tar.corrupt").exists()


def test_engine_env_with_a_corrupt_marker_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    d = engine_envs.env_dir("vllm==0.1.0")
    (d / "bin").mkdir(parents=True)
    (d / "bin" / "python").write_text("")
    for marker in (b"\xff\xfe", b"[1]", b'{"spec": "vllm==0.1.0"'):
        (d / engine_envs.MARKER).write_bytes(marker)
        assert engine_envs.env_python("vllm==0.1.0") is None
    (d / engine_envs.MARKER).write_text(json.dumps({"spec": "vllm==0.1.0"}))
    assert engine_envs.env_python("vllm==0.1.0") == d / "bin" / "python"
    with pytest.raises(BadInput):
        engine_envs.parse_spec("vllm==../../home")


# --- arguments, messages -------------------------------------------------------------------------


@pytest.mark.parametrize("jobs", ["0", "-1", "x", "1.5"])
def test_jobs_must_be_a_positive_integer(tmp_path, env, jobs):
    code, _, err = run_cli("fetch", "--jobs", jobs, env=env)
    assert code == 2 and "--jobs" in err and "Traceback" not in err
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("status", ["404", "410"])
def test_missing_file_is_not_retried_and_says_not_found(tmp_path, server, env, status):
    entry = wheel_entry(server, "demo-a", mode=status)
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [entry])
    started = time.monotonic()
    code, _, err = fetch_cli(make_stack(tmp_path, server), lock, env)
    assert time.monotonic() - started < 2
    assert_clean_refusal(code, err, allowed=(3,), names=f"not found at {entry['url']}")
    assert "network" not in err and "re-lock" in err
    assert server.hits == {f"/files/{entry['filename']}": 1}
    assert not [p for p in store_files(tmp_path) if p.name.startswith(".part-")]


def test_disk_full_while_downloading_says_disk_full(tmp_path, server, env, monkeypatch):
    entry = wheel_entry(server, "demo-a", data=b"w" * 300_000)
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [entry])
    real_mkstemp = wheelhouse.tempfile.mkstemp

    def full_disk(prefix, dir):  # the .part file lives on a disk that is full
        fd, name = real_mkstemp(prefix=prefix, dir=dir)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), name

    monkeypatch.setattr(wheelhouse.tempfile, "mkstemp", full_disk)
    code, _, err = fetch_cli(make_stack(tmp_path, server), lock, env)
    assert_clean_refusal(code, err, allowed=(3,), names="disk full")
    assert "network" not in err
    assert server.hits == {f"/files/{entry['filename']}": 1}  # not retried
    assert not [p for p in store_files(tmp_path) if p.name.startswith(".part-")]


def test_hash_refusal_names_the_url(tmp_path, server, env):
    entry = wheel_entry(server, "demo-a", mode="wrong")
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [entry])
    code, _, err = fetch_cli(make_stack(tmp_path, server), lock, env)
    assert_clean_refusal(code, err, allowed=(1,))
    assert f"from {entry['url']} has sha256" in err and "refused" in err
    assert not store_files(tmp_path)


def test_hash_refusal_names_the_mirror_path_used(tmp_path, server, env):
    entry = wheel_entry(server, "demo-a")
    mirror = tmp_path / "mirror" / entry["filename"]
    mirror.parent.mkdir()
    mirror.write_bytes(b"other bytes")
    entry["mirror_url"] = mirror.as_uri()
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [entry])
    code, _, err = fetch_cli(make_stack(tmp_path, server), lock, env)
    assert_clean_refusal(code, err, allowed=(1,))
    assert f"from the local mirror {mirror} has sha256" in err
    assert server.hits == {}


@pytest.mark.parametrize("where", ["at", "under"])
def test_cache_path_at_or_under_a_file_is_a_clean_error(tmp_path, server, where):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    cache = blocker if where == "at" else blocker / "sub" / "cache"
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [wheel_entry(server, "demo-a")])
    code, _, err = fetch_cli(make_stack(tmp_path, server), lock, {"SPECLOCK_CACHE": str(cache)})
    assert_clean_refusal(code, err, allowed=(2,), names=f"{blocker} is a file")
    assert blocker.read_text() == "x"


# --- leftovers and Ctrl-C -------------------------------------------------------------------------


def test_stale_part_files_are_cleaned_but_live_ones_kept(tmp_path, server, env):
    entry = wheel_entry(server, "demo-a")
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [entry])
    stack = make_stack(tmp_path, server)
    folder = tmp_path / "cache" / "wheelhouse" / ("e" * 64)
    folder.mkdir(parents=True)
    stale, live = folder / ".part-abc123", folder / ".part-def456"
    temp = tmp_path / "cache" / "wheelhouse" / ".speclock-tmp-x.lock.123"
    other = folder / "keep-me.part-1"  # not a temp of ours
    for p in (stale, live, temp, other):
        p.write_bytes(b"half")
    old = time.time() - 3600
    for p in (stale, temp, other):
        os.utime(p, (old, old))
    code, out, err = fetch_cli(stack, lock, env)
    assert code == 0, err
    assert not stale.exists() and not temp.exists()
    assert live.exists() and other.exists()
    assert "removed 2 temp file(s)" in out


@pytest.mark.parametrize("mode", ["slow", "stall"])
def test_ctrl_c_stops_fetch_within_2_seconds_and_leaves_no_part(tmp_path, server, mode):
    entries = [wheel_entry(server, f"demo-{c}", data=os.urandom(2_000_000), mode=mode) for c in "abcdef"]
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", entries)
    stack = make_stack(tmp_path, server)
    cache = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-m", "speclock", "fetch", "--stack", str(stack), "--lock", str(lock), "--jobs", "2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src"), SPECLOCK_CACHE=str(cache)),
        # A shell's background job (CI started with `&`) ignores SIGINT, and an ignored signal
        # survives exec: give the child the default, as a terminal's Ctrl-C would find it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 20
        while not list((cache / "wheelhouse").rglob(".part-*")) if (cache / "wheelhouse").is_dir() else True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no download started"
            time.sleep(0.05)
        time.sleep(0.3)  # downloads are running, four more are queued
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert took < 2, f"Ctrl-C took {took:.1f} s"
    print(f"Ctrl-C to exit: {took:.2f} s")
    assert "interrupted" in err and "Traceback" not in err
    assert not list(cache.rglob(".part-*")), "a half-written download was left"
    assert not [p for p in cache.rglob("*.whl")], "nothing should have finished"
    assert len(server.hits) <= 3, "queued downloads must be cancelled, not started"


def test_cached_engine_wheel_is_verified_on_every_use(tmp_path):
    import zipfile

    wheel = tmp_path / "wheels" / "vllm-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/__init__.py", "x = 1\n" * 1000)
    assert wheelhouse.cached_wheel_intact(wheel)  # a complete zip from before sidecars: accepted, recorded
    assert wheel.with_name(wheel.name + ".sha256").read_text().strip() == file_sha256(wheel)
    assert wheelhouse.cached_wheel_intact(wheel)
    wheel.write_bytes(wheel.read_bytes()[:-20])  # truncated
    assert not wheelhouse.cached_wheel_intact(wheel)
    wheel.with_name(wheel.name + ".sha256").unlink()
    assert not wheelhouse.cached_wheel_intact(wheel)  # no record, and not a complete zip


def test_wheelhouse_path_that_is_a_file_is_a_clean_error(tmp_path, server, env):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "wheelhouse").write_text("x")
    lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", [wheel_entry(server, "demo-a")])
    code, _, err = fetch_cli(make_stack(tmp_path, server), lock, env)
    assert_clean_refusal(code, err, allowed=(2,), names=str(tmp_path / "cache" / "wheelhouse"))


def test_lock_writer_is_atomic_and_cleans_a_killed_writers_temp(tmp_path):
    from speclock.core.files import TEMP_PREFIX
    from speclock.spec.lock import write_lock

    old_temp = tmp_path / f"{TEMP_PREFIX}cpu-vllm.lock.abc"
    old_temp.write_text("{half")
    os.utime(old_temp, (time.time() - 3600, time.time() - 3600))
    doc = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())
    write_lock(tmp_path / "cpu-vllm.lock", doc)
    assert (tmp_path / "cpu-vllm.lock").read_text() == (ROOT / "locks" / "cpu-vllm.lock").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-vllm.lock"]
