"""flake.nix: the pins come from the lock files, the checks run offline, the Nix image mirrors the
Containerfile. Real nix (Debian's nix-bin 2.8) on a git copy of the checkout (flakes see only
git-tracked files).

nixpkgs cannot be fetched here. Outputs that need it (packages, devShells) are evaluated with
`--override-input nixpkgs path:nix/nixpkgs-double`, a TEST DOUBLE that only lets them evaluate
to derivations of the right shape; nothing nixpkgs-dependent is built by these tests.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from speclock.build import nixcheck
from speclock.build.labels import labels_for
from speclock.build.wheelhouse import requirements_text
from speclock.core.layout import ImageLayout
from speclock.spec.lock import read_lock
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]
SYS = nixcheck.SYSTEM

pytestmark = pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (apt-get install -y nix-bin)")


def nix(flake: Path, *args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    return nixcheck.run_nix(["nix", *args], cwd=flake, check=check, timeout=timeout)


def eval_json(flake: Path, attr: str, *extra: str):
    return nixcheck.nix_eval_json(flake, attr, *extra)


def eval_error(flake: Path, attr: str, *extra: str) -> str:
    proc = nix(flake, "eval", "--offline", "--json", f".#{attr}", *extra, check=False)
    assert proc.returncode != 0, f"evaluating {attr} should have failed, got {proc.stdout[:300]}"
    return proc.stderr


@pytest.fixture(scope="module")
def flake(tmp_path_factory) -> Path:
    return nixcheck.flake_copy(tmp_path_factory.mktemp("flake") / "repo", ROOT)


@pytest.fixture()
def scratch(tmp_path) -> Path:
    """A copy a test may break."""
    return nixcheck.flake_copy(tmp_path / "repo", ROOT)


def locks() -> dict[str, dict]:
    return {p.stem: read_lock(p) for p in sorted((ROOT / "locks").glob("*.lock"))}


# ---- syntax ------------------------------------------------------------------------------------


def test_every_nix_file_parses(flake):
    parsed = nixcheck.parse_all(flake)
    assert "flake.nix" in parsed and "nix/pins.nix" in parsed and f"{nixcheck.DOUBLE}/default.nix" in parsed


def test_a_syntax_error_is_reported_by_the_parse_check(tmp_path):
    bad = tmp_path / "bad.nix"
    bad.write_text("{ a = 1; b = ; }\n")
    proc = subprocess.run(["nix-instantiate", "--parse", str(bad)], env=nixcheck.nix_env(), capture_output=True, text=True)
    assert proc.returncode != 0 and "syntax error" in proc.stderr


# ---- lib: pins equal the lock files ----------------------------------------------------------


def test_stacks_are_discovered_from_the_lock_files(flake):
    assert eval_json(flake, "lib.stackNames") == sorted(locks())


def test_lib_pins_equal_every_lock_file(flake):
    counts = nixcheck.compare_pins(flake)
    assert counts and all(n > 0 for n in counts.values())


def test_engine_wheel_url_and_hash_come_from_the_lock(flake):
    for name, lock in locks().items():
        engine = lock["stack_data"]["engine"]
        wheel = eval_json(flake, f'lib.stacks."{name}".wheelsByName.{engine["package"]}')
        locked = next(p for p in lock["packages"] if p["name"] == engine["package"])
        assert (wheel["version"], wheel["url"], wheel["sha256"]) == (engine["version"], locked["url"], locked["sha256"])


# ---- the Nix image agrees with the Containerfile, core/layout.py and labels_for ---------------------


def _containerfile_runtime() -> dict:
    """The runtime stage, parsed in Python independently of nix/containerfile.nix."""
    text = (ROOT / "containers" / "Containerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"FROM \S+ AS runtime", line))
    stage = lines[start + 1 :]
    env = {}
    for line in stage:
        if line.startswith("ENV "):
            env.update(kv.split("=", 1) for kv in line[4:].split())

    def one(keyword: str) -> str:
        """The argument of the stage's (first) `keyword` instruction."""
        return next(line[len(keyword) + 1 :] for line in stage if line.startswith(keyword + " "))

    return {
        "env": env,
        "user": one("USER"),
        "workdir": one("WORKDIR"),
        "entrypoint": json.loads(one("ENTRYPOINT")),
        "cmd": json.loads(one("CMD")),
        "copies": [line.split()[-1] for line in stage if line.startswith("COPY ")],
    }


def test_containerfile_as_the_flake_reads_it(flake):
    want = _containerfile_runtime()
    got = eval_json(flake, "lib.containerfile")
    assert got["env"] == want["env"]
    assert (got["user"], got["workdir"], got["entrypoint"], got["cmd"]) == (
        want["user"],
        want["workdir"],
        want["entrypoint"],
        want["cmd"],
    )
    assert got["copyDestinations"] == want["copies"]
    assert got["user"] == "10001:10001" and got["entrypoint"][1:] == ["-m", "speclock"]


