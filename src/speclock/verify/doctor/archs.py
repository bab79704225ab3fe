"""Doctor's GPU code checks: every engine extension has SASS or usable PTX for each stack GPU arch
(gpu-archs, cuobjdump), and the CUDA runtime, driver and visible GPUs fit the stack (cuda-driver)."""

from __future__ import annotations

from pathlib import Path

from speclock.verify import cuda_arch
from speclock.verify.doctor.context import Check, Context, Question
from speclock.verify.doctor.flashinfer_kernels import flashinfer_needs

# Targets whose attention is MLA (SGLang's FlashMLA serves only MLA attention backends).
MLA_ARCH_PREFIXES = ("DeepseekV2", "DeepseekV3", "DeepseekV32", "KimiK2", "KimiK25")


def sglang_attention_backends(ctx: Context, arch: str) -> set[str]:
    """The attention backends SGLang runs on `arch` with the stack's settings: every *attention_backend setting
    (engine.settings + gpu.arch_settings), else SGLang's default for MHA with EAGLE topk 1 (0.5.15:
    srt/server_args.py ServerArgs._get_default_attn_backend; 0.5.23: get_default_attn_backend): fa3 on Hopper,
    trtllm_mha on sm_100/sm_103, flashinfer elsewhere."""
    settings = {
        k: str(v).lower() for k, v in ctx.stack.engine_settings_for(arch).items() if k.endswith("attention_backend") and v
    }
    major, _ = cuda_arch.device_cc(arch)
    default = "fa3" if major == 9 else "trtllm_mha" if major == 10 else "flashinfer"
    # Each phase falls back on attention_backend, then on SGLang's default: naming only the drafter's backend
    # (speculative_draft_attention_backend) leaves the target on the default, whose libraries stay on the path.
    main = settings.get("attention_backend", default)
    prefill, decode = settings.get("prefill_attention_backend", main), settings.get("decode_attention_backend", main)
    return {prefill, decode, settings.get("speculative_draft_attention_backend", decode), *settings.values()}


def sglang_off_path(ctx: Context) -> cuda_arch.OffPath:
    """off_path rule for cuda_arch.coverage_table: libraries SGLang loads only for some attention backends."""
    flashinfer_archs = flashinfer_needs(ctx, True)
    target = (ctx.facts or {}).get("arch") or ""

    def rule(library: str, arch: str) -> str | None:
        backends = sglang_attention_backends(ctx, arch)
        if library.startswith("sgl_kernel/flash_ops") and "fa3" not in backends:
            # srt/layers/attention/flashattention_backend.py (fa3) -> jit_kernel/flash_attention_v3.py -> sgl_kernel.flash_attn
            return (
                f"FA3 (flash_ops) serves only the fa3 attention backend; on {arch} this stack runs {', '.join(sorted(backends))}"
            )
        if (
            library.startswith("sgl_kernel/flashmla_ops")
            and target
            and not target.startswith(MLA_ARCH_PREFIXES)
            and not any("mla" in b for b in backends)
        ):
            return f"FlashMLA serves only MLA attention; the target {target} is not MLA"
        if Path(library).name == "flashinfer_cubin" and arch not in flashinfer_archs:
            return (
                f"FlashInfer's cubins serve its TRT-LLM-gen kernels, which this stack does not run on {arch} "
                f"(attention {', '.join(sorted(backends))}; sampling_backend {ctx.stack.engine_settings_for(arch).get('sampling_backend', 'default')})"
            )
        return None

    return rule


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
    off = sglang_off_path(ctx) if ctx.stack.engine["name"] == "sglang" else None
    rows = cuda_arch.coverage_table(
        libs, ctx.site_packages, targets, engine=ctx.stack.engine["name"], known_gaps=gaps, tool=tool, off_path=off
    )
    missing = [f"{r['library']}:{t}" for r in rows for t, c in r["targets"].items() if c["kind"] == "missing"]
    table = cuda_arch.format_table(rows, targets)
    detail = {"targets": targets, "rows": rows, "table": table, "cuobjdump": str(tool)}
    if missing:
        return Check(
            "gpu-archs",
            "fail",
            f"{len(missing)} library/arch pair(s) have no SASS or usable PTX: {', '.join(missing[:4])}"
            + (" ..." if len(missing) > 4 else ""),
            detail,
        )
    return Check("gpu-archs", "pass", f"{len(rows)} libraries have code for {', '.join(targets)}", detail)


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
        return Check(
            "cuda-driver",
            "skip",
            f"no NVIDIA driver (CPU machine): CUDA runtime {_cuda_release(rt)} "
            "not matched against a driver; run doctor on the GPU host",
            r,
        )
    drv = r["driver"]
    if drv // 1000 < rt // 1000:
        return Check(
            "cuda-driver",
            "fail",
            f"driver supports CUDA {_cuda_release(drv)}, runtime is {_cuda_release(rt)}: "
            "a newer major than the driver, kernels will not load",
            r,
        )
    notes = []
    status = "pass"
    if drv < rt:
        status, notes = (
            "warn",
            [
                f"driver CUDA {_cuda_release(drv)} < runtime {_cuda_release(rt)} (minor-version compatibility only; PTX JIT may fail)"
            ],
        )
    stack_ccs = {cuda_arch.device_cc(t) for t in ctx.stack.gpu["archs"]}
    for g in r["gpus"]:
        cc = tuple(g["cc"])
        if stack_ccs and cc not in stack_ccs:
            status = "fail"
            notes.append(f"GPU {g['index']} {g['name']} is sm_{cc[0]}{cc[1]}, not in the stack's gpu.archs")
    gpus = ", ".join(f"{g['name']} (sm_{g['cc'][0]}{g['cc'][1]})" for g in r["gpus"]) or "no GPU visible"
    return Check(
        "cuda-driver",
        status,
        f"runtime {_cuda_release(rt)}, driver {_cuda_release(drv)}; {gpus}" + ("; " + "; ".join(notes) if notes else ""),
        r,
    )


class GpuArchs:
    name = "gpu-archs"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {}  # read from the engine's files (cuobjdump), not asked

    def run(self, ctx: Context) -> Check:
        return check_gpu_archs(ctx)


class CudaDriver:
    name = "cuda-driver"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {"cuda": ["cuda", []]} if ctx.stack.is_gpu else {}

    def run(self, ctx: Context) -> Check:
        return check_cuda(ctx)
