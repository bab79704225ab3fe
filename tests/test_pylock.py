"""pylock.<stack>.toml (PEP 751): every committed lock has one with the same wheels, URLs and sha256; targets become
environment markers that pip and uv evaluate; `lock --check` catches a missing or drifted pylock; the two files
are written both or neither; pip and uv install a lock's environment from it offline, from a wheelhouse, and get
exactly the lock's packages (tiny real wheels, no network)."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from fuzz_support import run_cli
from packaging.markers import Marker
from packaging.pylock import Pylock
from tinywheels import base_of_committed_lock, make_wheel, write_stack

from speclock.build.fetch import fetch
from speclock.core.errors import BadInput
from speclock.spec import pylock as pl
from speclock.spec.lock import finish_lock, lock_targets, read_lock
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]
LOCKS = sorted((ROOT / "locks").glob("*.lock"))
UV = Path(sys.executable).with_name("uv")


def env_of(python: str, machine: str = "x86_64") -> dict:
    """A marker environment of CPython `python` on Linux `machine`."""
    return {
        "python_version": python,
        "python_full_version": python + ".0",
        "platform_machine": machine,
        "sys_platform": "linux",
        "implementation_name": "cpython",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_python_implementation": "CPython",
        "extra": "",
        "platform_release": "",
        "platform_version": "",
        "implementation_version": python + ".0",
    }


def selected(pylock: dict, env: dict) -> dict[str, str]:
    """What an installer takes from the pylock in `env`: {name: version} of the packages whose marker holds."""
    out = {}
    for p in pylock["packages"]:
        if "marker" not in p or Marker(p["marker"]).evaluate(env):
            assert p["name"] not in out, f"two entries of {p['name']} apply in {env['python_version']}"
            out[p["name"]] = p["version"]
    return out


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.stem)
def test_committed_lock_has_a_valid_pylock_with_its_wheels(lock):
    doc = json.loads(lock.read_text())
    path = pl.pylock_path(lock)
    assert path.name == "pylock." + lock.stem.replace(".", "_") + ".toml" and path.is_file()
    data = tomllib.loads(path.read_text())
    Pylock.from_dict(data).validate()  # the PEP 751 reader of `packaging` (what pip vendors)
    assert data["lock-version"] == "1.0" and data["created-by"] == "speclock"
    want = {(p["filename"], p["url"], p["sha256"]) for t in lock_targets(doc).values() for p in t["packages"]}
    have = {(w["name"], w["url"], w["hashes"]["sha256"]) for p in data["packages"] for w in p["wheels"]}
    assert have == want
    assert not any(u.startswith("file:") for _, u, _ in have)
    # each target's environment gets exactly that target's package versions
    for key, target in lock_targets(doc).items():
        env = env_of(target["python"], target["machine"])
        assert any(Marker(m).evaluate(env) for m in data["environments"]), key
        assert selected(data, env) == {p["name"]: p["version"] for p in target["packages"]}, key
    tool = data["tool"]["speclock"]
    assert tool["lock-sha256"] == doc["lock_sha256"] and tool["base"]["sha256"] == doc["base"]["sha256"]
    assert list(tool["targets"]) == list(lock_targets(doc))
    assert pl.pylock_drift(lock, read_lock(lock)) == []


def _two_target_lock(tmp_path, *, host="3.12-x86_64", host_dep="1.3") -> dict:
    """A lock of tiny wheels: image 3.11 (tinyengine cp311, tinydep 1.2, torch 9.9.9) and a host target whose
    tinydep is `host_dep` (tinyengine cp312 when its Python is 3.12). URLs on PyPI's file host, never contacted;
    the wheels themselves are local mirrors (mirror_url)."""
    folder = tmp_path / "wheels"
    py, machine = host.split("-")
    tag = py.replace(".", "")

    def entry(path, name, version):
        import hashlib

        return {
            "name": name,
            "version": version,
            "filename": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "url": f"https://files.pythonhosted.org/packages/00/{path.name}",
            "mirror_url": path.resolve().as_uri(),
        }

    image = [
        entry(make_wheel(folder, "tinydep", "1.2"), "tinydep", "1.2"),
        entry(
            make_wheel(folder, "tinyengine", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64", requires=("tinydep>=1",)),
            "tinyengine",
            "1.0",
        ),
        entry(make_wheel(folder, "torch", "9.9.9"), "torch", "9.9.9"),
    ]
    hosted = [
        entry(make_wheel(folder, "tinydep", host_dep), "tinydep", host_dep),
        entry(
            make_wheel(folder, "tinyengine", "1.0", tag=f"cp{tag}-cp{tag}-manylinux_2_17_{machine}", requires=("tinydep>=1",)),
            "tinyengine",
            "1.0",
        ),
        image[2],
    ]
    prompts = entry(make_wheel(folder, "tinyprompts", "1.0"), "tinyprompts", "1.0")
    platforms = [f"manylinux_2_17_{machine}"]
    return finish_lock(
        {
            "schema": "speclock.lock/v1",
            "stack": "tiny",
            "stack_sha256": "0" * 64,
            "base": base_of_committed_lock(),
            "python": {"version": "3.11", "platforms": ["manylinux_2_17_x86_64"]},
            "source_date_epoch": 0,
            "packages": image,
            "excluded": [],
            "assets": [prompts],
            "targets": {
                host: {
                    "python": py,
                    "machine": machine,
                    "platforms": platforms,
                    "packages": hosted,
                    "excluded": [],
                    "assets": [prompts],
                }
            },
        }
    )


def test_targets_are_environments_and_versions_of_some_targets_get_markers(tmp_path):
    doc = pl.pylock_doc(_two_target_lock(tmp_path))
    assert doc["environments"] == [pl.environment_marker("3.11", "x86_64"), pl.environment_marker("3.12", "x86_64")]
    assert doc["requires-python"] == ">=3.11,<3.13"
    by = {(p["name"], p["version"]): p for p in doc["packages"]}
    assert "marker" not in by[("torch", "9.9.9")] and "marker" not in by[("tinyengine", "1.0")]
    assert by[("tinydep", "1.2")]["marker"] == pl.environment_marker("3.11", "x86_64")
    assert by[("tinydep", "1.3")]["marker"] == pl.environment_marker("3.12", "x86_64")
    # one version, two builds: both wheels listed, the installer picks by tag
    assert [w["name"] for w in by[("tinyengine", "1.0")]["wheels"]] == [
        "tinyengine-1.0-cp311-cp311-manylinux_2_17_x86_64.whl",
        "tinyengine-1.0-cp312-cp312-manylinux_2_17_x86_64.whl",
    ]
    assert selected(doc, env_of("3.11")) == {"tinydep": "1.2", "tinyengine": "1.0", "torch": "9.9.9"}
    assert selected(doc, env_of("3.12")) == {"tinydep": "1.3", "tinyengine": "1.0", "torch": "9.9.9"}
    assert selected(doc, env_of("3.12", "aarch64")) == {"tinyengine": "1.0", "torch": "9.9.9"}
    assert not any(Marker(m).evaluate(env_of("3.12", "aarch64")) for m in doc["environments"])  # installers refuse
    # speclock's own data: assets and targets under [tool.speclock], never as packages; no machine-local mirror_url
    assert doc["tool"]["speclock"]["targets"]["image"]["assets"][0]["name"] == "tinyprompts"
    assert "tinyprompts" not in {p["name"] for p in doc["packages"]}
    assert "mirror_url" not in pl.render(doc) and "file:" not in pl.render(doc)
    Pylock.from_dict(tomllib.loads(pl.render(doc))).validate()


def test_two_targets_of_one_environment_with_other_versions_are_refused(tmp_path):
    with pytest.raises(BadInput) as err:
        pl.pylock_doc(_two_target_lock(tmp_path, host="3.11-x86_64"))
    assert "targets image and 3.11-x86_64" in str(err.value) and "tinydep 1.2 and 1.3" in str(err.value)
    # a package only one of them locks: the same
    doc = _two_target_lock(tmp_path / "c", host="3.11-x86_64", host_dep="1.2")
    doc["targets"]["3.11-x86_64"]["packages"].pop(2)  # torch
    with pytest.raises(BadInput) as err:
        pl.pylock_doc(finish_lock(doc))
    assert "lock torch 9.9.9 and (none)" in str(err.value)
    # the same versions in both: nothing to tell apart, one environment
    assert pl.pylock_doc(_two_target_lock(tmp_path / "b", host="3.11-x86_64", host_dep="1.2"))["environments"] == [
        pl.environment_marker("3.11", "x86_64")
    ]


def test_pylock_file_names_follow_pep751():
    assert pl.pylock_path(Path("locks/cpu-vllm.lock")) == Path("locks/pylock.cpu-vllm.toml")
    assert pl.pylock_path(Path("x/vllm-0.26.0-torch2.11-cu130.lock")).name == "pylock.vllm-0_26_0-torch2_11-cu130.toml"


def test_lock_and_pylock_are_written_both_or_neither(tmp_path, monkeypatch):
    doc = _two_target_lock(tmp_path)
    lock = tmp_path / "locks" / "tiny.lock"
    pl.write_lock_files(lock, doc)
    before = {p.name: p.read_bytes() for p in lock.parent.iterdir()}
    assert sorted(before) == ["pylock.tiny.toml", "tiny.lock"]
    newer = finish_lock({**doc, "source_date_epoch": 7})

    def lock_write_fails(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pl, "write_lock", lock_write_fails)
    with pytest.raises(OSError):
        pl.write_lock_files(lock, newer)
    assert {p.name: p.read_bytes() for p in lock.parent.iterdir()} == before  # the old pylock is back
    monkeypatch.undo()
    monkeypatch.setattr(pl, "render", lambda d: (_ for _ in ()).throw(BadInput("cannot render")))
    with pytest.raises(BadInput):
        pl.write_lock_files(lock, newer)
    assert {p.name: p.read_bytes() for p in lock.parent.iterdir()} == before
    monkeypatch.undo()
    pl.write_lock_files(lock, newer)
    assert tomllib.loads((lock.parent / "pylock.tiny.toml").read_text())["tool"]["speclock"]["source-date-epoch"] == 7


@pytest.fixture()
def committed_copy(tmp_path):
    """The repository's stacks/ and the cpu-vllm lock and pylock, copied: what `lock --check` reads."""
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    (tmp_path / "locks").mkdir()
    for name in ("cpu-vllm.lock", "pylock.cpu-vllm.toml"):
        shutil.copyfile(ROOT / "locks" / name, tmp_path / "locks" / name)
    return tmp_path / "locks" / "cpu-vllm.lock", tmp_path / "locks" / "pylock.cpu-vllm.toml"


