"""Doctor's flashinfer-kernels check: on every stack GPU arch where the engine will run FlashInfer, the
image holds FlashInfer's precompiled kernels for that arch, at flashinfer-python's exact version.

Without them (and without nvcc and a network at run time) FlashInfer cannot build or fetch its kernels.
They come in separate wheels: `flashinfer-cubin` (loose TRT-LLM-gen cubins under flashinfer_cubin/cubins,
the arch in each name, e.g. fmhaSm100fKernel_*.cubin; 0.6.13 holds sm_100a, sm_100f and sm_103a only) and
`flashinfer-jit-cache` (the JIT modules prebuilt as .so files; from 0.7 a shim plus one provider
distribution per arch, `flashinfer-jit-cache-sm100a`). FlashInfer ignores a cubin wheel whose version is
not exactly its own and a jit-cache wheel that is not its own version (+ a CUDA local part).

Where the engine runs FlashInfer on an arch (read in the engines' source):
  - the stack says so: an `*attention_backend` setting (engine.settings merged with gpu.arch_settings)
    naming flashinfer, or SGLang's trtllm_* backends (FlashInfer's TRT-LLM-gen kernels);
  - vLLM's default: on sm_100/sm_103 (major 10) its attention picks FLASHINFER (FLASHINFER_MLA for MLA)
    first (vllm/platforms/cuda.py, _get_backend_priorities, 0.33.0; major 12 prefers FLASH_ATTN), and
    from 0.26.0 its top-k/top-p sampler runs FlashInfer on every CUDA arch >= sm_80 when flashinfer is
    installed unless engine.env sets VLLM_USE_FLASHINFER_SAMPLER=0
    (vllm/v1/sample/ops/topk_topp_sampler.py, flashinfer_sampler_supported);
  - SGLang's default (sglang/srt/arg_groups/model_override_base.py, get_default_attn_backend, 0.5.23):
    Hopper MHA -> fa3 (sgl_kernel), Hopper MLA -> fa3; sm_100/sm_103 MHA -> trtllm_mha (FlashInfer's
    TRT-LLM-gen kernels), MLA -> flashinfer; other archs (sm_120) -> flashinfer when it is installed,
    else triton.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NotRequired, TypedDict

from speclock.core.names import normalize
from speclock.core.versions import in_range, parse_range
from speclock.verify import cuda_arch
from speclock.verify.doctor.context import Check, Context, Question

CUBIN, JIT = "flashinfer-cubin", "flashinfer-jit-cache"
_PROVIDER = re.compile(r"^flashinfer-jit-cache-sm(\d{2,3}[af]?)$")
KERNELS_INDEX = "https://flashinfer.ai/whl"


class KernelWheel(TypedDict):
    """A FlashInfer kernel wheel installed next to flashinfer (kernel_wheels)."""

    version: str
    inventory: cuda_arch.Inventory  # empty when its files are absent
    providers: NotRequired[list[str]]  # flashinfer-jit-cache: the per-arch provider wheels of its version


class ArchCell(TypedDict):
    why: str  # why the engine runs FlashInfer on this arch
    covered_by: dict[str, str | None]  # usable wheel -> the SASS or PTX arch that serves it


def _uses_flashinfer(value: object) -> bool:
    v = str(value).lower()
    return "flashinfer" in v or v.startswith("trtllm")


def flashinfer_needs(ctx: Context, fi_installed: bool) -> dict[str, str]:
    """{arch: why the engine runs FlashInfer there} for the stack's GPU archs."""
    stack, engine = ctx.stack, ctx.stack.engine
    env = stack.engine_env
    out: dict[str, str] = {}
    for arch in stack.gpu["archs"]:
        settings = stack.engine_settings_for(arch)
        backends = {k: v for k, v in settings.items() if k.endswith("attention_backend") and v}
        named = [f"{k} = {v!r}" for k, v in backends.items() if _uses_flashinfer(v)]
        major, _ = cuda_arch.device_cc(arch)
        reasons = []
        if named:
            where = "gpu.arch_settings" if stack.gpu["arch_settings"].get(arch) else "engine.settings"
            reasons.append(f"{where} sets {', '.join(named)}")
        # the engine's own default attention backend, wherever no setting names the target's (naming only the
        # drafter's, SGLang's speculative_draft_attention_backend, leaves the target on the default)
        if not set(backends) & {"attention_backend", "prefill_attention_backend", "decode_attention_backend"}:
            if engine["name"] == "vllm" and major == 10:
                reasons.append("vLLM's default attention on sm_100/sm_103 is FLASHINFER")
            if engine["name"] == "sglang" and major == 10:
                reasons.append("SGLang's default attention on sm_100/sm_103 is trtllm_mha (FlashInfer's kernels)")
            if engine["name"] == "sglang" and major not in (9, 10) and fi_installed:
                reasons.append("SGLang's default attention there is flashinfer (installed)")
        if (
            engine["name"] == "vllm"
            and fi_installed
            and env.get("VLLM_USE_FLASHINFER_SAMPLER") != "0"
            and major >= 8
            and _version_at_least(engine["version"], "0.26.0")
        ):
            reasons.append("vLLM's top-k/top-p sampler runs FlashInfer (VLLM_USE_FLASHINFER_SAMPLER is not 0)")
        if reasons:
            out[arch] = "; ".join(reasons)
    return out


def _version_at_least(version: str, floor: str) -> bool:
    try:
        return in_range(version, parse_range(f">={floor}"))
    except ValueError:
        return True  # a version that does not order: assume the newer behaviour


