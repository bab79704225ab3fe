"""`speclock host-env`: a real venv, a real offline hash-checked pip install from a wheelhouse of tiny real wheels,
the refusals (wrong Python or machine: exit 2 naming the lock's targets; a missing wheel: exit 3 naming the
fetch command; a corrupted wheel: refused), host packages version-checked, and no DEST after a failure or Ctrl-C."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tinywheels import ROOT, entry, make_wheel, tiny_lock, tiny_wheels, write_stack

from speclock.build.hostenv.command import glibc_needed, version_matches
from speclock.spec.lock import MACHINE_PLATFORMS, read_lock, write_lock
from speclock.spec.resolve import KERNEL_TOOLCHAIN
from speclock.spec.stack import load_stack

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
CP = f"cp{sys.version_info.major}{sys.version_info.minor}"


def _pip_version() -> str:
    """pip as the host's Python has it: what the interpreter running host-env sees (its venv's, when it runs from one)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('pip'))"], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


# A GPU stack that builds speclock's kernels: the lock then needs the nvcc toolchain wheels (tiny ones here).
KERNELS_STACK = '[gpu]\ncuda = "13.0"\narchs = ["sm_90a"]\n[kernels]\nbuild = ["fp8-hidden-pack"]\nbuilder_packages = ["g++"]\n'


def toolchain_wheels(folder: Path) -> list[dict]:
    return [entry(make_wheel(folder, name, "13.0.0")) for name in KERNEL_TOOLCHAIN]


def host_row(name: str, lock_version: str, host_version: str) -> dict:
    return {
        "name": name,
        "lock_version": lock_version,
        "host_version": host_version,
        "location": "/usr/lib",
        "checked": "version",
    }


def host_env_record(**keys) -> dict:
    """A host-env.json as build_env writes it (every key of build.hostenv.record.HostEnvRecord), `keys` replaced."""
    record = {
        "schema": "speclock.host-env/v1",
        **dict.fromkeys(["stack", "stack_sha256", "lock_sha256", "lock_file", "target", "target_lock_sha256"], "x"),
        **dict.fromkeys(["python", "machine", "interpreter", "speclock_version", "created"], "x"),
        "hash_checked": [],
        "version_checked": [],
        "host_packages_requested": [],
        "pruned_from_host": [],
        "kernels": None,
        "target_folder": None,
        "draft_folder": None,
        "engine_env": {},
    }
    return record | keys


def make_repo(root: Path, *, image_python: str = PY, host_targets=(), extra_packages=(), engine_env=None, stack_extra=""):
    """A stack and its lock over tiny wheels, in a fetch-layout wheelhouse (<sha256>/<file>). Host targets get the
    image's entries (the tiny wheels are pure enough to stand in for any Python)."""
    wheels = tiny_wheels(root / "built")
    engine = make_wheel(root / "built", "tinyengine", "1.0", tag=f"{CP}-{CP}-manylinux_2_17_x86_64", requires=("tinydep>=1",))
    stack_file = write_stack(root, host_targets=host_targets, python=image_python, engine_env=engine_env)
    stack_file.write_text(stack_file.read_text() + stack_extra)
    stack = load_stack(stack_file)
    packages = sorted([entry(engine), entry(wheels["tinydep"]), entry(wheels["torch"]), *extra_packages], key=lambda e: e["name"])
    assets = [entry(wheels["tinyprompts"])]
    targets = {
        k: {
            "python": k.split("-")[0],
            "machine": k.split("-")[1],
            "platforms": list(MACHINE_PLATFORMS[k.split("-")[1]]),
            "packages": packages,
            "excluded": [],
            "assets": assets,
        }
        for k in host_targets
    }
    doc = tiny_lock(stack, python=image_python, packages=packages, excluded=[], assets=assets, targets=targets)
    (root / "locks").mkdir()
    write_lock(root / "locks" / "tiny.lock", doc)
    store = root / "wheelhouse"
    for p in packages + assets:
        if (root / "built" / p["filename"]).is_file():
            (store / p["sha256"]).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / "built" / p["filename"], store / p["sha256"] / p["filename"])
    return stack, store