def _edit_pylock(path, edit):
    data = tomllib.loads(path.read_text())
    edit(data)
    path.write_text(tomli_w.dumps(data))


def _check(lock):
    return run_cli("lock", "--check", "--stack", "cpu-vllm", "--lock", str(lock))


def _torch(data):
    return next(p for p in data["packages"] if p["name"] == "torch")


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            lambda d: _torch(d)["wheels"][0]["hashes"].update(sha256="0" * 64),
            "package torch 2.13.0+cpu: wheel torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl: hashes are",
        ),
        (
            lambda d: _torch(d)["wheels"][0].update(url="https://download.pytorch.org/whl/cpu/other.whl"),
            "package torch 2.13.0+cpu: wheel torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl: url is "
            "'https://download.pytorch.org/whl/cpu/other.whl', the lock gives 'https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu",
        ),
        (lambda d: _torch(d).update(version="2.13.1+cpu"), "package torch 2.13.0+cpu is in the lock, missing from the pylock"),
        (lambda d: d["packages"].pop(0), "package agent-detector 2.0.0 is in the lock, missing from the pylock"),
        (lambda d: _torch(d).update(marker="python_version == '3.12'"), "package torch 2.13.0+cpu: marker is"),
        (lambda d: d["tool"]["speclock"]["base"].update(sha256="1" * 64), "tool.speclock.base.sha256: pylock has '111"),
    ],
)
def test_check_names_the_package_and_what_differs_in_the_pylock(committed_copy, edit, says):
    lock, pylock = committed_copy
    assert _check(lock)[0] == 0
    _edit_pylock(pylock, edit)
    code, _, err = _check(lock)
    assert code == 1 and says in err, err
    assert "pylock.cpu-vllm.toml" in err and "--no-resolve" in err


