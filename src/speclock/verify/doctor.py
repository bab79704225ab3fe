"""`speclock doctor`: static self-checks of an engine environment, no GPU needed.

They catch, before any GPU time is spent, the failures that cost EAGLE-3 deployments days:
an EAGLE-3 check that the engine runs on the OUTER model class (which a hand patch of the inner
class never touched), a drafter whose `eagle_aux_hidden_state_layer_ids` mean different layers
in vLLM and SGLang, kernels with no code for the GPU the image targets, and drift from the lock.

Checks (each prints PASS / FAIL / WARN / SKIP and a one-line reason):
  lock-versions   every locked package has the locked version in the engine's Python
  engine-import   the engine imports
  patches         the stack's patch series is applied and every probe passes
  eagle3-target   the engine's registry resolves the target architecture and the engine's own
                  EAGLE-3 check passes on that class (the outer one, which the engine checks)
  aux-layers      the layers the engine will feed the drafter (engine's own convention, from
                  the config the drafter folder has) equal the drafter manifest's aux_layers_after
  gpu-archs       every compiled extension has SASS or usable PTX for each stack GPU arch
                  (cuobjdump), as a table per library; known gaps in the stack are accepted
  cuda-driver     CUDA runtime vs driver and the visible GPU's compute capability (cuda-python)
  kernels         speclock's own CUDA kernel library (kernels.build) holds a cubin for exactly each
                  stack GPU arch and no PTX (cuobjdump), and is the one its kernels.json describes

All engine questions go to the engine's Python in one subprocess (`speclock.engines.probe`).
Exit: 0 all pass (warnings allowed), 1 a check failed, 2 bad input, 3 engine missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.files import expect, read_json
from speclock.core.layout import IMAGE, in_image
from speclock.core.layout import REPO_ROOT
from speclock.drafter.models import (DRAFT_MANIFEST, config_architecture, read_drafter_manifest, read_model_config,
                                     require_model_folder, stack_model_path)
from speclock.engines import envs as engine_envs
from speclock.kernels import build as kbuild
from speclock.patches.probes import engine_subprocess, last_json, run_static_probes
from speclock.patches.series import load_series
from speclock.patches.trees import DirTree, default_site_packages, installed_version
from speclock.spec.stack import Stack, load_stack
from speclock.verify import cuda_arch

ENGINE_CHECKS = ("lock-versions", "engine-import", "patches", "eagle3-target", "aux-layers", "gpu-archs", "cuda-driver")
CHECKS = ("lock-versions", "engine-import", "patches", "eagle3-target", "aux-layers", "gpu-archs", "cuda-driver", "kernels")
MANIFEST = DRAFT_MANIFEST
DOCTOR_SCHEMA = "speclock.doctor/v1"
# Language-model class inside multimodal wrappers, by the text config's model_type.
INNER_BY_MODEL_TYPE = {"deepseek_v3": "DeepseekV3ForCausalLM", "kimi_k2": "DeepseekV3ForCausalLM",
                       "deepseek_v2": "DeepseekV2ForCausalLM"}


@dataclass
class Check:
    name: str
    status: str  # pass | fail | warn | skip
    reason: str
    details: dict = field(default_factory=dict)


@dataclass
class Context:
    stack: Stack
    python: str | None  # the engine's Python; None when not available
    python_note: str
    site_packages: Path | None
    lock_path: Path | None
    target_dir: Path | None
    draft_dir: Path | None
    arch: str | None = None  # override of the target architecture
    engine_answers: dict = field(default_factory=dict)


# ---------------------------------------------------------------- context

def _engine_version_here(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def resolve_python(stack: Stack, python: str | None) -> tuple[str | None, str]:
    """The engine's Python: --python, this one (if it has the pinned engine), or a cached engine env."""
    if python:
        return python, f"--python {python}"
    dist, version = stack.engine["package"], stack.engine["version"]
    if _engine_version_here(dist) == version:
        return sys.executable, f"this Python has {dist} {version}"
    if stack.engine["package"] in engine_envs.KNOWN:
        spec = f"{dist}=={version}"
        py = engine_envs.env_python(spec)
        if py:
            return str(py), f"cached engine env {py.parent.parent}"
        return None, (f"{dist} {version} is neither in this Python nor in a cached env; "
                      f"run: python -m speclock.engines.envs ensure {spec}")
    return None, f"{dist} {version} is not installed in this Python ({sys.executable}); pass --python"