def kernel_wheels(site: Path | None, dists: dict[str, str], tool: Path | None = None) -> dict[str, KernelWheel]:
    """The kernel wheels installed next to flashinfer: {wheel: {version, inventory}} (inventory None = absent)."""
    have = {normalize(k): v for k, v in dists.items()}
    out: dict[str, KernelWheel] = {}
    if CUBIN in have:
        folder = Path(site) / "flashinfer_cubin" if site else None
        inv = cuda_arch.cubin_folder_inventory(folder) if folder and folder.is_dir() else cuda_arch.Inventory("", [], [])
        out[CUBIN] = {"version": have[CUBIN], "inventory": inv}
    if JIT in have:
        providers = sorted(f"sm_{m[1]}" for name in have if (m := _PROVIDER.match(name)) and have[name] == have[JIT])
        sass: set[str] = set(providers)
        ptx: set[str] = set()
        if not providers and site:  # one wheel for all archs (before 0.7): read its modules
            for root in sorted(Path(site).glob("flashinfer_jit_cache*")):
                for so in sorted(root.rglob("*.so")):
                    inv = cuda_arch.inventory(so, tool=tool or cuda_arch.find_cuobjdump(extra_roots=[site]))
                    sass.update(inv.sass)
                    ptx.update(inv.ptx)
        key = cuda_arch._sort_key
        out[JIT] = {
            "version": have[JIT],
            "providers": providers,
            "inventory": cuda_arch.Inventory("", sorted(sass, key=key), sorted(ptx, key=key)),
        }
    return out


def _matches(wheel: str, version: str, fi_version: str) -> bool:
    return version == fi_version or (wheel == JIT and version.startswith(f"{fi_version}+"))


def decide(ctx: Context, needs: dict[str, str], fi_version: str | None, wheels: dict[str, KernelWheel]) -> Check:
    """The verdict from what the engine needs and what the kernel wheels hold (no I/O: tested with fakes)."""
    if not needs:
        why = "flashinfer is not installed and" if not fi_version else f"flashinfer {fi_version} is installed, but"
        return Check(
            "flashinfer-kernels",
            "skip",
            f"{why} the engine runs no FlashInfer kernel on {', '.join(ctx.stack.gpu['archs'])} with this stack's settings",
        )
    cuda = (ctx.stack.gpu.get("cuda") or "").replace(".", "")
    if not fi_version:
        return Check(
            "flashinfer-kernels",
            "fail",
            "flashinfer-python is not installed, but the engine runs FlashInfer: "
            + "; ".join(f"{a}: {r}" for a, r in needs.items())
            + "; lock flashinfer-python with its kernels (flashinfer-cubin, python.extra), or set another "
            "attention_backend in gpu.arch_settings",
            {"needs": needs},
        )
    notes, usable = [], {}
    for wheel, info in wheels.items():
        if _matches(wheel, info["version"], fi_version):
            usable[wheel] = info["inventory"]
        else:
            notes.append(f"{wheel} {info['version']} is ignored by flashinfer {fi_version} (versions differ)")
    cells: dict[str, ArchCell] = {}
    missing = []
    for arch, why in needs.items():
        via = {w: cuda_arch.coverage(inv, arch) for w, inv in usable.items()}
        ok = {w: c for w, c in via.items() if c["kind"] != "missing"}
        cells[arch] = {"why": why, "covered_by": {w: c["via"] for w, c in ok.items()}}
        if not ok:
            missing.append(arch)
    detail = {
        "flashinfer": fi_version,
        "needs": needs,
        "archs": cells,
        "wheels": {
            w: {"version": i["version"], "sass": i["inventory"].sass, "ptx": i["inventory"].ptx} for w, i in wheels.items()
        },
    }
    if missing:
        jit = f"{JIT}=={fi_version}+cu{cuda}" if cuda else f"{JIT}=={fi_version}+cuXYZ"
        reasons = "; ".join(f"{a}: {needs[a]}" for a in missing)
        return Check(
            "flashinfer-kernels",
            "fail",
            f"no precompiled FlashInfer kernels for {', '.join(missing)} ({reasons})"
            + (f"; {'; '.join(notes)}" if notes else "")
            + f"; lock flashinfer-cubin=={fi_version} (python.extra), and {jit} for archs its cubins lack "
            f"(FlashInfer publishes both on {KERNELS_INDEX}; `flashinfer download-kernels --dry-run` "
            "prints the exact requirements)",
            detail,
        )
    covered = ", ".join(f"{a} ({'/'.join(f'{w} {v}' for w, v in c['covered_by'].items())})" for a, c in cells.items())
    return Check(
        "flashinfer-kernels",
        "pass",
        f"flashinfer {fi_version}: precompiled kernels for {covered}" + (f"; {'; '.join(notes)}" if notes else ""),
        detail,
    )


def check_flashinfer_kernels(ctx: Context) -> Check:
    if not ctx.stack.is_gpu or not ctx.stack.gpu["archs"]:
        return Check("flashinfer-kernels", "skip", "CPU stack: FlashInfer runs only on the GPU path")
    a = ctx.engine_answers.get("dists")
    if not a or not a["ok"]:
        return Check(
            "flashinfer-kernels",
            "fail",
            f"could not list the engine Python's packages: {(a or {}).get('error', ctx.python_note)}",
        )
    dists = {normalize(k): v for k, v in a["result"].items()}
    fi_version = dists.get("flashinfer-python") or dists.get("flashinfer")
    needs = flashinfer_needs(ctx, bool(fi_version))
    wheels = kernel_wheels(ctx.site_packages, dists) if needs and fi_version else {}
    return decide(ctx, needs, fi_version, wheels)


class FlashInferKernels:
    name = "flashinfer-kernels"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {"dists": ["dists", []]} if ctx.stack.is_gpu else {}

    def run(self, ctx: Context) -> Check:
        return check_flashinfer_kernels(ctx)