def test_image_layout_equals_speclock_layout(flake):
    for name in locks():
        layout = eval_json(flake, f'lib.images."{name}".layout')
        image = ImageLayout(Path(layout["root"]))
        assert layout["venv"] == str(image.venv)
        for key in ("lock_file", "target_dir", "draft_dir", "prompts_file", "patches_dir", "baselines_dir", "build_info"):
            assert layout[key] == str(getattr(image, key)), key
        assert layout["stack_file"] == f"{image.root}/stacks/{name}.toml"


def test_image_labels_have_the_keys_and_pins_of_labels_for(flake):
    for name, lock in locks().items():
        got = eval_json(flake, f'lib.images."{name}".labels')
        want = labels_for(load_stack(ROOT / "stacks" / f"{name}.toml"), lock, "TAG", "INPUTS", "REV")
        assert set(got) == set(want)
        for key in (
            "org.opencontainers.image.title",
            "org.opencontainers.image.description",
            "org.opencontainers.image.created",
            "io.speclock.stack",
            "io.speclock.lock-sha256",
            "io.speclock.engine",
            "io.speclock.engine-package",
            "io.speclock.engine-version",
            "io.speclock.torch-version",
            "io.speclock.cuda",
            "io.speclock.archs",
            "io.speclock.patches",
        ):
            assert got[key] == want[key], key
        assert got["io.speclock.base"] == "nixpkgs"  # honest: not the Debian rootfs digest


# ---- checks: offline, no nixpkgs --------------------------------------------------------------


def test_checks_build_offline_without_nixpkgs(flake):
    # nixpkgs is replaced by a flake that throws when imported, and nix runs --offline.
    names = nixcheck.build_checks(flake)
    assert {"stacks-have-locks", "containerfile"} | {f"stack-{n}" for n in locks()} <= set(names)


def test_the_poisoned_nixpkgs_does_poison(flake):
    # Guards the test above: outputs that use nixpkgs do fail with the poisoned input.
    err = eval_error(
        flake, f"packages.{SYS}", "--apply", "ps: builtins.mapAttrs (n: p: p.drvPath) ps", *nixcheck.poisoned_nixpkgs(flake)
    )
    assert "nixpkgs was used where it must not be" in err


def test_lib_needs_no_nixpkgs(flake):
    poison = nixcheck.poisoned_nixpkgs(flake)
    for name in locks():
        assert eval_json(flake, f'lib.images."{name}".labels', *poison)
        assert eval_json(flake, f'lib.stacks."{name}".wheels', *poison)


def test_flake_check_offline_with_the_nixpkgs_double(flake):
    nixcheck.flake_check_with_double(flake)


# ---- shape of the nixpkgs-dependent outputs (TEST DOUBLE for nixpkgs) -------------------------


def test_packages_and_shells_exist_per_stack(flake):
    d = nixcheck.double_args(flake)
    packages = eval_json(flake, f"packages.{SYS}", "--apply", "builtins.attrNames", *d)
    shells = eval_json(flake, f"devShells.{SYS}", "--apply", "builtins.attrNames", *d)
    for name in locks():
        assert {f"{name}-image", f"{name}-venv", f"{name}-wheelhouse"} <= set(packages)
        assert name in shells
    assert "default" in shells


def test_image_package_gets_the_containerfile_config(flake):
    d = nixcheck.double_args(flake)
    want = _containerfile_runtime()
    for name in locks():
        args = eval_json(flake, f'packages.{SYS}."{name}-image".speclockArgs', *d)
        cfg = args["config"]
        assert dict(e.split("=", 1) for e in cfg["Env"]) == want["env"]
        assert (cfg["User"], cfg["WorkingDir"], cfg["Entrypoint"], cfg["Cmd"]) == (
            want["user"],
            want["workdir"],
            want["entrypoint"],
            want["cmd"],
        )
        assert cfg["Labels"] == eval_json(flake, f'lib.images."{name}".labels')


def test_venv_installs_exactly_the_locked_wheels_with_hashes(flake):
    d = nixcheck.double_args(flake)
    for name, lock in locks().items():
        wh = eval_json(flake, f'packages.{SYS}."{name}-wheelhouse".speclockArgs', *d)
        assert wh["requirements"] == requirements_text(lock["packages"])
        assert wh["assets"] == requirements_text(lock["assets"])
        assert wh["script"].count("ln -s /nix/store/") == len(lock["packages"]) + len(lock["assets"])
        venv = eval_json(flake, f'packages.{SYS}."{name}-venv".speclockArgs.buildPhase', *d)
        assert "--no-index --no-deps --require-hashes" in venv and "speclock patches apply" in venv