def _repo_path(rel: str, what: str, stack: Stack) -> Path | None:
    """A model path from the stack file: inside the repository (a stack is data; it must not point elsewhere)."""
    if not rel:
        return None
    return stack_model_path(REPO_ROOT, rel, what, getattr(stack, "path", None) or f"stack {stack.name}")


def _given_file(value: str | None, option: str, what: str) -> Path | None:
    if not value:
        return None
    p = Path(value)
    if not p.exists():
        raise BadInput(f"{option} {p}: no {what} there", hint=f"give the path of an existing {what}")
    if p.is_dir():
        raise BadInput(f"{option} {p} is a directory, where the {what} file belongs", hint=f"give the {what} file itself")
    return p


def build_context(args: argparse.Namespace) -> Context:
    image = not args.stack and (in_image() or IMAGE.lock_file.is_file())
    if image:
        stack = load_stack(IMAGE.stack_file)
        lock = IMAGE.lock_file
        target = IMAGE.target_dir
        draft = IMAGE.draft_dir
    else:
        stack = load_stack(args.stack or "cpu-vllm")
        lock = REPO_ROOT / "locks" / f"{stack.name}.lock"
        target = _repo_path(stack.target["path"], "target.path", stack) if stack.target["path"] else None
        draft = _repo_path(stack.draft["path"], "draft.path", stack)
    lock = _given_file(args.lock, "--lock", "lock file") or lock
    if args.target:
        # A folder named on the command line must be a model folder: a typo must not turn into a skipped check.
        target = require_model_folder(args.target, what="target", option="--target")
        read_model_config(target, what="target", option="--target")
    if args.draft:
        draft = require_model_folder(args.draft, what="drafter", option="--draft")
        read_model_config(draft, what="drafter", option="--draft")
        read_drafter_manifest(draft)  # checked when present; `speclock doctor --draft` also requires it (_cmd_doctor)
    if args.python and not Path(args.python).is_file() and not shutil.which(args.python):
        raise BadInput(f"--python {args.python}: no Python executable there", hint="give the engine's python (a path or a command on PATH)")
    python, note = resolve_python(stack, args.python)
    site = None
    if args.site_packages and not Path(args.site_packages).is_dir():
        raise BadInput(f"--site-packages {args.site_packages} is not a folder", hint="give the engine's site-packages folder")
    if python:
        site = Path(args.site_packages) if args.site_packages else default_site_packages(python)
    return Context(stack, python, note, site, lock, target, draft, args.arch)


# ---------------------------------------------------------------- target and drafter facts

def _read_json(path: Path, what: str) -> dict:
    """A JSON object (BadInput naming the file for binary, non-UTF-8, invalid JSON or another JSON type)."""
    return read_json(path, what=what, hint="fix or regenerate the file")


def load_manifest(draft_dir: Path | None) -> dict | None:
    """The drafter's manifest, checked (speclock.drafter.models.read_drafter_manifest); None when there is none."""
    if not draft_dir or not Path(draft_dir).is_dir():
        return None
    return read_drafter_manifest(draft_dir)


def target_facts(ctx: Context, manifest: dict | None) -> dict:
    """Architecture, layer count and inner language-model class of the target."""
    facts: dict = {"arch": None, "num_hidden_layers": None, "inner": None, "source": None}
    cfg_path = ctx.target_dir / "config.json" if ctx.target_dir else None
    if cfg_path and (cfg_path.exists() or cfg_path.is_symlink()):
        cfg = read_model_config(ctx.target_dir, what="target")  # types checked: BadInput naming file and key
        text = cfg.get("text_config") or None
        facts["arch"] = config_architecture(cfg)
        facts["num_hidden_layers"] = cfg.get("num_hidden_layers") or (text or {}).get("num_hidden_layers")
        if text:
            facts["inner"] = config_architecture(text) or INNER_BY_MODEL_TYPE.get(text.get("model_type") or "")
        facts["source"] = str(cfg_path)
    if manifest and isinstance(manifest.get("target"), dict):
        t = manifest["target"]
        facts["arch"] = facts["arch"] or t.get("architecture")
        facts["num_hidden_layers"] = facts["num_hidden_layers"] or t.get("num_hidden_layers")
        facts["source"] = facts["source"] or "drafter manifest"
    if ctx.arch:
        facts["arch"], facts["source"] = ctx.arch, "--arch"
    return facts