def test_check_fails_on_a_missing_or_unreadable_pylock(committed_copy):
    lock, pylock = committed_copy
    pylock.write_text("lock-version = ")
    code, _, err = _check(lock)
    assert code == 1 and "not a readable TOML file" in err, err
    pylock.unlink()
    code, out, err = run_cli("lock", "--check", "--stack", "cpu-vllm", "--lock", str(lock), "--json")
    assert code == 1 and json.loads(out)["differences"] == [
        f"{pylock} is missing; run `speclock lock --stack cpu-vllm --no-resolve` to write it from the lock"
    ]


def test_no_resolve_rewrites_a_missing_pylock_and_leaves_the_lock(committed_copy):
    lock, pylock = committed_copy
    before = lock.read_bytes()
    pylock.unlink()
    code, _, err = run_cli("lock", "--no-resolve", "--stack", "cpu-vllm", "--lock", str(lock))
    assert code == 0, err
    assert lock.read_bytes() == before and pylock.read_bytes() == (ROOT / "locks" / "pylock.cpu-vllm.toml").read_bytes()
    assert _check(lock)[0] == 0


# --- installing from a pylock, offline ------------------------------------------------------------


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """A two-target tiny lock, its wheelhouse filled by speclock's fetch (from the mirrors: no network), the committed
    form of its pylock and the offline form (each wheel's path in the wheelhouse)."""
    root = tmp_path_factory.mktemp("offline")
    doc = _two_target_lock(root)
    lock = root / "locks" / "tiny.lock"
    pylock = pl.write_lock_files(lock, doc)
    store = root / "wheelhouse"
    files = fetch(doc, store=store, progress=lambda m: None)
    paths = {p["sha256"]: files[p["filename"]] for p in doc["packages"]}
    local = root / "pylock.offline.toml"
    local.write_text(pl.render(pl.offline_pylock(tomllib.loads(pylock.read_text()), paths)))
    return {"root": root, "doc": doc, "pylock": pylock, "local": local, "paths": paths}


