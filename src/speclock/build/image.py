"""`speclock build-image`: stage the build context, compute the content tag, run the builder.

Flow: lock (must be in sync) -> wheelhouse (verified) -> base image (from the locked rootfs or
digest) -> staged context -> builder -> build record. The tag is the hash of every input that
reaches the image (lock, Containerfile, patches, drafter, config, source), so the same inputs
always give the same tag; with buildah they also give the same digest.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from speclock import __version__
from speclock.build import wheelhouse
from speclock.build.builders import Builder, get_builder
from speclock.build.records import records_dir, write_record
from speclock.build.run import ensure_in_docker, run_image
from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import atomic_output, atomic_write_text, clean_stale_temps, confined, file_sha256, read_json
from speclock.core.layout import REPO_ROOT
from speclock.core.layout import cache_dir
from speclock.spec import baseimage
from speclock.spec.lock import check_lock, lock_path, read_lock
from speclock.spec.resolve import check_kernel_toolchain, kernel_toolchain
from speclock.spec.stack import Stack, load_stack

CONTAINERFILE = REPO_ROOT / "containers" / "Containerfile"
BASE_CONTAINERFILE = REPO_ROOT / "containers" / "base-rootfs.Containerfile"
# The kernel builder stage, spliced into CONTAINERFILE at its @kernels markers for stacks with kernels.build.
KERNELS_CONTAINERFILE = REPO_ROOT / "containers" / "kernels.Containerfile"
KERNELS_STAGE_MARK = "# @kernels-stage"
KERNELS_COPY_MARK = "# @kernels-copy"
KERNELS_IN_IMAGE = "/opt/speclock/kernels"  # speclock.kernels.fp8_cuda looks here (IMAGE.root / "kernels")
# What the early image stages run, as whole packages of src/speclock (plus the files at its top that
# they need): a new import inside one of these packages can never break a build. Only these reach
# the early stages, so editing any other package rebuilds the final layers alone.
#   tools/ (patch stage: `python -m speclock.patches`; assets stage: `python -m speclock.drafter.models`;
#   engines/ holds the probe that `patches apply` runs in the engine's Python)
TOOL_PACKAGES = ("core", "spec", "patches", "engines", "drafter")
TOOL_TOP_FILES = ("__init__.py", "cli.py")
#   kernel-tools/ (kernel stage: `python -m speclock.kernels.build`, with the CUDA sources in kernels/csrc)
KERNEL_TOOL_PACKAGES = ("core", "spec", "kernels")
KERNEL_TOOL_TOP_FILES = ("__init__.py",)
LABEL_PREFIX = "io.speclock"


_sha256_file = file_sha256  # the one helper (speclock.core.files); the old name stays for callers


def _new_file_mode() -> int:
    """The mode open() would give a new file (0666 less the umask): staged files keep the modes
    they had before the atomic writer (whose temp files start at 0600), so image layers do not change."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _sync_file(src: Path, dest: Path) -> None:
    """Copy only when the content differs, so unchanged files keep their metadata (and caches hit)."""
    if dest.is_file() and dest.stat().st_size == src.stat().st_size and _sha256_file(dest) == _sha256_file(src):
        return
    with atomic_output(dest, binary=True, mode=_new_file_mode()) as out, open(src, "rb") as fh:
        shutil.copyfileobj(fh, out, 1 << 20)


def _sync_tree(files: dict[str, Path], dest: Path) -> None:
    """Make `dest` hold exactly `files` (relative path -> source), removing anything stale."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel, src in files.items():
        _sync_file(src, dest / rel)
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest).as_posix()
        if path.is_file() and rel not in files:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def _tree_files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".pyo"))}


def stage_tool_files(src_root: Path, packages: tuple[str, ...], top_files: tuple[str, ...]) -> dict[str, Path]:
    """{"speclock/<rel>": source} for whole packages of src/speclock and the named files at its top."""
    files = {f"speclock/{name}": src_root / name for name in top_files}
    for pkg in packages:
        files.update({f"speclock/{pkg}/{rel}": path for rel, path in _tree_files(src_root / pkg).items()})
    return files


def git_revision(paths: list[Path]) -> str:
    """The commit that last changed the image's inputs (+dirty when they have uncommitted edits)."""
    # Inputs outside the checkout (an upgrade candidate's stack and lock) have no git history.
    rel = [str(p.resolve().relative_to(REPO_ROOT)) for p in paths if p.exists() and p.resolve().is_relative_to(REPO_ROOT)]
    try:
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%H", "--", *rel],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", *rel],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"
    return (rev or "uncommitted") + ("+dirty" if dirty else "")