# ---------------------------------------------------------------- engine questions (one subprocess)

def ask_engine(ctx: Context, request: dict, timeout: int = 240) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    try:
        proc = engine_subprocess(["batch", f.name], python=ctx.python, site_packages=ctx.site_packages, timeout=timeout)
    finally:
        Path(f.name).unlink(missing_ok=True)
    answers = last_json(proc, f"asking {ctx.stack.engine['name']} in {ctx.python}")
    answers["_stderr_tail"] = proc.stderr.strip().splitlines()[-3:]
    return answers


# ---------------------------------------------------------------- checks

def check_lock(ctx: Context) -> Check:
    if not ctx.lock_path or not ctx.lock_path.is_file():
        return Check("lock-versions", "warn", f"no lock file at {ctx.lock_path}: versions not compared (run `speclock lock`)")
    lock = _read_json(ctx.lock_path, "lock")
    if lock.get("schema") != "speclock.lock/v1" or not isinstance(lock.get("packages"), list):
        raise BadInput(f"{ctx.lock_path}: not a speclock.lock/v1 lock", hint="regenerate it with `speclock lock`")
    hint = "regenerate it with `speclock lock`"
    for i, pkg in enumerate(lock["packages"]):
        expect(pkg, dict, f"packages[{i}]", path=ctx.lock_path, hint=hint)
        expect(pkg.get("name"), str, f"packages[{i}].name", path=ctx.lock_path, hint=hint)
        expect(pkg.get("version"), str, f"packages[{i}].version", path=ctx.lock_path, hint=hint)
    for i, item in enumerate(expect(lock.get("excluded", []), list, "excluded", path=ctx.lock_path, hint=hint)):
        name = item.get("name") if isinstance(item, dict) else item
        expect(name, str, f"excluded[{i}]" + (".name" if isinstance(item, dict) else ""), path=ctx.lock_path, hint=hint)
    answer = ctx.engine_answers.get("dists")
    if not answer or not answer["ok"]:
        return Check("lock-versions", "fail", f"could not list the engine Python's packages: {(answer or {}).get('error', ctx.python_note)}")
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
    have = {norm(k): v for k, v in answer["result"].items()}
    excluded = {norm(n["name"] if isinstance(n, dict) else n) for n in lock.get("excluded", [])}
    wrong, missing = [], []
    for pkg in lock["packages"]:
        name = norm(pkg["name"])
        if name in excluded:
            continue
        if name not in have:
            missing.append(f"{pkg['name']}=={pkg['version']}")
        elif have[name] != pkg["version"]:
            wrong.append(f"{pkg['name']} {have[name]} (lock: {pkg['version']})")
    n = len([p for p in lock["packages"] if norm(p["name"]) not in excluded])
    if wrong or missing:
        parts = ([f"{len(wrong)} differ: " + ", ".join(wrong[:5])] if wrong else []) + \
                ([f"{len(missing)} missing: " + ", ".join(missing[:5])] if missing else [])
        return Check("lock-versions", "fail", "; ".join(parts), {"differ": wrong, "missing": missing})
    return Check("lock-versions", "pass", f"all {n} locked packages have the locked version", {"lock": str(ctx.lock_path)})


def check_import(ctx: Context) -> Check:
    if not ctx.python:
        return Check("engine-import", "fail", ctx.python_note)
    a = ctx.engine_answers.get("import")
    if not a or not a["ok"]:
        return Check("engine-import", "fail", f"import {ctx.stack.engine['name']} failed: {(a or {}).get('error')}")
    r = a["result"]
    pinned = ctx.stack.engine["version"]
    if r["version"] != pinned:
        return Check("engine-import", "fail", f"{ctx.stack.engine['name']} {r['version']} imports, but the stack pins {pinned}", r)
    return Check("engine-import", "pass", f"{ctx.stack.engine['name']} {r['version']} imports from {Path(r['file']).parent}", r)