def _installed(python: Path) -> dict[str, str]:
    code = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    # -I: the venv's own packages, not what PYTHONPATH (src/, where an editable install may leave egg-info) adds
    return json.loads(subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, check=True).stdout)


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


OFFLINE_ENV = {
    "PIP_CONFIG_FILE": "/dev/null",
    "PIP_NO_INDEX": "1",
    "PIP_FIND_LINKS": "",
    "UV_NO_CONFIG": "1",
    "UV_OFFLINE": "1",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
}


def _run(cmd, tmp_path):
    env = {**os.environ, **OFFLINE_ENV, "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "PIP_CACHE_DIR": str(tmp_path / "pip-cache")}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=tmp_path)


def _image_packages(doc):
    return {p["name"]: p["version"] for p in doc["packages"]}


def test_pip_installs_the_lock_from_the_pylock_offline(offline, tmp_path):
    python = _venv(tmp_path / "venv")
    proc = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            "-r",
            offline["local"],
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _installed(python) == _image_packages(offline["doc"])  # tinydep 1.2: the 3.12 target's 1.3 is not this one


def test_uv_installs_the_lock_from_the_pylock_offline(offline, tmp_path):
    assert UV.is_file(), "uv is pinned in scripts/requirements-lint.txt"
    python = _venv(tmp_path / "venv")
    proc = _run([UV, "pip", "install", "--offline", "--no-index", "--python", python, "-r", offline["local"]], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _installed(python) == _image_packages(offline["doc"])


def test_urls_alone_need_the_network_and_a_changed_wheel_is_refused(offline, tmp_path):
    """Why the offline form exists: neither installer takes a pylock wheel from --find-links; and the hashes hold."""
    python = _venv(tmp_path / "venv")
    wheels = tmp_path / "flat"
    wheels.mkdir()
    for path in offline["paths"].values():
        shutil.copyfile(path, wheels / path.name)
    proc = _run(
        [UV, "pip", "install", "--offline", "--no-index", "--find-links", wheels, "--python", python, "-r", offline["pylock"]],
        tmp_path,
    )
    assert proc.returncode != 0 and "files.pythonhosted.org" in proc.stderr, proc.stderr
    changed = tmp_path / "changed" / "pylock.offline.toml"
    changed.parent.mkdir()
    data = tomllib.loads(offline["local"].read_text())
    dep = next(p for p in data["packages"] if p["name"] == "tinydep")
    other = make_wheel(tmp_path / "other", "tinydep", "1.2", files={"tinydep/x.py": "X = 1\n"})
    dep["wheels"][0]["path"] = str(other)
    changed.write_text(tomli_w.dumps(data))
    proc = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-deps", "-r", changed], tmp_path)
    assert proc.returncode != 0 and "hash" in proc.stderr.lower(), proc.stderr
    assert "tinydep" not in _installed(python)


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_the_committed_form_installs_from_its_urls_on_a_local_index(offline, tmp_path, installer):
    """The pylock as `lock` writes it (URLs, no paths), its URLs served by a local index (no other network)."""
    from fetch_server import WheelServer

    server = WheelServer()
    try:
        data = tomllib.loads(offline["pylock"].read_text())
        for package in data["packages"]:
            for wheel in package["wheels"]:
                local = offline["paths"].get(wheel["hashes"]["sha256"])
                path = f"/packages/00/{wheel['name'].replace('+', '%2B')}"
                if local:
                    server.serve(path, Path(local).read_bytes())
                wheel["url"] = server.base + path
        served = tmp_path / "pylock.served.toml"
        served.write_text(tomli_w.dumps(data))
        python = _venv(tmp_path / "venv")
        cmd = (
            [sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-deps", "-r", served]
            if installer == "pip"
            else [UV, "pip", "install", "--no-index", "--python", python, "-r", served]
        )
        # no network but the local index: the proxies lead nowhere, and only 127.0.0.1 bypasses them
        env = {
            **os.environ,
            **OFFLINE_ENV,
            "no_proxy": "127.0.0.1",
            "NO_PROXY": "127.0.0.1",
            "UV_CACHE_DIR": str(tmp_path / "uvc"),
            "PIP_CACHE_DIR": str(tmp_path / "pipc"),
        }
        env.pop("UV_OFFLINE")
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _installed(python) == _image_packages(offline["doc"])
        assert sum(server.hits.values()) == len(_image_packages(offline["doc"]))  # each of this target's wheels, once
    finally:
        server.close()


def test_a_pylock_written_by_lock_matches_its_lock_through_the_cli(tmp_path):
    """`lock --no-resolve` on a tiny stack's lock (targets and all) writes a pylock that `lock --check` accepts."""
    stack = load_stack(write_stack(tmp_path, host_targets=("3.12-x86_64",)))
    doc = _two_target_lock(tmp_path)
    doc = finish_lock({**doc, "stack_sha256": stack.source_sha256, "stack_data": stack.data})
    lock = tmp_path / "locks" / "tiny.lock"
    lock.parent.mkdir()
    lock.write_text(json.dumps(doc))
    code, _, err = run_cli("lock", "--no-resolve", "--stack", str(stack.path), "--lock", str(lock))
    assert code == 0, err
    code, out, err = run_cli("lock", "--check", "--stack", str(stack.path), "--lock", str(lock))
    assert (code, err) == (0, ""), err
    assert "pylock.tiny.toml are in sync" in out


def test_the_toml_writer_gives_the_committed_pylocks_byte_for_byte():
    """spec.toml_text writes what tomli_w wrote (the committed pylocks were written by it): `lock` needs no TOML
    package (the H100 host of 2026-12-07 had none, and `lock --from-lock` died there)."""
    from speclock.spec.toml_text import dumps_tables

    committed = sorted((ROOT / "locks").glob("pylock.*.toml"))
    assert len(committed) >= 6
    for path in committed:
        text = path.read_text()
        body = text[text.index("lock-version") :]
        assert dumps_tables(tomllib.loads(text)) == body, path
    odd = {"a": 'q"\\\t\x01é', "e": [], "i": [{"x": 1}, {"y": [1, 2]}], "t": {"k": True, "f": 1.5, "in": {"z": "w"}}}
    assert dumps_tables(odd) == tomli_w.dumps(odd)
    assert tomllib.loads(dumps_tables(odd)) == odd