def host_env(root: Path, *args: str, wait: bool = True):
    cmd = [
        sys.executable,
        "-m",
        "speclock",
        "host-env",
        "--stack",
        str(root / "stacks" / "tiny.toml"),
        "--lock",
        str(root / "locks" / "tiny.lock"),
        "--wheelhouse",
        str(root / "wheelhouse"),
        *args,
    ]
    # unbuffered: a test that waits for a progress line reads it as it is printed, not when the pipe's buffer fills
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), SPECLOCK_CACHE=str(root / "cache"), PYTHONUNBUFFERED="1")
    if not wait:
        # Ctrl-C at a terminal reaches a process whose SIGINT is at its default; a test run started in the background
        # (nohup, `cmd &` without job control, some CI runners) passes SIGINT on ignored, and Python keeps it so
        return subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def leftovers(root: Path, name: str = "env") -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name == name or p.name.startswith(name + "."))


def test_builds_a_venv_offline_laid_out_like_the_image(tmp_path):
    stack, _ = make_repo(tmp_path, engine_env={"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    dest = tmp_path / "env"
    proc = host_env(tmp_path, "--dest", str(dest), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["target"], out["python"], out["hash_checked"]) == ("image", PY, 3)
    assert leftovers(tmp_path) == ["env"]
    # the wheels are installed in the venv (this Python), hash-checked, nothing else
    run = subprocess.run(
        [str(dest / "bin" / "python"), "-c", "import tinyengine, tinydep, torch; print(tinyengine.TAG, torch.VERSION)"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert run.stdout.split() == [f"{CP}-{CP}-manylinux_2_17_x86_64", "9.9.9"], run.stderr
    home = dest / "speclock"
    record = json.loads((home / "host-env.json").read_text())
    assert record["stack"] == "tiny" and record["target"] == "image" and record["version_checked"] == []
    assert {r["name"] for r in record["hash_checked"]} == {"tinyengine", "tinydep", "torch"}
    lock = read_lock(home / "lock.json", stack=load_stack(home / "stacks" / "tiny.toml"))
    assert lock["lock_sha256"] == record["target_lock_sha256"] and lock["lock_from"] == record["lock_sha256"]
    assert (home / "locks" / "tiny.lock").read_bytes() == (home / "lock.json").read_bytes()
    assert (home / "prompts" / "prompts.jsonl").read_text().count("turns") == 2  # from the prompts wheel
    assert (home / "draft" / "config.json").is_file() and (home / "target" / "config.json").is_file()
    assert not (dest / ".wheels").exists() and not (dest / ".assets").exists()
    # bin/speclock runs this speclock copy with the image's environment and the stack's engine.env
    script = (dest / "bin" / "speclock").read_text()
    assert "export SPECLOCK_IN_IMAGE=1" in script and "export VLLM_USE_FLASHINFER_SAMPLER=0" in script
    assert str(tmp_path) not in script  # found relative to itself
    check = subprocess.run(
        [str(dest / "bin" / "speclock"), "stack", "check", "tiny"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "/nonexistent"},
    )
    assert check.returncode == 0 and "stack tiny" in check.stdout and str(home / "stacks") in check.stdout, check.stderr
    assert ".tmp-" not in (dest / "bin" / "activate").read_text()
    # the same again: nothing to do; another target or host packages: DEST exists (exit 2) unless --force
    again = host_env(tmp_path, "--dest", str(dest))
    assert again.returncode == 0 and "already the host environment" in again.stdout
    # selfcheck --env refuses another stack's name before running anything
    sc = subprocess.run(
        [sys.executable, "-m", "speclock", "selfcheck", "--env", str(dest), "--stack", "cpu-vllm"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    assert sc.returncode == 2 and "stack tiny's" in sc.stderr


def test_wrong_python_or_machine_is_refused_naming_the_targets(tmp_path):
    other = "3.10" if PY != "3.10" else "3.12"
    make_repo(tmp_path, image_python=other, host_targets=(f"{other}-x86_64", f"{PY}-aarch64"))
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"))
    assert proc.returncode == 2, proc.stderr
    assert f"this host runs Python {PY} on x86_64" in proc.stderr
    assert f"image ({other}-x86_64), {other}-x86_64, {PY}-aarch64" in proc.stderr
    assert f"add '{PY}-x86_64' to python.host_targets" in proc.stderr and "speclock lock --stack tiny" in proc.stderr
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"), "--target", f"{PY}-aarch64")
    assert proc.returncode == 2 and f"is for Python {PY} on aarch64" in proc.stderr
    assert leftovers(tmp_path) == []


def test_missing_wheel_exits_3_naming_the_fetch_command(tmp_path):
    stack, store = make_repo(tmp_path, host_targets=(f"{PY}-x86_64",))
    victim = next(store.glob("*/torch-*.whl"))
    shutil.rmtree(victim.parent)
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"))
    assert proc.returncode == 3, proc.stderr
    assert victim.name in proc.stderr and f"speclock fetch --stack tiny --target {PY}-x86_64" in proc.stderr
    assert leftovers(tmp_path) == []


def test_corrupted_wheel_is_refused_and_leaves_nothing(tmp_path):
    stack, store = make_repo(tmp_path)
    victim = next(store.glob("*/tinydep-*.whl"))
    victim.write_bytes(victim.read_bytes()[:-10] + b"0123456789")
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"))
    assert proc.returncode == 1, proc.stderr
    assert "tinydep-1.2-py3-none-any.whl has sha256" in proc.stderr and "refused" in proc.stderr
    assert leftovers(tmp_path) == []


def test_a_failed_install_leaves_no_dest(tmp_path):
    """A wheel whose hash is the lock's but that pip cannot install: the build fails inside the temp folder."""
    broken = tmp_path / "built2" / "tinybroken-1.0-py3-none-any.whl"
    broken.parent.mkdir()
    broken.write_bytes(b"not a zip file at all")
    stack, store = make_repo(tmp_path, extra_packages=[entry(broken)])
    (store / entry(broken)["sha256"]).mkdir()
    shutil.copyfile(broken, store / entry(broken)["sha256"] / broken.name)
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"))
    assert proc.returncode == 3, proc.stderr
    assert "pip install -r requirements.txt failed" in proc.stderr
    assert leftovers(tmp_path) == []


def test_ctrl_c_removes_the_temp_folder_and_a_killed_runs_leftover_is_cleaned(tmp_path):
    make_repo(tmp_path)
    dead = tmp_path / "env.tmp-999999"  # a host-env that was SIGKILLed (no such process)
    dead.mkdir()
    (dead / "junk").write_text("x")
    # Ctrl-C lands while pip installs: host-env prints "installing N wheels" just before it starts pip, whose own
    # start-up alone takes longer than reading that line does. No skip: a build that finished first fails the test.
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"), wait=False)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "installing" in line and "wheels offline" in line:
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=60)
    assert any("wheels offline" in line for line in seen), "".join(seen) + err
    assert proc.returncode == 130, "".join(seen) + err
    assert leftovers(tmp_path) == []  # the killed run's leftover went too


def test_host_packages_are_version_checked_not_hash_checked(tmp_path):
    pip_version = _pip_version()
    if not pip_version:
        pytest.skip("this Python's base installation has no pip to stand in for a host package")
    fake = {
        "name": "pip",
        "version": pip_version,
        "filename": f"pip-{pip_version}-py3-none-any.whl",
        "url": f"https://files.pythonhosted.org/packages/xx/pip-{pip_version}-py3-none-any.whl",
        "sha256": "0" * 64,
    }
    make_repo(tmp_path, extra_packages=[fake])
    dest = tmp_path / "env"
    # without --use-host-packages the (absent) pip wheel is needed from the wheelhouse
    proc = host_env(tmp_path, "--dest", str(dest))
    assert proc.returncode == 3 and fake["filename"] in proc.stderr
    proc = host_env(tmp_path, "--dest", str(dest), "--use-host-packages", "pip", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((dest / "speclock" / "host-env.json").read_text())
    assert [(r["name"], r["host_version"], r["checked"]) for r in record["version_checked"]] == [("pip", pip_version, "version")]
    assert "pip" not in {r["name"] for r in record["hash_checked"]}
    assert "include-system-site-packages = true" in (dest / "pyvenv.cfg").read_text()
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env2"), "--use-host-packages", "nosuch*")
    assert proc.returncode == 2 and "matches no package" in proc.stderr


def test_host_package_at_another_version_is_refused(tmp_path):
    fake = {
        "name": "pip",
        "version": "0.0.1",
        "filename": "pip-0.0.1-py3-none-any.whl",
        "url": "https://files.pythonhosted.org/packages/xx/pip-0.0.1-py3-none-any.whl",
        "sha256": "0" * 64,
    }
    make_repo(tmp_path, extra_packages=[fake])
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"), "--use-host-packages", "pip")
    assert proc.returncode == 3 and "pip" in proc.stderr and "(lock: 0.0.1)" in proc.stderr
    assert leftovers(tmp_path) == []


def test_version_rule_for_local_labels():
    assert version_matches("2.11.0", "2.11.0", "13.0")
    assert version_matches("2.11.0+cu130", "2.11.0", "13.0")  # PyPI's 2.11.0 is the cu130 build
    assert not version_matches("2.11.0+cu126", "2.11.0", "13.0")
    assert not version_matches("2.11.0+cpu", "2.11.0", "13.0")
    assert not version_matches("2.11.0+cu130", "2.11.0", "")  # a CPU stack: no CUDA label matches
    assert version_matches("2.13.0+cpu", "2.13.0+cpu", "")
    assert not version_matches("2.13.0", "2.13.0+cpu", "")
    assert not version_matches("2.11.1+cu130", "2.11.0", "13.0")


def test_glibc_needed_from_wheel_tags():
    assert glibc_needed("a-1-cp312-cp312-manylinux_2_28_x86_64.whl") == (2, 28)
    assert glibc_needed("a-1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl") == (2, 17)
    assert glibc_needed("a-1-py3-none-any.whl") == (0, 0)


def test_doctor_accepts_the_hosts_cuda_build_only_for_packages_host_env_took_from_the_host(tmp_path, monkeypatch):
    """lock-versions in a host env: torch 2.11.0+cu130 from the host matches the lock's 2.11.0 on a CUDA 13.0 stack;
    the same local label on a hash-checked package, or +cpu on a host package, is still a difference."""
    from types import SimpleNamespace

    from speclock.core.layout import ImageLayout
    from speclock.spec.stack import load_stack
    from speclock.verify.doctor import versions

    home = tmp_path / "speclock"
    home.mkdir()
    # doctor reads both through their models (spec.lock_types.LockFile, build.hostenv.record.HostEnvRecord)
    lock = json.loads((ROOT / "locks" / "vllm-0.26.0-torch2.11-cu130.lock").read_text())
    lock["packages"] = [
        {"name": n, "version": v, "filename": f"{n}-{v}-py3-none-any.whl", "url": f"https://x/{n}.whl", "sha256": "0" * 64}
        for n, v in (("torch", "2.11.0"), ("numpy", "2.3.5"))
    ]
    lock["excluded"] = []
    (home / "lock.json").write_text(json.dumps(lock))
    (home / "host-env.json").write_text(
        json.dumps(host_env_record(version_checked=[host_row("torch", "2.11.0", "2.11.0+cu130")]))
    )
    monkeypatch.setattr(versions, "IMAGE", ImageLayout(home))
    monkeypatch.setattr(versions, "in_image", lambda: True)
    stack = load_stack("vllm-0.26.0-torch2.11-cu130")

    def run(dists):
        ctx = SimpleNamespace(
            lock_path=home / "lock.json", stack=stack, python_note="", engine_answers={"dists": {"ok": True, "result": dists}}
        )
        return versions.check_lock(ctx)

    ok = run({"torch": "2.11.0+cu130", "numpy": "2.3.5"})
    assert ok.status == "pass" and "1 from the host" in ok.reason
    assert run({"torch": "2.11.0+cpu", "numpy": "2.3.5"}).status == "fail"
    assert run({"torch": "2.11.0+cu130", "numpy": "2.3.5+cu130"}).status == "fail"  # numpy was hash-checked


def test_kernels_folder_is_copied_in_and_a_folder_without_a_library_is_refused(tmp_path):
    """--kernels takes the image's built kernel library; a folder that is not one is bad input before anything is made."""
    make_repo(tmp_path, stack_extra=KERNELS_STACK, extra_packages=toolchain_wheels(tmp_path / "built"))
    empty = tmp_path / "not-kernels"
    empty.mkdir()
    bad = host_env(tmp_path, "--dest", str(tmp_path / "env"), "--kernels", str(empty))
    assert bad.returncode == 2 and "kernels.json and libspeclock_fp8.so" in bad.stderr
    assert leftovers(tmp_path) == []
    lib = tmp_path / "kernels"
    lib.mkdir()
    (lib / "kernels.json").write_text('{"archs": ["sm_90a"]}')
    (lib / "libspeclock_fp8.so").write_bytes(b"\x7fELF not really")
    ok = host_env(tmp_path, "--dest", str(tmp_path / "env"), "--kernels", str(lib))
    assert ok.returncode == 0, ok.stderr
    home = tmp_path / "env" / "speclock"
    assert (home / "kernels" / "libspeclock_fp8.so").read_bytes() == b"\x7fELF not really"
    assert json.loads((home / "host-env.json").read_text())["kernels"]["source"] == "copied"


def test_kernels_for_a_stack_that_builds_none_is_bad_input(tmp_path):
    make_repo(tmp_path)
    lib = tmp_path / "kernels"
    lib.mkdir()
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"), "--kernels", str(lib))
    assert proc.returncode == 2 and "kernels.build is empty" in proc.stderr, proc.stderr
    assert leftovers(tmp_path) == []


def test_a_stack_with_kernels_and_no_cpp_compiler_exits_3_naming_what_to_install(tmp_path):
    """host-env builds the kernel library as the image's kernels stage does; nvcc needs the host's gcc/g++."""
    make_repo(tmp_path, stack_extra=KERNELS_STACK, extra_packages=toolchain_wheels(tmp_path / "built"))
    nocc = tmp_path / "bin"  # a PATH with sh and coreutils but no compiler
    nocc.mkdir()
    for tool in ("sh", "ln", "cat"):
        (nocc / tool).symlink_to(shutil.which(tool))
    cmd = [
        sys.executable,
        "-m",
        "speclock",
        "host-env",
        "--stack",
        str(tmp_path / "stacks" / "tiny.toml"),
        "--lock",
        str(tmp_path / "locks" / "tiny.lock"),
        "--wheelhouse",
        str(tmp_path / "wheelhouse"),
        "--dest",
        str(tmp_path / "new" / "env"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PATH=str(nocc), PYTHONPATH=str(ROOT / "src")))
    assert proc.returncode == 3, proc.stderr
    assert "no gcc" in proc.stderr and "install g++" in proc.stderr and "--kernels DIR" in proc.stderr
    assert not (tmp_path / "new").exists()


def test_dest_that_is_a_file_is_bad_input_and_nothing_is_made(tmp_path):
    make_repo(tmp_path)
    (tmp_path / "env").write_text("a file")
    for extra in ((), ("--force",)):
        proc = host_env(tmp_path, "--dest", str(tmp_path / "env"), *extra)
        assert proc.returncode == 2 and "is a file, not a folder" in proc.stderr, proc.stderr
        assert (tmp_path / "env").read_text() == "a file" and leftovers(tmp_path) == ["env"]
    # under a file: a part of the path is a file (exit 2, naming it)
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env" / "sub" / "dest"))
    assert proc.returncode == 2 and f"{tmp_path / 'env'} is a file" in proc.stderr, proc.stderr
    assert leftovers(tmp_path) == ["env"]


def test_a_failed_build_removes_the_parent_folders_it_made(tmp_path):
    stack, store = make_repo(tmp_path)
    shutil.rmtree(next(store.glob("*/torch-*.whl")).parent)
    (tmp_path / "have").mkdir()
    proc = host_env(tmp_path, "--dest", str(tmp_path / "have" / "a" / "b" / "env"))
    assert proc.returncode == 3 and "not in the wheelhouse" in proc.stderr, proc.stderr
    assert list((tmp_path / "have").iterdir()) == []  # a/ and a/b/ were made by host-env: gone; have/ was there: kept


def _read_only_mount(folder: Path) -> bool:
    folder.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True).returncode == 0


def test_dest_on_a_read_only_file_system_exits_3_naming_it_and_leaves_nothing(tmp_path):
    make_repo(tmp_path)
    ro = tmp_path / "ro"
    if not _read_only_mount(ro):
        pytest.skip("cannot mount a read-only tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        for dest in (ro / "env", ro / "new" / "env"):
            proc = host_env(tmp_path, "--dest", str(dest))
            assert proc.returncode == 3, proc.stderr
            assert "read-only" in proc.stderr and str(ro) in proc.stderr and "--dest" in proc.stderr
            assert list(ro.iterdir()) == []
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_dest_under_a_folder_no_one_may_write_exits_3_and_leaves_nothing(tmp_path):
    """A read-only folder (mode 555) as a user who is not root (root may write anywhere)."""
    top = Path(tempfile.mkdtemp(prefix="speclock-ro-"))  # readable by that user, unlike pytest's tmp_path
    try:
        top.chmod(0o755)
        make_repo(top)
        (top / "cache").mkdir(mode=0o777)
        (top / "cache").chmod(0o777)
        ro = top / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        cmd = [
            sys.executable,
            "-m",
            "speclock",
            "host-env",
            "--stack",
            str(top / "stacks" / "tiny.toml"),
            "--lock",
            str(top / "locks" / "tiny.lock"),
            "--wheelhouse",
            str(top / "wheelhouse"),
            "--dest",
            str(ro / "new" / "env"),
        ]
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                pytest.skip("root, and no setpriv to run as another user")
            cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *cmd]
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, PYTHONPATH=str(ROOT / "src"), SPECLOCK_CACHE=str(top / "cache"), HOME=str(top)),
        )
        assert proc.returncode == 3, proc.stderr
        assert "permission denied" in proc.stderr and str(ro / "new") in proc.stderr and "--dest" in proc.stderr
        assert list(ro.iterdir()) == []
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_doctor_names_kernels_build_and_the_option_when_a_host_env_has_no_kernel_library(tmp_path, monkeypatch):
    """A host environment of a stack with kernels.build and no kernels/ folder: doctor's kernels check fails naming
    the stack key and how host-env provides the library (build it, or --kernels)."""
    from types import SimpleNamespace

    from speclock.core.layout import ImageLayout
    from speclock.verify.doctor import kernels

    stack_file = tmp_path / "repo" / "stacks" / "tiny.toml"
    make_repo(tmp_path / "repo", stack_extra=KERNELS_STACK, extra_packages=toolchain_wheels(tmp_path / "repo" / "built"))
    home = tmp_path / "env" / "speclock"
    home.mkdir(parents=True)
    (home / "host-env.json").write_text(json.dumps({"schema": "speclock.host-env/v1"}))
    monkeypatch.delenv("SPECLOCK_KERNELS_DIR", raising=False)
    monkeypatch.setattr(kernels, "IMAGE", ImageLayout(home))
    monkeypatch.setattr(kernels, "in_image", lambda: True)
    check = kernels.check_kernels(SimpleNamespace(stack=load_stack(stack_file), site_packages=None))
    assert check.status == "fail", check
    assert "kernels.build of stacks/tiny.toml" in check.reason and "--kernels DIR" in check.reason
    assert str(home / "kernels") in check.reason


def test_host_packages_of_the_running_venv_are_seen(tmp_path):
    """The lent GPU machine's torch lives in a venv: host-env run from a venv sees that venv's packages as the host's."""
    import importlib.metadata as md

    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run from a venv here")
    base_has = (
        subprocess.run(
            [sys._base_executable, "-c", "import importlib.metadata as m; m.version('invoke')"], capture_output=True
        ).returncode
        == 0
    )
    if base_has:
        pytest.skip("the base Python has invoke too: nothing venv-only to stand in for the host's torch")
    version = md.version("invoke")
    fake = {
        "name": "invoke",
        "version": version,
        "filename": f"invoke-{version}-py3-none-any.whl",
        "url": f"https://files.pythonhosted.org/packages/xx/invoke-{version}-py3-none-any.whl",
        "sha256": "0" * 64,
    }
    make_repo(tmp_path, extra_packages=[fake])
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"), "--use-host-packages", "invoke", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "env" / "speclock" / "host-env.json").read_text())
    assert [(r["name"], r["host_version"]) for r in record["version_checked"]] == [("invoke", version)]
    run = subprocess.run(
        [str(tmp_path / "env" / "bin" / "python"), "-c", "import invoke, tinyengine; print('ok')"], capture_output=True, text=True
    )
    assert run.stdout.strip() == "ok", run.stderr


def test_a_target_for_another_python_points_at_the_target_the_lock_has_for_this_host(tmp_path):
    """Asking for a host target on the wrong Python, when the lock already has this host's (the image's), names it."""
    other = "3.10" if PY != "3.10" else "3.12"
    make_repo(tmp_path, host_targets=(f"{other}-x86_64",))
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"), "--target", f"{other}-x86_64")
    assert proc.returncode == 2 and "use --target image (or auto)" in proc.stderr, proc.stderr
    assert "python.host_targets" not in proc.stderr


def test_the_host_run_environment_is_the_images_env():
    """RUN_ENV is what containers/Containerfile's runtime ENV sets besides paths; a host run must not drift from it."""
    import re as _re

    from speclock.build.containerfile import CONTAINERFILE
    from speclock.build.hostenv.command import RUN_ENV

    text = CONTAINERFILE.read_text()
    block = text[text.index("ENV PATH=") : text.index("USER 10001")]
    image_env = dict(_re.findall(r"([A-Z_]+)=(\S+?)\s*\\?$", block, _re.M))
    paths = {"PATH", "PYTHONPATH", "SPECLOCK_HOME", "HOME"}  # set per environment by bin/speclock
    assert {k: v for k, v in image_env.items() if k not in paths} == RUN_ENV


def test_doctor_reports_the_version_python_imports_when_the_host_has_an_older_copy(tmp_path):
    """Found on the H200: a host environment sees the host's site-packages after its own, and the probe's package
    list took the last copy on sys.path (the host's), so lock-versions failed on 38 packages that were right."""

    def dist(site: Path, version: str):
        info = site / f"shadowed-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: Shadowed\nVersion: {version}\n")

    dist(tmp_path / "venv-site", "2.0")  # the venv's locked copy, first on sys.path
    dist(tmp_path / "host-site", "1.0")  # the host's older copy, after it
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path / "venv-site"), str(tmp_path / "host-site")]),
    }
    proc = subprocess.run([sys.executable, "-m", "speclock.engines.probe", "dists"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    found = answer.get("result", answer)
    assert found["Shadowed"] == "2.0"
    imported = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('shadowed'))"],
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    assert imported == "2.0"  # the same copy importlib.metadata.version() (and import) would use


def test_the_image_and_host_env_run_the_same_kernel_build_and_prune_hook():
    """One plan (build.envplan): the kernels stage's command is kernel_build_args with the image's paths, and the prune
    hook host-env runs is the script the build context stages as wheels/prune.sh."""
    import re as _re

    from speclock.build.containerfile import KERNELS_CONTAINERFILE
    from speclock.build.envplan import kernel_build_args, plan_environment
    from speclock.build.prune import prune_script

    stage = " ".join(KERNELS_CONTAINERFILE.read_text().replace("\\\n", " ").split())
    args = kernel_build_args('"/ktools/stacks/$STACK_NAME.toml"', "/tmp/cuda", "/opt/speclock/kernels")
    assert "python3 " + " ".join(args) + " " in stage
    assert _re.search(r"pip install [^&]*--target /tmp/cuda [^&]*-r /wheels/kernels\.txt", stage)
    stack = load_stack("vllm-0.26.0-torch2.11-cu130")
    lock = read_lock(ROOT / "locks" / f"{stack.name}.lock", stack=stack)
    plan = plan_environment(stack, lock)
    assert plan.prune_script == prune_script(stack, lock) and "prune_glob '*/tests'" in plan.prune_script
    assert [p["name"] for p in plan.lists()["kernels.txt"]] == list(KERNEL_TOOLCHAIN)