def check_patches(ctx: Context) -> Check:
    if not ctx.stack.patch_series:
        return Check("patches", "pass", "the stack has no patches")
    if not ctx.site_packages:
        return Check("patches", "fail", f"no engine to check the patches against: {ctx.python_note}")
    patches = load_series(ctx.stack)
    version = installed_version(ctx.site_packages, ctx.stack.engine["package"])
    tree = DirTree(ctx.site_packages)
    failures, results = [], []
    eagle = (ctx.engine_answers.get("patch-eagle3") or {}).get("result", {})
    for p in patches:
        probes = run_static_probes(p, tree)
        for probe in p.runtime_probes:
            for arch in probe[1:]:
                r = eagle.get(arch, {"resolved": False, "eagle3": False, "reason": "engine probe did not answer"})
                probes.append({"probe": f"eagle3-supported {arch}", "passed": bool(r.get("resolved") and r.get("eagle3")),
                               "reason": r.get("reason", "")})
        results.append({"patch": p.name, "probes": probes})
        failures += [f"{p.name}: {pr['probe']}: {pr['reason']}" for pr in probes if not pr["passed"]]
    if failures:
        return Check("patches", "fail", f"{len(failures)} probe(s) fail, first: {failures[0]}",
                     {"engine_version": version, "patches": results})
    return Check("patches", "pass", f"{len(patches)} patch(es) in effect, all {sum(len(r['probes']) for r in results)} probes pass",
                 {"engine_version": version, "patches": results})


def check_eagle3(ctx: Context, facts: dict) -> Check:
    arch = facts["arch"]
    if not arch:
        return Check("eagle3-target", "warn", "target architecture unknown (no target config.json, no drafter manifest): "
                                              "eagle3-target could not run; pass --target or --arch")
    a = ctx.engine_answers.get("eagle3")
    if not a or not a["ok"]:
        return Check("eagle3-target", "fail", f"could not ask the engine: {(a or {}).get('error', ctx.python_note)}")
    r = a["result"][arch]
    if not r.get("resolved"):
        return Check("eagle3-target", "fail", r["reason"], r)
    return Check("eagle3-target", "pass" if r["eagle3"] else "fail", r["reason"], r)


def check_aux_layers(ctx: Context, facts: dict, manifest: dict | None) -> Check:
    name = "aux-layers"
    if not ctx.draft_dir or not ctx.draft_dir.is_dir():
        return Check(name, "warn", f"no drafter folder at {ctx.draft_dir}: aux-layers could not run")
    if manifest is None:
        return Check(name, "warn", f"drafter {ctx.draft_dir} has no {MANIFEST}: aux-layers could not run "
                                   "(it compares the engine's layers with the manifest's aux_layers_after)")
    if not (ctx.draft_dir / "config.json").is_file():
        return Check(name, "fail", f"drafter {ctx.draft_dir} has no config.json")
    read_model_config(ctx.draft_dir, what="drafter")  # its ids go to the engine: their types are checked first
    if not facts["arch"] or not facts["num_hidden_layers"]:
        return Check(name, "warn", "target architecture or layer count unknown: aux-layers could not run")
    a = ctx.engine_answers.get("capture")
    if not a or not a["ok"]:
        return Check(name, "fail", f"the engine could not say which layers it captures: {(a or {}).get('error', ctx.python_note)}")
    r = a["result"]
    if not r.get("ok"):
        return Check(name, "fail", r["reason"], r)
    want = [int(x) for x in manifest["aux_layers_after"]]
    got = r["after_layers"]
    engine = ctx.stack.engine["name"]
    detail = dict(r, manifest_aux_layers_after=want, engine=engine)
    if got == want:
        return Check(name, "pass", f"{engine} feeds the drafter the hidden states after layers {got} "
                                   f"(ids {r['engine_ids']} from the {r['source']}), as trained", detail)
    shift = {g - w for g, w in zip(got, want)} if len(got) == len(want) else set()
    hint = f" (off by {shift.pop():+d}: {engine}'s convention differs from the one the drafter was written for)" if len(shift) == 1 else ""
    return Check(name, "fail", f"{engine} will feed the hidden states after layers {got}, "
                               f"the drafter was trained on {want}{hint}", detail)


