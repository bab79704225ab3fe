"""`speclock build-image`: build a stack's image and run its self-check.

Flow: lock (must be in sync) -> wheelhouse (verified) -> base image (from the locked rootfs or
digest) -> staged context (build.context) -> builder, with the labels of build.labels -> build
record -> the image's self-check. The tag is the hash of every input that reaches the image
(build.inputs), so the same inputs always give the same tag; with buildah they also give the same digest.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Literal

from speclock.build import digests, tail
from speclock.build.builders import Builder, builder_version, ensure_in_docker, get_builder
from speclock.build.builders.buildah import STORAGE
from speclock.build.containerfile import BASE_CONTAINERFILE, CONTAINERFILE, build_args_for, staged_containerfile
from speclock.build.context import context_dir, context_lock, context_name, stage_context
from speclock.build.fetch import fetch
from speclock.build.inputs import context_digests, git_revision, image_ref, image_tag, inputs_hash
from speclock.build.labels import labels_for
from speclock.build.lockcheck import read_lock_checked
from speclock.build.records import BuildRecord, DoctorSummary, ImageInfo, SelfcheckResult, records_dir, write_record
from speclock.build.reuse import reusable_record
from speclock.build.run import model_mount, run_image
from speclock.build.runtimes import Mount, check_runtime, ensure_in_podman
from speclock.build.sbom.cache import stage_sbom_cached
from speclock.build.sbom.format import SBOM_IN_IMAGE
from speclock.build.wheelhouse import save_stamps, store_dir
from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.files import atomic_output, atomic_write_text, clean_stale_temps, read_json
from speclock.core.heartbeat import Progress
from speclock.core.layout import REPO_ROOT, cache_dir
from speclock.drafter.models import stack_model_path
from speclock.spec import baseimage
from speclock.spec.lock import LockDoc, check_lock, lock_path
from speclock.spec.stack import DEFAULT_STACK, Stack, load_stack


def ensure_base_image(
    stack: Stack,
    lock: LockDoc,
    builder: Builder,
    *,
    progress: Progress = print,
    key: Literal["base", "kernel_base"] = "base",
) -> str:
    """The locked base as a local image; key="kernel_base" gives the kernel builder's base."""
    base = lock[key]
    ref = base_image_ref(lock, key)
    if base["kind"] == "image":
        return ref
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
            with atomic_output(target, binary=True) as out, open(tar, "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)
    progress(f"importing the base rootfs as {ref}")
    builder.build(
        containerfile=BASE_CONTAINERFILE,
        context=ctx,
        tag=ref,
        build_args={},
        labels={},
        target=None,
        no_cache=False,
        timestamp=base["source_date_epoch"],
    )
    return ref


def base_image_ref(lock: LockDoc, key: Literal["base", "kernel_base"] = "base") -> str:
    """The ref the locked base has (or gets, when ensure_base_image imports it); nothing is asked of the builder."""
    base = lock[key]
    if base["kind"] == "image":
        return base["ref"]
    return f"localhost/speclock-{key.replace('_', '-')}:{base['sha256'][:16]}"


def build_image(
    stack: Stack,
    *,
    builder_name: str = "buildah",
    no_cache: bool = False,
    lock_file: Path | None = None,
    progress: Progress = print,
) -> BuildRecord:
    """Build the stack's image; return the build record (also written to the cache).

    `lock_file`: build from this lock instead of locks/<stack>.lock (an upgrade candidate); the
    record is then marked `candidate` and does not become the stack's latest build."""
    name = context_name(stack, lock_file)
    # the staged files' digests are remembered by their stat from build to build (build.digests)
    with context_lock(name, progress), digests.remembering(cache_dir() / "contexts" / f"{name}.digests.json"):
        return _build_image_locked(stack, builder_name=builder_name, no_cache=no_cache, lock_file=lock_file, progress=progress)


def _build_image_locked(
    stack: Stack, *, builder_name: str, no_cache: bool, lock_file: Path | None, progress: Progress
) -> BuildRecord:
    started = time.monotonic()
    builder = get_builder(builder_name)
    lock_file = lock_file or lock_path(stack)
    lock = read_lock_checked(lock_file)  # read_lock, or its last pass while nothing it reads changed
    diffs = check_lock(stack, lock)
    if diffs:
        raise CheckFailed(
            f"{lock_file} is out of date with {stack.path}:\n  " + "\n  ".join(diffs),
            hint=f"run `invoke lock --stack {stack.name}` first",
        )
    progress(f"[1/4] verifying the wheelhouse for {stack.name}")
    fetch(lock, progress=progress)
    save_stamps(store_dir())  # the next build hashes only what changed since (build.wheelhouse)
    # The base is imported only when a step builds on it (not when the stages before the source are in the
    # store, nor for a rebuild answered from the store): its ref is known from the lock.
    progress("[2/4] base image")
    base_ref = base_image_ref(lock)
    progress(f"  base: {base_ref}")
    kernel_base_ref = None
    if stack.kernels:
        if "kernel_base" not in lock:
            raise CheckFailed(
                f"{lock_file} has no kernel_base, but {stack.path} has kernels.build",
                hint=f"run `invoke lock --stack {stack.name}` (it locks the kernel builder base)",
            )
        kernel_base_ref = base_image_ref(lock, "kernel_base")
        progress(f"  kernel builder base: {kernel_base_ref} (+ {', '.join(stack.data['kernels']['builder_packages'])})")

    def ensure_bases() -> None:
        ensure_base_image(stack, lock, builder, progress=progress)
        if kernel_base_ref:
            ensure_base_image(stack, lock, builder, progress=progress, key="kernel_base")

    progress("[3/4] staging the build context")
    ctx = context_dir(stack, lock_file)
    stage_context(stack, lock, ctx, lock_file=lock_file)
    digests = context_digests(ctx)  # each staged file hashed once: for the tag and the SBOM's cache key
    inputs = inputs_hash(ctx, lock, digests)
    # /opt/speclock/sbom.cdx.json: derived, not in the tag; reused while what makes it is unchanged
    stage_sbom_cached(stack, lock, ctx, digests, progress=progress)
    tag = image_tag(inputs)
    ref = image_ref(stack, tag)
    revision = git_revision(
        [
            CONTAINERFILE,
            stack.path,
            lock_file,
            REPO_ROOT / "src",
            REPO_ROOT / stack.draft["path"],
            REPO_ROOT / "patches",
            REPO_ROOT / "baselines",
        ]
    )
    # The patches label names the staged patch files: the ones the image applies.
    labels = labels_for(stack, lock, tag, inputs, revision, patches_root=ctx / "patches", sbom=SBOM_IN_IMAGE)
    info: ImageInfo = {
        "stack": stack.name,
        "tag": tag,
        "ref": ref,
        "inputs_sha256": inputs,
        "lock_sha256": lock["lock_sha256"],
        "labels": labels,
        "patches": stack.patch_series,
    }
    info_path = ctx / "config" / "image.json"
    atomic_write_text(info_path, json.dumps(info, indent=2, sort_keys=True) + "\n")
    version = builder_version(builder)
    kept = None if no_cache else reusable_record(stack.name, builder, version, ref=ref, tag=tag, inputs=inputs, labels=labels)
    if kept is not None:
        return _reused(stack, kept, lock_file, started, progress)
    build_args = build_args_for(stack, lock, ctx, base_ref, kernel_base_ref)
    if kernel_base_ref:
        progress(f"  kernels: {', '.join(stack.kernels)} for {', '.join(stack.gpu['archs'])} (nvcc stage, then only the library)")
    progress(f"[4/4] building {ref} with {builder.name} ({'no cache' if no_cache else 'layer cache on'})")
    containerfile = staged_containerfile(ctx, with_kernels=bool(stack.kernels), engine_env=stack.engine_env)
    t0 = time.monotonic()
    body = tail.split(containerfile.read_text()) if builder.name == "buildah" else None
    if body is not None:  # buildah: the stages before the source layer as one image of their own (build.tail)
        key = tail.body_key(body, build_args, lock["source_date_epoch"], version, STORAGE[1])
        image_id = tail.build_in_two(
            builder,
            body=body,
            key=key,
            stack_name=stack.name,
            context=ctx,
            tag=ref,
            build_args=build_args,
            labels=labels,
            no_cache=no_cache,
            timestamp=lock["source_date_epoch"],
            progress=progress,
            before_body=ensure_bases,
        )
    else:
        ensure_bases()
        image_id = builder.build(
            containerfile=containerfile,
            context=ctx,
            tag=ref,
            build_args=build_args,
            labels=labels,
            target="runtime",
            no_cache=no_cache,
            timestamp=lock["source_date_epoch"],
        )
    build_s = time.monotonic() - t0
    _check_labels(builder, ref, labels, progress)
    record: BuildRecord = {
        # info's keys one by one, in its order (a ** of it leaves mypy unsure of BuildRecord's optional keys)
        "stack": info["stack"],
        "tag": info["tag"],
        "ref": info["ref"],
        "inputs_sha256": info["inputs_sha256"],
        "lock_sha256": info["lock_sha256"],
        "labels": info["labels"],
        "patches": info["patches"],
        "builder": builder.name,
        "image_id": image_id,
        "build_seconds": round(build_s, 2),
        "total_seconds": round(time.monotonic() - started, 2),
        "no_cache": no_cache,
        "built_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "layers": builder.layers(ref),
        "builder_version": version,
    }
    if lock_file != lock_path(stack):
        record["candidate"] = True
        record["lock_file"] = str(lock_file)
    write_record(stack.name, record)
    progress(f"built {ref}\n  image id {image_id}\n  build {build_s:.1f} s, total {record['total_seconds']:.1f} s")
    return record


def _reused(stack: Stack, record: BuildRecord, lock_file: Path, started: float, progress: Progress) -> BuildRecord:
    """The record of the image already in the store (build.reuse), rewritten as this build's (the stack's latest)."""
    record = {**record, "reused": True, "total_seconds": round(time.monotonic() - started, 2)}
    record.pop("candidate", None)
    record.pop("lock_file", None)
    if lock_file != lock_path(stack):
        record["candidate"] = True
        record["lock_file"] = str(lock_file)
    write_record(stack.name, record)
    progress(
        f"{record['ref']} is in the store, built from these inputs by {record['builder']} {record.get('builder_version')}: not building it again"
    )
    progress(f"  image id {record['image_id']}\n  total {record['total_seconds']:.1f} s")
    return record


def _check_labels(builder: Builder, ref: str, labels: dict[str, str], progress: Progress) -> None:
    """Say so when the built image does not carry exactly the labels asked for (the record and image.json
    say what was asked): a builder that reused a cached image with older labels, for one."""
    carried = builder.labels(ref)
    stale = sorted(k for k, v in labels.items() if carried.get(k) != v)
    if stale:
        progress(
            f"warning: {ref} carries other values than asked for labels {', '.join(stale)} (a reused cached "
            "image); building again with --no-cache relabels it"
        )


def selfcheck_runtime(record: BuildRecord) -> str:
    """podman for a buildah build where podman works: it runs the image from buildah's own store, where docker
    first needs a full copy (80 s for the 2.6 GB cpu-vllm image on 2 cores, minutes for a 10 GB GPU image);
    docker otherwise. Both run it under the same limits (build.runtimes.run_argv)."""
    if record["builder"] == "buildah":
        try:
            check_runtime("podman")
            return "podman"
        except EnvironmentProblem:
            pass
    return "docker"


def selfcheck_mounts(stack: Stack) -> list[Mount]:
    """A target.path stack's image holds no target: its self-check mounts the stack's target.path folder of this build
    host read-only where run-image --model would. Missing here: exit 3 naming target.path, before any container."""
    if not stack.target["path"]:
        return []
    folder = stack_model_path(REPO_ROOT, stack.target["path"], "target.path", stack.path)
    if not folder.exists() and not folder.is_symlink():
        raise EnvironmentProblem(
            f"{stack.path}: target.path {folder} is not on this host: the image's self-check needs the target mounted",
            hint=f"build where the model is, or build with --skip-selfcheck and run `speclock run-image --stack "
            f"{stack.name} --model DIR` where it is (only build-image records a self-check: push-image then needs --force)",
        )
    return [model_mount("--model", str(folder))]


def selfcheck_image(
    stack: Stack,
    record: BuildRecord,
    *,
    args: list[str] | None = None,
    progress: Progress = print,
    runtime: str | None = None,
) -> SelfcheckResult:
    """Run the new image's self-check (doctor, smoke, gate) hardened, and record the verdict with the build.

    `runtime`: docker or podman; default selfcheck_runtime's choice (a test runs the docker path of a buildah build)."""
    mounts = selfcheck_mounts(stack)
    if runtime is None:
        runtime = selfcheck_runtime(record)
    else:
        check_runtime(runtime)
    ref = ensure_in_podman(record) if runtime == "podman" else ensure_in_docker(record)
    out = records_dir(stack.name) / f"{record['tag']}.{record['builder']}.selfcheck"
    if out.exists():
        shutil.rmtree(out)
    progress(f"self-check of {ref} under {runtime}: doctor, smoke, gate (offline, read-only, non-root)")
    for mount in mounts:
        progress(f"  the target from target.path, mounted read-only: {mount.host} -> {mount.inside}")
    t0 = time.monotonic()
    # The image's own log is progress: it goes to stderr, so `--json` callers (build-image, upgrade) keep a
    # parseable stdout; the verdict is read from the files the image writes.
    proc = run_image(
        ref,
        ["selfcheck", "--out", "/out", *(args or [])],
        out_dir=out,
        env={"SPECLOCK_IMAGE_REF": ref, "SPECLOCK_IMAGE_DIGEST": record["image_id"]},
        stdout=2,
        runtime=runtime,
        mounts=mounts,
    )  # fd 2: valid even where sys.stderr is replaced (tests, captured runs)
    verdict = _image_output(out / "selfcheck.json")
    said = verdict.get("verdict")
    result: SelfcheckResult = {
        "verdict": said if isinstance(said, str) else "fail",
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "outputs": str(out),
    }
    if "error" in verdict:
        result["error"] = verdict["error"]
    doctor_file = out / "doctor.json"
    if doctor_file.is_file():
        doc = _image_output(doctor_file)
        failed = doc.get("failed", [])
        checks = doc.get("checks", [])
        doctor_said = doc.get("verdict")
        doctor: DoctorSummary = {
            "verdict": doctor_said if isinstance(doctor_said, str) else "fail",
            "failed": [str(f) for f in failed] if isinstance(failed, list) else [str(failed)],
            "checks": {str(c.get("name")): str(c.get("status")) for c in checks if isinstance(c, dict)}
            if isinstance(checks, list)
            else {},
        }
        result["doctor"] = doctor
    stages = verdict.get("stages")
    smoke = stages.get("smoke", {}) if isinstance(stages, dict) else {}
    smoke = smoke if isinstance(smoke, dict) else {}
    if smoke.get("skipped"):
        result["smoke_skipped"] = smoke.get("note", "skipped")
    record["selfcheck"] = result
    write_record(stack.name, record)
    if "doctor" in result:
        doctor = result["doctor"]
        progress(
            f"doctor in the image: {doctor['verdict']}"
            + (f" (failed: {', '.join(doctor['failed'])})" if doctor["failed"] else "")
        )
    if smoke.get("skipped"):
        # A GPU stack built on a machine without a GPU: doctor is the proof here, smoke waits for a GPU host.
        progress(
            f"smoke SKIPPED: {smoke.get('note')}; run `speclock run-image --stack {stack.name}` on a GPU host "
            "(a GPU stack gets --gpus all by default) for the smoke test and gate"
        )
    progress(f"self-check verdict: {result['verdict']} (exit {proc.returncode}, {result['seconds']} s); outputs in {out}")
    return result


def _image_output(path: Path) -> dict[str, Any]:
    """A JSON result the image wrote into /out; missing or damaged counts as a failed self-check."""
    if not path.is_file():
        return {"verdict": "fail", "error": f"no {path.name} written"}
    try:
        # the image's own JSON, open-ended: the caller reads "verdict" and checks its type
        doc: dict[str, Any] = read_json(path, what="self-check result")
        return doc
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
            doctor_failed = result["doctor"]["failed"] if "doctor" in result else None
            read = (
                f"{result['outputs']}/doctor.json (doctor failed: {', '.join(doctor_failed)})"
                if doctor_failed
                else f"{result['outputs']}/summary.md and report.json"
            )
            raise CheckFailed(
                f"the image {record['ref']} was built but its self-check failed (exit {result['exit_code']})",
                hint=f"read {read}; push-image refuses it until it passes",
            )
        return 0
    if args.json:
        print(json.dumps(record, indent=2, sort_keys=True))
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "build-image",
        help="build a stack's image (tag = hash of all inputs)",
        description="Build the OCI image of a stack from its lock, offline: verifies the wheelhouse, "
        "imports the locked base, stages the context and runs the builder. The tag is the "
        "hash of every input; buildah builds are reproducible (same inputs, same digest).",
    )
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="image builder (default buildah)")
    p.add_argument("--no-cache", action="store_true", help="rebuild every layer")
    p.add_argument(
        "--skip-selfcheck",
        action="store_true",
        help="do not run the image's self-check (doctor, smoke, gate) after building; push-image will then refuse it",
    )
    p.add_argument("--json", action="store_true", help="print the build record as JSON on stdout")
    p.set_defaults(func=_cmd_build)
