"""Multi-target locks: the image's target stays the lock's `packages`; each python.host_targets entry adds a
package set resolved by pip for that Python and machine, checked like the image's; lock --check sees host
targets added and removed; fetch --target fetches one target. Real pip resolution over tiny real wheels."""

import json
import subprocess
import sys

import pytest
from tinywheels import ROOT, tiny_lock, tiny_wheels, write_stack

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.spec import resolve
from speclock.spec.lock import (
    MACHINE_PLATFORMS,
    check_lock,
    finish_lock,
    lock_path,
    lock_targets,
    read_lock,
    target_lock,
    write_lock,
)
from speclock.spec.stack import canonical_sha256, load_stack


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny stack with host targets 3.12-x86_64 and 3.12-aarch64, its wheels, and its lock resolved by pip."""
    root = tmp_path_factory.mktemp("tiny")
    wheels = tiny_wheels(root / "wheels")
    stack = load_stack(write_stack(root, host_targets=("3.12-x86_64", "3.12-aarch64")))
    env = {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(root / "wheels")}
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    mp.setattr(resolve, "_pypi_url", lambda entry: None)  # local wheels: no PyPI lookup
    quiet = lambda *a: None  # noqa: E731
    installed, excluded, assets = resolve._resolve_set(
        stack, python="3.11", platforms=resolve.platform_tags(stack), index=None, progress=quiet
    )
    targets = {k: resolve.resolve_target(stack, k, progress=quiet) for k in stack.python["host_targets"]}
    mp.undo()
    doc = tiny_lock(stack, python="3.11", packages=installed, excluded=excluded, assets=assets, targets=targets)
    (root / "locks").mkdir()
    write_lock(root / "locks" / "tiny.lock", doc)
    return root, stack, doc, wheels


def test_each_target_is_resolved_for_its_own_python_and_machine(tiny):
    root, stack, doc, wheels = tiny
    files = {k: {p["name"]: p["filename"] for p in t["packages"]} for k, t in lock_targets(doc).items()}
    assert files["image"]["tinyengine"] == wheels["tinyengine-cp311-x86_64"].name
    assert files["3.12-x86_64"]["tinyengine"] == wheels["tinyengine-cp312-x86_64"].name
    assert files["3.12-aarch64"]["tinyengine"] == wheels["tinyengine-cp312-aarch64"].name
    for key in files:  # the dependency came from pip's resolver, not from the stack
        assert files[key]["tinydep"] == "tinydep-1.2-py3-none-any.whl" and "torch" in files[key]
    t = doc["targets"]["3.12-aarch64"]
    assert (t["python"], t["machine"]) == ("3.12", "aarch64")
    assert t["platforms"] == [f"manylinux_2_{n}_aarch64" for n in range(34, 16, -1)] + ["manylinux2014_aarch64", "linux_aarch64"]
    assert [a["name"] for a in t["assets"]] == ["tinyprompts"]
    # the image target keeps the lock's top-level keys, as before
    assert {p["name"] for p in doc["packages"]} == {"tinyengine", "tinydep", "torch"}
    back = read_lock(root / "locks" / "tiny.lock", stack=stack)
    assert back == doc and check_lock(stack, back) == []


def test_machine_platforms_is_data():
    # glibc 2.34 down to 2.17, newest first (llguidance, a vLLM dependency, has only manylinux_2_31 wheels)
    assert MACHINE_PLATFORMS["x86_64"][:2] == ("manylinux_2_34_x86_64", "manylinux_2_33_x86_64")
    assert MACHINE_PLATFORMS["x86_64"][-3:] == ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")
    assert MACHINE_PLATFORMS["aarch64"] == tuple(t.replace("x86_64", "aarch64") for t in MACHINE_PLATFORMS["x86_64"])
    assert resolve.host_target_doc("3.12-aarch64")["platforms"] == list(MACHINE_PLATFORMS["aarch64"])


def test_committed_locks_stay_valid_unchanged_and_in_sync():
    for path in sorted((ROOT / "stacks").glob("*.toml")):
        stack = load_stack(path.stem)
        raw = json.loads(lock_path(stack).read_text())
        hosts = list(stack.python["host_targets"])
        # no host targets: the lock keeps its old shape (no 'targets' key) and its hash
        assert ("targets" in raw) == bool(hosts), path.stem
        doc = read_lock(lock_path(stack), stack=stack)
        assert check_lock(stack, doc) == [], path.stem
        assert finish_lock(doc)["lock_sha256"] == raw["lock_sha256"]
        assert list(lock_targets(doc)) == ["image", *hosts] and lock_targets(doc)["image"]["machine"] == "x86_64"


def test_check_sees_a_host_target_added_or_removed(tiny, tmp_path):
    root, stack, doc, _ = tiny
    # added to a committed stack: the pinned view differs (the lock has none)
    text = (
        (ROOT / "stacks" / "cpu-vllm.toml")
        .read_text()
        .replace('version = "3.11"', 'version = "3.11"\nhost_targets = ["3.12-x86_64"]', 1)
    )
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "cpu-vllm.toml").write_text(text)
    added = check_lock(load_stack(tmp_path / "stacks" / "cpu-vllm.toml"), read_lock(ROOT / "locks" / "cpu-vllm.lock"))
    assert added == ["python.host_targets: lock has None, stack says ['3.12-x86_64']"]
    # removed from the tiny stack
    write_stack(tmp_path / "b", host_targets=("3.12-x86_64",))
    removed = check_lock(load_stack(tmp_path / "b" / "stacks" / "tiny.toml"), doc)
    assert removed == ["python.host_targets: lock has ['3.12-x86_64', '3.12-aarch64'], stack says ['3.12-x86_64']"]
    # a lock whose stack hash matches but whose targets do not (made by hand, hash recomputed)
    crafted = finish_lock({**doc, "targets": {"3.12-x86_64": doc["targets"]["3.12-x86_64"]}})
    assert check_lock(stack, crafted) == [
        "python.host_targets: lock has ['3.12-x86_64'], stack says ['3.12-aarch64', '3.12-x86_64']"
    ]


def _tampered(tmp_path, doc, edit):
    bad = json.loads(json.dumps(doc))
    edit(bad)
    path = tmp_path / "tiny.lock"
    path.write_text(json.dumps(finish_lock(bad)))  # hash recomputed: only provenance can catch it
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["targets"]["3.12-x86_64"]["packages"][0].update(
                url="https://evil.example/x/" + d["targets"]["3.12-x86_64"]["packages"][0]["filename"]
            ),
            "targets.3.12-x86_64.packages[0] (tinydep).url",
        ),
        (lambda d: d["targets"]["3.12-x86_64"]["packages"][0].update(filename="../../x.whl"), "is not a plain file name"),
        (
            lambda d: d["targets"]["3.12-aarch64"]["assets"][0].update(sha256="abc"),
            "targets.3.12-aarch64.assets[0] (tinyprompts).sha256",
        ),
        (lambda d: d["targets"]["3.12-x86_64"]["packages"][1].update(version="2.0"), "the entry says tinyengine 2.0"),
        (lambda d: d["targets"].update({"3.12-riscv64": d["targets"].pop("3.12-x86_64")}), "machine 'riscv64'"),
        (lambda d: d["targets"]["3.12-x86_64"].update(python="3.13"), "targets.3.12-x86_64.python is '3.13'"),
        (
            lambda d: d["targets"]["3.12-x86_64"].update(platforms=["manylinux_2_28_aarch64"]),
            "not a wheel platform tag of x86_64",
        ),
    ],
)
def test_every_targets_entries_get_the_provenance_checks(tiny, tmp_path, edit, message):
    _, stack, doc, _ = tiny
    with pytest.raises(BadInput, match=None) as err:
        read_lock(_tampered(tmp_path, doc, edit), stack=stack)
    assert message in str(err.value)


def test_hand_edited_target_breaks_the_lock_hash(tiny, tmp_path):
    _, stack, doc, _ = tiny
    bad = json.loads(json.dumps(doc))
    bad["targets"]["3.12-x86_64"]["packages"][0]["version"] = "1.3"
    (tmp_path / "tiny.lock").write_text(json.dumps(bad))
    with pytest.raises(BadInput, match="does not match its lock_sha256"):
        read_lock(tmp_path / "tiny.lock", stack=stack)


def test_target_lock_is_a_valid_lock_of_that_target(tiny, tmp_path):
    _, stack, doc, wheels = tiny
    view = target_lock(doc, "3.12-x86_64")
    assert view["packages"] == doc["targets"]["3.12-x86_64"]["packages"] and "targets" not in view
    assert view["python"] == {"version": "3.12", "platforms": list(MACHINE_PLATFORMS["x86_64"])}
    assert (view["target"], view["lock_from"]) == ("3.12-x86_64", doc["lock_sha256"])
    write_lock(tmp_path / "view.lock", view)
    assert read_lock(tmp_path / "view.lock", stack=stack) == view and check_lock(stack, view) == []
    with pytest.raises(BadInput) as err:
        target_lock(doc, "3.13-x86_64")
    assert "image (3.11-x86_64), 3.12-x86_64, 3.12-aarch64" in str(err.value) and "python.host_targets" in str(err.value)


def test_fetch_target_fills_the_same_wheelhouse(tiny, tmp_path):
    root, _, doc, wheels = tiny
    env = {"SPECLOCK_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")}
    base = [
        sys.executable,
        "-m",
        "speclock",
        "fetch",
        "--stack",
        str(root / "stacks" / "tiny.toml"),
        "--lock",
        str(root / "locks" / "tiny.lock"),
    ]
    proc = subprocess.run(base + ["--target", "3.12-aarch64", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    store = tmp_path / "cache" / "wheelhouse"
    for p in doc["targets"]["3.12-aarch64"]["packages"] + doc["targets"]["3.12-aarch64"]["assets"]:
        assert (store / p["sha256"] / p["filename"]).is_file()
    assert not (store / doc["packages"][1]["sha256"]).exists()  # the image's cp311 wheel: not this target's
    assert json.loads(proc.stdout)["targets"] == ["3.12-aarch64"]
    proc = subprocess.run(base + ["--target", "3.9-x86_64"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "has no target '3.9-x86_64'" in proc.stderr and "3.12-aarch64" in proc.stderr
    proc = subprocess.run(base + ["--target", "all"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (store / doc["packages"][1]["sha256"]).is_dir()


def test_lock_doc_hash_covers_targets(tiny):
    _, _, doc, _ = tiny
    assert doc["lock_sha256"] == canonical_sha256({k: v for k, v in doc.items() if k != "lock_sha256"})


def test_fetch_leaves_out_host_packages(tiny, tmp_path):
    root, _, doc, _ = tiny
    env = {"SPECLOCK_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speclock",
            "fetch",
            "--stack",
            str(root / "stacks" / "tiny.toml"),
            "--lock",
            str(root / "locks" / "tiny.lock"),
            "--target",
            "3.12-x86_64",
            "--use-host-packages",
            "torch,tiny*",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    fetched = sorted(p.name for p in (tmp_path / "cache" / "wheelhouse").glob("*/*.whl"))
    assert fetched == ["tinyprompts-1.0-py3-none-any.whl"]  # the data wheel is always fetched


def test_a_torch_wheel_from_a_local_folder_gets_its_index_url(tmp_path, monkeypatch):
    """The resolve path `lock` takes: pip finds torch in a local folder (its index unreachable); the lock names the
    index's file URL and keeps the local wheel as mirror_url. Wheels no index is known to serve keep file://, and
    `require_portable` (the end of resolve_lock) refuses such a lock."""
    wheels = tiny_wheels(tmp_path / "wheels")
    path = write_stack(tmp_path)
    path.write_text(
        path.read_text().replace('version = "9.9.9"', 'version = "9.9.9"\nindex = "https://download.pytorch.org/whl/cpu"')
    )
    stack = load_stack(path)
    for k, v in {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "wheels")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(resolve, "_pypi_url", lambda entry: None)  # tiny wheels: PyPI has none of them
    installed, _, _ = resolve._resolve_set(
        stack, python="3.11", platforms=resolve.platform_tags(stack), index=None, progress=lambda *a: None
    )
    torch = next(p for p in installed if p["name"] == "torch")
    assert torch["url"] == "https://download.pytorch.org/whl/cpu/torch-9.9.9-py3-none-any.whl"
    assert torch["mirror_url"] == wheels["torch"].resolve().as_uri()
    others = [p for p in installed if p["name"] != "torch"]
    assert others and all(p["url"].startswith("file://") and "mirror_url" not in p for p in others)
    with pytest.raises(EnvironmentProblem) as err:
        resolve.require_portable(stack, {"packages": installed, "assets": [], "stack": stack.name})
    assert "tinydep 1.2" in str(err.value) and "torch" not in str(err.value).split("them:")[1].split(";")[0]