def check_gpu_archs(ctx: Context) -> Check:
    targets = ctx.stack.gpu["archs"]
    if not targets:
        return Check("gpu-archs", "skip", "the stack targets no GPU architecture")
    if not ctx.site_packages:
        return Check("gpu-archs", "fail", f"no engine to read kernels from: {ctx.python_note}")
    libs = cuda_arch.engine_libraries(ctx.stack.engine["name"], ctx.site_packages)
    if not libs:
        return Check("gpu-archs", "fail", f"no compiled extensions of {ctx.stack.engine['name']} under {ctx.site_packages}")
    tool = cuda_arch.find_cuobjdump(extra_roots=[ctx.site_packages])
    gaps = cuda_arch.parse_known_gaps(ctx.stack.gpu["known_gaps"])
    rows = cuda_arch.coverage_table(libs, ctx.site_packages, targets, engine=ctx.stack.engine["name"], known_gaps=gaps, tool=tool)
    missing = [f"{r['library']}:{t}" for r in rows for t, c in r["targets"].items() if c["kind"] == "missing"]
    table = cuda_arch.format_table(rows, targets)
    detail = {"targets": targets, "rows": rows, "table": table, "cuobjdump": str(tool)}
    if missing:
        return Check("gpu-archs", "fail", f"{len(missing)} library/arch pair(s) have no SASS or usable PTX: {', '.join(missing[:4])}"
                                          + (" ..." if len(missing) > 4 else ""), detail)
    return Check("gpu-archs", "pass", f"{len(rows)} libraries have code for {', '.join(targets)}", detail)


def kernels_dir() -> Path | None:
    """Where the built kernel library should be: $SPECLOCK_KERNELS_DIR, else the image's folder (in an image)."""
    if os.environ.get("SPECLOCK_KERNELS_DIR"):
        return Path(os.environ["SPECLOCK_KERNELS_DIR"])
    return IMAGE.root / "kernels" if in_image() or IMAGE.lock_file.is_file() else None


def check_kernels(ctx: Context) -> Check:
    if not ctx.stack.kernels:
        return Check("kernels", "skip", "the stack builds no speclock kernels (kernels.build is empty)")
    folder = kernels_dir()
    if folder is None:
        return Check("kernels", "skip", "the kernel library is built into the image (kernels stage): run doctor inside "
                                        "the image, or set SPECLOCK_KERNELS_DIR to a `speclock kernels-build` folder")
    targets = list(ctx.stack.gpu["archs"])
    lib, man_path = folder / kbuild.FP8_LIBRARY, folder / kbuild.MANIFEST
    if not lib.is_file() or not man_path.is_file():
        return Check("kernels", "fail", f"no {kbuild.FP8_LIBRARY} with {kbuild.MANIFEST} in {folder}: the image was built "
                                        "without its kernels stage; rebuild it with `speclock build-image`", {"dir": str(folder)})
    hint = "rebuild the kernel library with `speclock kernels-build` (or the image with `speclock build-image`)"
    man = read_json(man_path, what="kernel library manifest", hint=hint)
    for key, types in (("abi", (int, str)), ("library_sha256", str), ("nvcc", str)):
        if man.get(key) is not None:
            expect(man[key], types, key, path=man_path, hint=hint)
    for i, a in enumerate(expect(man.get("archs", []), list, "archs", path=man_path, hint=hint)):
        expect(a, str, f"archs[{i}]", path=man_path, hint=hint)
    detail: dict = {"dir": str(folder), "manifest": man, "targets": targets}
    problems = []
    if man.get("abi") != kbuild.ABI_VERSION:
        problems.append(f"ABI {man.get('abi')}, speclock needs {kbuild.ABI_VERSION}")
    if man.get("library_sha256") != kbuild._sha256(lib):
        problems.append(f"{kbuild.FP8_LIBRARY} is not the library {kbuild.MANIFEST} describes (sha256 differs)")
    tool = cuda_arch.find_cuobjdump(extra_roots=[ctx.site_packages] if ctx.site_packages else None)
    inv = cuda_arch.inventory(lib, tool=tool)
    rows = cuda_arch.coverage_table([lib], folder, targets, tool=tool)
    detail.update({"rows": rows, "table": cuda_arch.format_table(rows, targets) if rows else "", "cuobjdump": str(tool)})
    missing = [t for t in targets if not rows or rows[0]["targets"][t]["kind"] != "exact"]
    if missing:
        problems.append(f"no cubin for {', '.join(missing)}: the library was not built for this gpu.archs; rebuild the image")
    extra = sorted(set(inv.sass) - set(targets))
    if extra or inv.ptx:
        problems.append(f"code beyond gpu.archs: {', '.join(extra + inv.ptx)}")
    if sorted(man.get("archs", [])) != sorted(targets):
        problems.append(f"{kbuild.MANIFEST} lists {', '.join(man.get('archs', []))}, gpu.archs is {', '.join(targets)}")
    if problems:
        return Check("kernels", "fail", f"{kbuild.FP8_LIBRARY}: " + "; ".join(problems), detail)
    return Check("kernels", "pass", f"{kbuild.FP8_LIBRARY} (nvcc {man.get('nvcc')}) has a cubin for exactly "
                                    f"{', '.join(inv.sass)} and no PTX", detail)