def source_url() -> str:
    if os.environ.get("SPECLOCK_SOURCE_URL"):
        return os.environ["SPECLOCK_SOURCE_URL"]
    proc = subprocess.run(["git", "-C", str(REPO_ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "https://github.com/speclock/speclock"


def stage_context(stack: Stack, lock: dict[str, Any], ctx: Path, *, lock_file: Path | None = None) -> None:
    """Lay out the build context: wheels, tools, patches, drafter, config, source.

    `lock_file` is the lock to stage (default locks/<stack>.lock; `speclock upgrade` passes a candidate's)."""
    wheels = ctx / "wheels"
    wheelhouse.link_into(lock, wheels)
    keep = {p["filename"] for p in lock["packages"] + lock["assets"]} | {"requirements.txt", "assets.txt"}
    if stack.kernels:
        keep.add("kernels.txt")
    for stale in wheels.iterdir():
        if stale.name not in keep:
            stale.unlink()
    lists = [("requirements.txt", lock["packages"]), ("assets.txt", lock["assets"])]
    if stack.kernels:
        check_kernel_toolchain(stack, lock["packages"] + lock["assets"])
        lists.append(("kernels.txt", kernel_toolchain(lock["packages"] + lock["assets"])))
    for name, pkgs in lists:
        text = wheelhouse.requirements_text(pkgs)
        target = wheels / name
        if not target.is_file() or target.read_text() != text:
            atomic_write_text(target, text, mode=_new_file_mode())

    src_root = REPO_ROOT / "src" / "speclock"
    tools = stage_tool_files(src_root, TOOL_PACKAGES, TOOL_TOP_FILES)
    tools[f"stacks/{stack.path.name}"] = stack.path  # the patch step reads the series from the stack
    _sync_tree(tools, ctx / "tools")
    # Kernel build inputs in a folder of their own, so editing them never rebuilds the patch or asset layers.
    if stack.kernels:
        kernel_tools = stage_tool_files(src_root, KERNEL_TOOL_PACKAGES, KERNEL_TOOL_TOP_FILES)
        kernel_tools[f"stacks/{stack.path.name}"] = stack.path
        _sync_tree(kernel_tools, ctx / "kernel-tools")
    elif (ctx / "kernel-tools").exists():
        shutil.rmtree(ctx / "kernel-tools")

    engine = stack.engine["name"]
    series_dir = REPO_ROOT / "patches" / engine
    patch_files = {}
    for name in stack.patch_series:
        # a series entry is data: it must name a file inside patches/<engine>/ (no '..', no absolute path)
        path = confined(series_dir, name, what="patch", source=f"{stack.path}: patches.series")
        if not path.is_file():
            raise BadInput(f"{stack.path}: patches.series names {name}, which is not in {series_dir}",
                           hint="add the patch file or remove it from patches.series")
        patch_files[f"{engine}/{name}"] = path
    _sync_tree(patch_files, ctx / "patches")

    draft = confined(REPO_ROOT, stack.draft["path"], what="draft.path", source=stack.path).resolve()
    if not (draft / "config.json").is_file():
        raise BadInput(f"{stack.path}: draft.path {stack.draft['path']} has no config.json",
                       hint="point draft.path at an exported EAGLE-3 drafter folder (see `speclock train export`)")
    _sync_tree(_tree_files(draft), ctx / "draft")

    config: dict[str, Path] = {f"stacks/{stack.path.name}": stack.path}
    baselines = REPO_ROOT / "baselines" / stack.name
    if baselines.is_dir():
        config.update({f"baselines/{stack.name}/{k}": v for k, v in _tree_files(baselines).items()})
    _sync_tree(config, ctx / "config")
    _sync_file(lock_file or lock_path(stack), ctx / "config" / "lock.json")
    _sync_tree(_tree_files(src_root), ctx / "src" / "speclock")


def _tree_sha256(ctx: Path, rels: list[str]) -> str:
    """One hash over the named files/folders of the staged context (names and contents)."""
    h = hashlib.sha256()
    for rel in rels:
        path = ctx / rel
        files = {rel: path} if path.is_file() else {f"{rel}/{k}": v for k, v in _tree_files(path).items()} if path.is_dir() else {}
        for name, f in sorted(files.items()):
            h.update(f"{name}:{_sha256_file(f)}\n".encode())
    return h.hexdigest()


def inputs_hash(ctx: Path, lock: dict[str, Any]) -> str:
    """Hash of everything that reaches the image; wheels are covered by the lock's hash."""
    h = hashlib.sha256()
    h.update(b"lock:" + lock["lock_sha256"].encode() + b"\n")
    h.update(b"containerfile:" + _sha256_file(CONTAINERFILE).encode() + b"\n")
    if "kernel_base" in lock:  # the spliced kernel stage is an input of these images only
        h.update(b"kernels-containerfile:" + _sha256_file(KERNELS_CONTAINERFILE).encode() + b"\n")
    for rel, path in sorted(_tree_files(ctx).items()):
        if rel.startswith("wheels/") and rel not in ("wheels/requirements.txt", "wheels/assets.txt", "wheels/kernels.txt"):
            continue
        if rel in ("config/image.json", "Containerfile"):  # derived from the inputs, not inputs
            continue
        h.update(f"{rel}:{_sha256_file(path)}\n".encode())
    return h.hexdigest()


def image_ref(stack: Stack, tag: str) -> str:
    return f"localhost/speclock-{stack.name}:{tag}"


def labels_for(stack: Stack, lock: dict[str, Any], tag: str, inputs: str, revision: str) -> dict[str, str]:
    epoch = lock["source_date_epoch"]
    engine = stack.engine
    return {
        "org.opencontainers.image.title": f"speclock-{stack.name}",
        "org.opencontainers.image.description": stack.data.get("description", ""),
        "org.opencontainers.image.source": source_url(),
        "org.opencontainers.image.revision": revision,
        # The reproducible timestamp (the lock's SOURCE_DATE_EPOCH), not the wall clock.
        "org.opencontainers.image.created": dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "org.opencontainers.image.version": f"{__version__}+{tag}",
        f"{LABEL_PREFIX}.stack": stack.name,
        f"{LABEL_PREFIX}.inputs-sha256": inputs,
        f"{LABEL_PREFIX}.lock-sha256": lock["lock_sha256"],
        f"{LABEL_PREFIX}.engine": engine["name"],
        f"{LABEL_PREFIX}.engine-package": engine["package"],
        f"{LABEL_PREFIX}.engine-version": engine["version"],
        f"{LABEL_PREFIX}.torch-version": stack.torch["version"],
        f"{LABEL_PREFIX}.cuda": stack.gpu["cuda"] or "none",
        f"{LABEL_PREFIX}.archs": ",".join(stack.gpu["archs"]) or "none",
        f"{LABEL_PREFIX}.patches": ",".join(stack.patch_series) or "none",
        f"{LABEL_PREFIX}.base": lock["base"].get("sha256") or lock["base"].get("ref", ""),
    }


def containerfile_text(with_kernels: bool) -> str:
    """containers/Containerfile, with the kernel builder stage and its one COPY spliced in when asked."""
    text = CONTAINERFILE.read_text()
    lines = text.splitlines(keepends=True)
    marks = {m: [i for i, l in enumerate(lines) if l.startswith(m)] for m in (KERNELS_STAGE_MARK, KERNELS_COPY_MARK)}
    if any(len(v) != 1 for v in marks.values()):
        raise BadInput(f"{CONTAINERFILE} must hold exactly one '{KERNELS_STAGE_MARK}' and one '{KERNELS_COPY_MARK}' line",
                       hint="restore the marker comments where the kernel stage and its COPY belong")
    if not with_kernels:
        return text
    lines[marks[KERNELS_COPY_MARK][0]] = f"COPY --from=kernels {KERNELS_IN_IMAGE} {KERNELS_IN_IMAGE}\n"
    lines[marks[KERNELS_STAGE_MARK][0]] = KERNELS_CONTAINERFILE.read_text()
    # A FROM ${ARG} needs the ARG declared before the first FROM.
    first_from = next(i for i, l in enumerate(lines) if l.startswith("FROM "))
    lines.insert(first_from, "ARG KERNEL_BASE_IMAGE\n")
    return "".join(lines)


def staged_containerfile(ctx: Path, labels: dict[str, str], *, with_kernels: bool = False) -> Path:
    """containers/Containerfile (+ the kernel stage for stacks with kernels.build) plus one LABEL instruction."""
    quoted = " \\\n      ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items()))
    text = containerfile_text(with_kernels).rstrip("\n") + f"\n# labels added by speclock build-image\nLABEL {quoted}\n"
    path = ctx / "Containerfile"
    if not path.is_file() or path.read_text() != text:
        atomic_write_text(path, text, mode=_new_file_mode())
    return path


def build_args_for(stack: Stack, lock: dict[str, Any], ctx: Path, base_ref: str,
                   kernel_base_ref: str | None = None) -> dict[str, str]:
    """The Containerfile's build arguments for a staged context; the kernel ones only for kernel stacks."""
    target = stack.target
    build_args = {
        "BASE_IMAGE": base_ref,
        "SOURCE_DATE_EPOCH": str(lock["source_date_epoch"]),
        "PATCH_SERIES": " ".join(stack.patch_series),
        "STACK_NAME": stack.name,
        "TARGET_GGUF": target["gguf"],
        "TARGET_DTYPE": target["dtype"],
        "PROMPTS_FILE": stack.smoke["prompts_file"],
        # Content of the bind-mounted folders, so a changed lock or patch never reuses a stale layer.
        "WHEELS_SHA256": _tree_sha256(ctx, ["wheels/requirements.txt"]),
        "PATCHES_SHA256": _tree_sha256(ctx, ["tools", "patches"]),
        "ASSETS_SHA256": _tree_sha256(ctx, ["wheels/requirements.txt", "wheels/assets.txt", "tools"]),
    }
    if kernel_base_ref:
        build_args["KERNEL_BASE_IMAGE"] = kernel_base_ref
        build_args["KERNELS_SHA256"] = _tree_sha256(ctx, ["wheels/kernels.txt", "kernel-tools"])
    return build_args


def ensure_base_image(stack: Stack, lock: dict[str, Any], builder: Builder, *, progress=print,
                      key: str = "base") -> str:
    """The locked base as a local image; key="kernel_base" gives the kernel builder's base."""
    base = lock[key]
    if base["kind"] == "image":
        return base["ref"]
    ref = f"localhost/speclock-{key.replace('_', '-')}:{base['sha256'][:16]}"
    if builder.image_exists(ref):
        return ref
    tar = baseimage.verified_rootfs(base, progress=progress)
    ctx = cache_dir() / "contexts" / f"base-{base['sha256'][:16]}"
    ctx.mkdir(parents=True, exist_ok=True)
    target = ctx / "base.tar"
    clean_stale_temps(ctx)  # a copy a killed run left half-done
    if not target.exists():
        try:
            os.link(tar, target)
        except OSError:
            # whole or not at all: a half copy under the final name would be imported as the base next time
            with atomic_output(target, binary=True, mode=_new_file_mode()) as out, open(tar, "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)
    progress(f"importing the base rootfs as {ref}")
    builder.build(containerfile=BASE_CONTAINERFILE, context=ctx, tag=ref, build_args={}, labels={},
                  target=None, no_cache=False, timestamp=base["source_date_epoch"])
    return ref


@contextlib.contextmanager
def context_lock(stack_name: str, progress=print):
    """One build per stack at a time: builds share the staged context folder."""
    path = cache_dir() / "contexts" / f"{stack_name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"another build of stack {stack_name} is running; waiting for it to finish")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def build_image(stack: Stack, *, builder_name: str = "buildah", no_cache: bool = False,
                lock_file: Path | None = None, progress=print) -> dict[str, Any]:
    """Build the stack's image; return the build record (also written to the cache).

    `lock_file`: build from this lock instead of locks/<stack>.lock (an upgrade candidate); the
    record is then marked `candidate` and does not become the stack's latest build."""
    with context_lock(context_name(stack, lock_file), progress):
        return _build_image_locked(stack, builder_name=builder_name, no_cache=no_cache, lock_file=lock_file,
                                   progress=progress)


def context_name(stack: Stack, lock_file: Path | None = None) -> str:
    """The staged context's folder name: candidates get their own, so they never wait on (or disturb) the current build."""
    if lock_file in (None, lock_path(stack)):
        return stack.name
    return f"{stack.name}.candidate-{hashlib.sha256(str(Path(lock_file).resolve()).encode()).hexdigest()[:8]}"


def _build_image_locked(stack: Stack, *, builder_name: str, no_cache: bool, lock_file: Path | None,
                        progress) -> dict[str, Any]:
    started = time.monotonic()
    builder = get_builder(builder_name)
    lock_file = lock_file or lock_path(stack)
    lock = read_lock(lock_file)
    diffs = check_lock(stack, lock)
    if diffs:
        raise CheckFailed(f"{lock_file} is out of date with {stack.path}:\n  " + "\n  ".join(diffs),
                          hint=f"run `invoke lock --stack {stack.name}` first")
    progress(f"[1/4] verifying the wheelhouse for {stack.name}")
    wheelhouse.fetch(lock, progress=progress)
    progress("[2/4] base image")
    base_ref = ensure_base_image(stack, lock, builder, progress=progress)
    progress(f"  base: {base_ref}")
    kernel_base_ref = None
    if stack.kernels:
        if "kernel_base" not in lock:
            raise CheckFailed(f"{lock_file} has no kernel_base, but {stack.path} has kernels.build",
                              hint=f"run `invoke lock --stack {stack.name}` (it locks the kernel builder base)")
        kernel_base_ref = ensure_base_image(stack, lock, builder, progress=progress, key="kernel_base")
        progress(f"  kernel builder base: {kernel_base_ref} (+ {', '.join(stack.data['kernels']['builder_packages'])})")
    progress("[3/4] staging the build context")
    ctx = cache_dir() / "contexts" / context_name(stack, lock_file)
    stage_context(stack, lock, ctx, lock_file=lock_file)
    inputs = inputs_hash(ctx, lock)
    tag = inputs[:16]
    ref = image_ref(stack, tag)
    revision = git_revision([CONTAINERFILE, stack.path, lock_file, REPO_ROOT / "src",
                             REPO_ROOT / stack.draft["path"], REPO_ROOT / "patches", REPO_ROOT / "baselines"])
    labels = labels_for(stack, lock, tag, inputs, revision)
    info = {"stack": stack.name, "tag": tag, "ref": ref, "inputs_sha256": inputs, "lock_sha256": lock["lock_sha256"],
            "labels": labels, "patches": stack.patch_series}
    info_path = ctx / "config" / "image.json"
    atomic_write_text(info_path, json.dumps(info, indent=2, sort_keys=True) + "\n", mode=_new_file_mode())
    build_args = build_args_for(stack, lock, ctx, base_ref, kernel_base_ref)
    if kernel_base_ref:
        progress(f"  kernels: {', '.join(stack.kernels)} for {', '.join(stack.gpu['archs'])} (nvcc stage, then only the library)")
    progress(f"[4/4] building {ref} with {builder.name} ({'no cache' if no_cache else 'layer cache on'})")
    containerfile = staged_containerfile(ctx, labels, with_kernels=bool(stack.kernels))
    t0 = time.monotonic()
    image_id = builder.build(containerfile=containerfile, context=ctx, tag=ref, build_args=build_args, labels={},
                             target="runtime", no_cache=no_cache, timestamp=lock["source_date_epoch"])
    build_s = time.monotonic() - t0
    record = {**info, "builder": builder.name, "image_id": image_id, "build_seconds": round(build_s, 2),
              "total_seconds": round(time.monotonic() - started, 2), "no_cache": no_cache,
              "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "layers": builder.layers(ref)}
    if lock_file != lock_path(stack):
        record["candidate"] = True
        record["lock_file"] = str(lock_file)
    write_record(stack.name, record)
    progress(f"built {ref}\n  image id {image_id}\n  build {build_s:.1f} s, total {record['total_seconds']:.1f} s")
    return record


def selfcheck_image(stack: Stack, record: dict[str, Any], *, args: list[str] | None = None,
                    progress=print) -> dict[str, Any]:
    """Run the new image's self-check (doctor, smoke, gate) hardened, and record the verdict with the build."""
    ref = ensure_in_docker(record)
    out = records_dir(stack.name) / f"{record['tag']}.{record['builder']}.selfcheck"
    if out.exists():
        shutil.rmtree(out)
    progress(f"self-check of {ref}: doctor, smoke, gate (offline, read-only, non-root)")
    t0 = time.monotonic()
    proc = run_image(ref, ["selfcheck", "--out", "/out", *(args or [])], out_dir=out,
                     env={"SPECLOCK_IMAGE_REF": ref, "SPECLOCK_IMAGE_DIGEST": record["image_id"]})
    verdict = _image_output(out / "selfcheck.json")
    result = {"verdict": verdict.get("verdict") if isinstance(verdict.get("verdict"), str) else "fail",
              "exit_code": proc.returncode, "seconds": round(time.monotonic() - t0, 1), "outputs": str(out)}
    if "error" in verdict:
        result["error"] = verdict["error"]
    doctor_file = out / "doctor.json"
    if doctor_file.is_file():
        doc = _image_output(doctor_file)
        failed = doc.get("failed", [])
        checks = doc.get("checks", [])
        result["doctor"] = {"verdict": doc.get("verdict") if isinstance(doc.get("verdict"), str) else "fail",
                            "failed": [str(f) for f in failed] if isinstance(failed, list) else [str(failed)],
                            "checks": {str(c.get("name")): str(c.get("status")) for c in checks if isinstance(c, dict)}
                            if isinstance(checks, list) else {}}
    stages = verdict.get("stages")
    smoke = stages.get("smoke", {}) if isinstance(stages, dict) else {}
    smoke = smoke if isinstance(smoke, dict) else {}
    if smoke.get("skipped"):
        result["smoke_skipped"] = smoke.get("note", "skipped")
    record["selfcheck"] = result
    write_record(stack.name, record)
    if "doctor" in result:
        progress(f"doctor in the image: {result['doctor']['verdict']}"
                 + (f" (failed: {', '.join(result['doctor']['failed'])})" if result["doctor"]["failed"] else ""))
    if smoke.get("skipped"):
        # A GPU stack built on a machine without a GPU: doctor is the proof here, smoke waits for a GPU host.
        progress(f"smoke SKIPPED: {smoke.get('note')}; run `speclock run-image --stack {stack.name}` on a GPU host "
                 "(SPECLOCK_RUN_ARGS='--gpus all') for the smoke test and gate")
    progress(f"self-check verdict: {result['verdict']} (exit {proc.returncode}, {result['seconds']} s); outputs in {out}")
    return result


def _image_output(path: Path) -> dict[str, Any]:
    """A JSON result the image wrote into /out; missing or damaged counts as a failed self-check."""
    if not path.is_file():
        return {"verdict": "fail", "error": f"no {path.name} written"}
    try:
        return read_json(path, what="self-check result")
    except BadInput as err:
        return {"verdict": "fail", "error": err.message}


def _cmd_build(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    out = (lambda m: print(m, file=sys.stderr)) if args.json else print
    record = build_image(stack, builder_name=args.builder, no_cache=args.no_cache, progress=out)
    if not args.skip_selfcheck:
        result = selfcheck_image(stack, record, progress=out)
        if args.json:
            print(json.dumps(record, indent=2, sort_keys=True))
        if result["verdict"] not in ("pass", "smoke-skipped"):
            doctor_failed = result.get("doctor", {}).get("failed")
            read = (f"{result['outputs']}/doctor.json (doctor failed: {', '.join(doctor_failed)})" if doctor_failed
                    else f"{result['outputs']}/summary.md and report.json")
            raise CheckFailed(f"the image {record['ref']} was built but its self-check failed (exit {result['exit_code']})",
                              hint=f"read {read}; push-image refuses it until it passes")
        return 0
    if args.json:
        print(json.dumps(record, indent=2, sort_keys=True))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("build-image", help="build a stack's image (tag = hash of all inputs)",
                       description="Build the OCI image of a stack from its lock, offline: verifies the wheelhouse, "
                                   "imports the locked base, stages the context and runs the builder. The tag is the "
                                   "hash of every input; buildah builds are reproducible (same inputs, same digest).")
    p.add_argument("--stack", default="cpu-vllm", help="stack name or path (default cpu-vllm)")
    p.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="image builder (default buildah)")
    p.add_argument("--no-cache", action="store_true", help="rebuild every layer")
    p.add_argument("--skip-selfcheck", action="store_true",
                   help="do not run the image's self-check (doctor, smoke, gate) after building; push-image will then refuse it")
    p.add_argument("--json", action="store_true", help="print the build record as JSON on stdout")
    p.set_defaults(func=_cmd_build)