# ---- flake.lock -------------------------------------------------------------------------------


def test_flake_lock_pins_a_blackwell_capable_nixpkgs():
    lock = json.loads((ROOT / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    assert lock["nodes"]["root"]["inputs"] == {"nixpkgs": "nixpkgs"}
    node = lock["nodes"]["nixpkgs"]
    locked, original = node["locked"], node["original"]
    assert (locked["type"], locked["owner"], locked["repo"]) == ("github", "NixOS", "nixpkgs")
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"])
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"])
    assert isinstance(locked["lastModified"], int)
    # NixOS releases from 25.05 on carry cudaPackages_12_8 (sm_100/sm_120); 25.11 adds 12.9 (sm_103).
    year, month = map(int, re.fullmatch(r"nixos-(\d\d)\.(\d\d)", original["ref"]).groups())
    assert (year, month) >= (25, 5)
    flake_nix = (ROOT / "flake.nix").read_text()
    assert f'inputs.nixpkgs.url = "github:NixOS/nixpkgs/{original["ref"]}"' in flake_nix


def test_flake_metadata_reads_the_lock(flake):
    meta = json.loads(nix(flake, "flake", "metadata", "--offline", "--json").stdout)
    locked = json.loads((ROOT / "flake.lock").read_text())["nodes"]["nixpkgs"]["locked"]
    assert meta["locks"]["nodes"]["nixpkgs"]["locked"]["rev"] == locked["rev"]


# ---- bad input: clear evaluation errors naming the stack and key ------------------------------


def _default_stack() -> str:
    return "cpu-vllm" if "cpu-vllm" in locks() else sorted(locks())[0]


def test_a_truncated_lock_is_named(scratch):
    name = _default_stack()
    path = scratch / "locks" / f"{name}.lock"
    path.write_text(path.read_text()[: len(path.read_text()) // 2])
    nixcheck.git_add(scratch)
    err = eval_error(scratch, f'lib.stacks."{name}".engine')
    assert f"stack {name}: locks/{name}.lock is truncated" in err


def test_a_json_syntax_error_is_named_with_its_line(scratch):
    name = _default_stack()
    path = scratch / "locks" / f"{name}.lock"
    text = path.read_text()
    at = text.index('"packages"')
    path.write_text(text[:at] + '"stray" ' + text[at:])
    nixcheck.git_add(scratch)
    line = text[:at].count("\n") + 1
    err = eval_error(scratch, f'lib.stacks."{name}".engine')
    assert f'stack {name}: locks/{name}.lock is not valid JSON at line {line}: unexpected "packages"' in err


def test_a_lock_with_conflict_markers_is_named(scratch):
    name = _default_stack()
    path = scratch / "locks" / f"{name}.lock"
    path.write_text("<<<<<<< HEAD\n" + path.read_text() + ">>>>>>> other\n")
    nixcheck.git_add(scratch)
    assert f"stack {name}: locks/{name}.lock has merge conflict markers" in eval_error(scratch, f'lib.stacks."{name}".engine')


def test_a_missing_key_is_named(scratch):
    name = _default_stack()
    path = scratch / "locks" / f"{name}.lock"
    doc = json.loads(path.read_text())
    del doc["stack_data"]["torch"]
    path.write_text(json.dumps(doc, indent=1))
    nixcheck.git_add(scratch)
    assert f"stack {name}: locks/{name}.lock: key 'stack_data.torch' is missing" in eval_error(
        scratch, f'lib.stacks."{name}".torch'
    )


def test_a_malformed_wheel_hash_is_named(scratch):
    name = _default_stack()
    path = scratch / "locks" / f"{name}.lock"
    doc = json.loads(path.read_text())
    doc["packages"][3]["sha256"] = "abc"
    path.write_text(json.dumps(doc, indent=1))
    nixcheck.git_add(scratch)
    err = eval_error(scratch, f'lib.stacks."{name}".wheels')
    assert f"stack {name}: locks/{name}.lock: key 'packages[3].sha256' ({doc['packages'][3]['name']})" in err


def test_a_stack_without_a_lock_fails_the_check(scratch):
    shutil.copy(scratch / "stacks" / f"{_default_stack()}.toml", scratch / "stacks" / "unlocked-extra.toml")
    nixcheck.git_add(scratch)
    proc = nix(scratch, "build", "--offline", "--no-link", f".#checks.{SYS}.stacks-have-locks", check=False)
    assert proc.returncode != 0
    assert "stack unlocked-extra: stacks/unlocked-extra.toml has no locks/unlocked-extra.lock" in proc.stderr
    assert "unlocked-extra: stacks/unlocked-extra.toml" in eval_error(scratch, "lib.stacks.unlocked-extra")


def test_a_stale_lock_names_the_key(scratch):
    name = _default_stack()
    path = scratch / "stacks" / f"{name}.toml"
    text = path.read_text()
    version = locks()[name]["stack_data"]["engine"]["version"]
    path.write_text(text.replace(f'version = "{version}"', 'version = "99.0.0"', 1))
    nixcheck.git_add(scratch)
    err = eval_error(scratch, f'lib.stacks."{name}".engine')
    assert f'stack {name}: stacks/{name}.toml says engine.version = "99.0.0"' in err


def test_a_new_containerfile_copy_fails_the_check(scratch):
    path = scratch / "containers" / "Containerfile"
    path.write_text(path.read_text().replace("COPY config /opt/speclock\n", "COPY config /opt/speclock\nCOPY extra /opt/extra\n"))
    nixcheck.git_add(scratch)
    proc = nix(scratch, "build", "--offline", "--no-link", f".#checks.{SYS}.containerfile", check=False)
    assert proc.returncode != 0 and "copies to /opt/extra in the runtime stage" in proc.stderr


# ---- a GPU stack (synthetic, made from the default stack's lock) ------------------------------


def _add_gpu_stack(repo: Path, name: str, cuda: str, archs: list[str]) -> None:
    base = _default_stack()
    toml = (repo / "stacks" / f"{base}.toml").read_text().replace(f'name = "{base}"', f'name = "{name}"', 1)
    toml += f'\n[gpu]\ncuda = "{cuda}"\narchs = {json.dumps(archs)}\n'
    (repo / "stacks" / f"{name}.toml").write_text(toml)
    doc = json.loads((repo / "locks" / f"{base}.lock").read_text())
    doc["stack"] = doc["stack_data"]["name"] = name
    doc["stack_data"]["gpu"].update(cuda=cuda, archs=archs)
    (repo / "locks" / f"{name}.lock").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    nixcheck.git_add(repo)


def test_a_new_lock_file_becomes_a_stack_with_cuda_pins(scratch):
    _add_gpu_stack(scratch, "gpu-extra", "12.8", ["sm_100", "sm_120"])
    assert "gpu-extra" in eval_json(scratch, "lib.stackNames")
    pins = eval_json(scratch, "lib.stacks.gpu-extra")
    assert (pins["cuda"], pins["archs"]) == ("12.8", ["sm_100", "sm_120"])
    labels = eval_json(scratch, "lib.images.gpu-extra.labels")
    assert (labels["io.speclock.cuda"], labels["io.speclock.archs"]) == ("12.8", "sm_100,sm_120")
    d = nixcheck.double_args(scratch)
    shell = eval_json(
        scratch,
        f"devShells.{SYS}.gpu-extra",
        "--apply",
        "s: { config = s.nixpkgsConfig; packages = map (p: p.name) s.speclockArgs.packages; }",
        *d,
    )
    assert shell["config"]["cudaSupport"] is True and shell["config"]["cudaCapabilities"] == ["10.0", "12.0"]
    assert "cuda_nvcc-12.8" in shell["packages"]
    nixcheck.build_checks(scratch)  # the new stack's check builds too


def test_a_cuda_version_missing_from_nixpkgs_is_named(scratch):
    _add_gpu_stack(scratch, "gpu-old", "11.8", ["sm_90"])
    err = eval_error(scratch, f"devShells.{SYS}.gpu-old.drvPath", *nixcheck.double_args(scratch))
    assert "stack gpu-old: key gpu.cuda is 11.8, but the pinned nixpkgs has no cudaPackages_11_8" in err


def test_a_malformed_arch_is_named(scratch):
    _add_gpu_stack(scratch, "gpu-bad", "12.8", ["blackwell"])
    assert 'stack gpu-bad: key gpu.archs has "blackwell"' in eval_error(scratch, "lib.stacks.gpu-bad")


def test_a_path_the_containerfile_dropped_fails_the_check(scratch):
    path = scratch / "containers" / "Containerfile"
    text = path.read_text()
    assert "/opt/speclock/src" in text
    path.write_text(text.replace("/opt/speclock/src", "/opt/speclock/source"))
    nixcheck.git_add(scratch)
    proc = nix(scratch, "build", "--offline", "--no-link", f".#checks.{SYS}.containerfile", check=False)
    assert proc.returncode != 0
    assert "nix/image.nix provides /opt/speclock/src, which containers/Containerfile never mentions" in proc.stderr