def _cuda_release(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def check_cuda(ctx: Context) -> Check:
    if not ctx.stack.is_gpu:
        return Check("cuda-driver", "skip", "CPU stack: no CUDA runtime to match")
    a = ctx.engine_answers.get("cuda")
    if not a or not a["ok"]:
        return Check("cuda-driver", "fail", f"could not query CUDA: {(a or {}).get('error', ctx.python_note)}")
    r = a["result"]
    if not r.get("available"):
        return Check("cuda-driver", "warn", r["reason"], r)
    rt = r.get("runtime")
    if not rt:
        return Check("cuda-driver", "fail", f"the CUDA runtime library does not load: {r.get('runtime_error', 'unknown')}", r)
    if not r.get("driver"):
        return Check("cuda-driver", "skip", f"no NVIDIA driver (CPU machine): CUDA runtime {_cuda_release(rt)} "
                                            "not matched against a driver; run doctor on the GPU host", r)
    drv = r["driver"]
    if drv // 1000 < rt // 1000:
        return Check("cuda-driver", "fail", f"driver supports CUDA {_cuda_release(drv)}, runtime is {_cuda_release(rt)}: "
                                            "a newer major than the driver, kernels will not load", r)
    notes = []
    status = "pass"
    if drv < rt:
        status, notes = "warn", [f"driver CUDA {_cuda_release(drv)} < runtime {_cuda_release(rt)} (minor-version compatibility only; PTX JIT may fail)"]
    stack_ccs = {cuda_arch.device_cc(t) for t in ctx.stack.gpu["archs"]}
    for g in r["gpus"]:
        cc = tuple(g["cc"])
        if stack_ccs and cc not in stack_ccs:
            status = "fail"
            notes.append(f"GPU {g['index']} {g['name']} is sm_{cc[0]}{cc[1]}, not in the stack's gpu.archs")
    gpus = ", ".join(f"{g['name']} (sm_{g['cc'][0]}{g['cc'][1]})" for g in r["gpus"]) or "no GPU visible"
    return Check("cuda-driver", status, f"runtime {_cuda_release(rt)}, driver {_cuda_release(drv)}; {gpus}"
                 + ("; " + "; ".join(notes) if notes else ""), r)


# ---------------------------------------------------------------- run

def run_doctor(ctx: Context, only: list[str] | None = None, log=None) -> list[Check]:
    selected = [c for c in CHECKS if not only or c in only]
    manifest = load_manifest(ctx.draft_dir)
    if ctx.draft_dir and (ctx.draft_dir / "config.json").is_file():
        read_model_config(ctx.draft_dir, what="drafter")  # before its path goes to the engine probe
    facts = target_facts(ctx, manifest)
    engine = ctx.stack.engine["name"]
    request: dict = {}
    if ctx.python:
        if "engine-import" in selected:
            request["import"] = ["import", [engine]]
        if "lock-versions" in selected:
            request["dists"] = ["dists", []]
        if "eagle3-target" in selected and facts["arch"]:
            request["eagle3"] = ["eagle3", [engine, facts["arch"]]]
        if "patches" in selected and ctx.stack.patch_series:
            archs = sorted({a for p in load_series(ctx.stack) for probe in p.runtime_probes for a in probe[1:]})
            if archs:
                request["patch-eagle3"] = ["eagle3", [engine, *archs]]
        if ("aux-layers" in selected and manifest is not None and facts["arch"] and facts["num_hidden_layers"]
                and ctx.draft_dir and (ctx.draft_dir / "config.json").is_file()):
            args = [engine, facts["arch"], int(facts["num_hidden_layers"]), str(ctx.draft_dir / "config.json")]
            if facts["inner"] and facts["inner"] != facts["arch"]:
                args.append(facts["inner"])
            request["capture"] = ["capture", args]
        if "cuda-driver" in selected and ctx.stack.is_gpu:
            request["cuda"] = ["cuda", []]
        if request:
            if log:
                log(f"asking {engine} in {ctx.python} ({len(request)} questions, one import)")
            ctx.engine_answers = ask_engine(ctx, request)
    runners = {
        "lock-versions": lambda: check_lock(ctx),
        "engine-import": lambda: check_import(ctx),
        "patches": lambda: check_patches(ctx),
        "eagle3-target": lambda: check_eagle3(ctx, facts),
        "aux-layers": lambda: check_aux_layers(ctx, facts, manifest),
        "gpu-archs": lambda: check_gpu_archs(ctx),
        "cuda-driver": lambda: check_cuda(ctx),
        "kernels": lambda: check_kernels(ctx),
    }
    results = []
    for name in selected:
        try:
            results.append(runners[name]())
        except EnvironmentProblem as err:
            results.append(Check(name, "fail", str(err).splitlines()[0]))
    return results


def _cmd_doctor(args: argparse.Namespace) -> int:
    t0 = time.time()
    only = [c.strip() for c in args.only.split(",")] if args.only else None
    for c in only or []:
        if c not in CHECKS:
            raise BadInput(f"--only: unknown check {c!r}", hint=f"checks: {', '.join(CHECKS)}")
    ctx = build_context(args)
    if args.draft:
        # Named on doctor's command line, a drafter without its manifest would only turn aux-layers into a
        # warning and the verdict into a pass: refuse it instead.
        read_drafter_manifest(args.draft, required=True)
    log = None if args.json else (lambda m: print(f"  .. {m}", file=sys.stderr, flush=True))
    results = run_doctor(ctx, only, log=log)
    failed = [r for r in results if r.status == "fail"]
    verdict = "fail" if failed else "pass"
    if args.json:
        print(json.dumps({"schema": DOCTOR_SCHEMA, "stack": ctx.stack.name,
                          "engine": {"name": ctx.stack.engine["name"], "package": ctx.stack.engine["package"],
                                     "version": ctx.stack.engine["version"], "python": ctx.python},
                          "checks": [asdict(r) for r in results], "verdict": verdict,
                          "seconds": round(time.time() - t0, 1)}, indent=2))
    else:
        print(f"speclock doctor: stack {ctx.stack.name}, {ctx.stack.engine['package']} {ctx.stack.engine['version']}"
              f" ({ctx.python_note})")
        for r in results:
            print(f"{r.status.upper():5} {r.name:14} {r.reason}")
            if r.name in ("gpu-archs", "kernels") and r.details.get("table"):
                print(r.details["table"])
        print(f"verdict: {verdict} ({len(failed)} failed, {sum(r.status == 'warn' for r in results)} warnings) "
              f"in {time.time() - t0:.1f} s")
    engine_missing = ctx.python is None and any(c in ENGINE_CHECKS for c in (only or CHECKS))
    if engine_missing:
        if args.json:
            return EnvironmentProblem.exit_code
        raise EnvironmentProblem(f"no Python with {ctx.stack.engine['package']} {ctx.stack.engine['version']}: {ctx.python_note}",
                                 hint="install the engine or pass --python")
    if failed and not args.json:
        raise CheckFailed(f"{len(failed)} doctor check(s) failed: {', '.join(r.name for r in failed)}",
                          hint="each FAIL line above says what is wrong")
    return 1 if failed else 0


def add_commands(sub) -> None:
    p = sub.add_parser("doctor", help="static self-checks of an engine environment (no GPU needed)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", help="check this stack on the host (default inside an image: the image's own)")
    p.add_argument("--python", help="the engine's Python (default: this one if it has the engine, else a cached engine env)")
    p.add_argument("--site-packages", help="engine site-packages to read (default: that of the engine's Python)")
    p.add_argument("--lock", help="lock file (default locks/<stack>.lock, or the image's)")
    p.add_argument("--target", help="target model folder with config.json")
    p.add_argument("--draft", help="drafter folder with config.json and speclock-manifest.json")
    p.add_argument("--arch", help="target architecture, overriding the target's config.json")
    p.add_argument("--only", help=f"comma-separated checks to run: {', '.join(CHECKS)}")
    p.add_argument("--json", action="store_true", help="print a speclock.doctor/v1 JSON report")
    p.set_defaults(func=_cmd_doctor)
