"""Correctness and speed of speclock's kernels on a CUDA GPU, in one run.

    PYTHONPATH=src python benchmarks/kernels_bench.py --out DIR [--quick] [--budget-s 420]

1. The ceilings: device-to-device copy bandwidth and a bf16 8192^3 GEMM rate.
2. fp8 pack/unpack: codes and scales bit-exact against the PyTorch reference (computed on the
   same GPU and, for small shapes, on the CPU), fresh random inputs per shape, outputs poisoned
   with NaN codes before each call; then time and peak extra memory against eager PyTorch and
   torch.compile of the reference.
3. The fused EAGLE-3 loss: loss, top-1 count and both gradients against a float64 reference
   (fresh inputs, the allocator's cache poisoned with NaN first), then fwd+bwd time and peak
   extra memory against eager PyTorch, torch.compile of it, and liger-kernel's
   LigerFusedLinearJSD(jsd_beta=0.0) when it is importable.
Writes DIR/kernels_bench.json (rewritten after every section) and prints a table at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from speclock.kernels import eagle3_loss, fp8_cuda, fp8_pack, fp8_unpack
from speclock.kernels import eagle3_triton as e3
from speclock.kernels.reference import eagle3_loss_eager, fp8_pack_reference, fp8_unpack_reference

T0 = time.time()
RESULT: dict = {"sections": {}}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def save(out: Path) -> None:
    tmp = out / "kernels_bench.json.tmp"
    tmp.write_text(json.dumps(RESULT, indent=2, default=str))
    os.replace(tmp, out / "kernels_bench.json")


def time_ms(fn, warmup=3, iters=10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def time_ms_batched(fn, reps=20, iters=7) -> float:
    """Per-call time of back-to-back calls: keeps the GPU busy, so host overhead of short kernels
    (tens of microseconds of Python and launch) hides behind the previous call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def peak_extra_bytes(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def poison_allocator(nbytes: int) -> None:
    """Fill free cached blocks with NaN so outputs that are never written show up as NaN."""
    x = torch.full((nbytes // 4,), float("nan"), device="cuda")
    del x


def ceilings() -> dict:
    n = 1 << 30  # 2 GiB of bf16
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = time_ms(lambda dst=dst, src=src: dst.copy_(src), warmup=3, iters=20)
    copy_tbs = 2 * src.numel() * 2 / ms / 1e9
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms_mm = time_ms(lambda: a @ b, warmup=3, iters=10)
    res = {"copy_TBps": copy_tbs, "gemm_bf16_8192_TFLOPs": 2 * 8192**3 / ms_mm / 1e9}
    log(f"ceilings: {res}")
    return res


def loss_breakdown(T=16384, H=7168, V=32000, C=4096) -> dict:
    """Each piece of the fused loss alone, and the three full-size cuBLAS GEMMs (the floor here)."""
    h = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(V, H, device="cuda") / math.sqrt(H) * 4).to(torch.bfloat16)
    p = torch.softmax(torch.randn(T, V, device="cuda"), -1).to(torch.bfloat16)
    g_full = torch.randn(T, V, device="cuda", dtype=torch.bfloat16)
    res = {"T": T, "H": H, "V": V, "chunk": C}
    res["gemm_logits_full_ms"] = time_ms(lambda: h @ w.t())
    res["gemm_dh_full_ms"] = time_ms(lambda g_full=g_full: g_full @ w)
    res["gemm_dw_full_ms"] = time_ms(lambda g_full=g_full: g_full.t() @ h)
    res["three_gemms_full_ms"] = res["gemm_logits_full_ms"] + res["gemm_dh_full_ms"] + res["gemm_dw_full_ms"]
    res["three_gemms_TFLOPs"] = 3 * 2 * T * H * V / res["three_gemms_full_ms"] / 1e9
    del g_full
    hc = h[:C]
    g = torch.randn(C, V, device="cuda", dtype=torch.bfloat16)
    n = T // C
    res["chunk_logits_f32_ms_x_chunks"] = n * time_ms(lambda: e3._logits_f32(hc, w))
    logits = e3._logits_f32(hc, w)
    lr = torch.empty(C, device="cuda")
    hits = torch.empty(C, device="cuda", dtype=torch.int32)
    res["chunk_row_kernel_ms_x_chunks"] = n * time_ms(lambda: e3._launch_rows(logits, p[:C], None, g, lr, hits, False))
    dh = torch.empty(C, H, device="cuda", dtype=torch.bfloat16)
    res["chunk_dh_ms_x_chunks"] = n * time_ms(lambda: torch.mm(g, w, out=dh))
    dw32 = torch.zeros(V, H, device="cuda")
    res["chunk_dw_f32_first_ms_x_chunks"] = n * time_ms(lambda: e3._accumulate_dw(dw32, g, hc, True))
    res["chunk_dw_f32_accum_ms_x_chunks"] = n * time_ms(lambda: e3._accumulate_dw(dw32, g, hc, False))
    dwb = torch.zeros(V, H, device="cuda", dtype=torch.bfloat16)
    res["chunk_dw_bf16_accum_ms_x_chunks"] = n * time_ms(lambda: e3._accumulate_dw(dwb, g, hc, False))
    res["dw_f32_to_bf16_ms"] = time_ms(lambda: dw32.to(torch.bfloat16))
    res["mm_dtype_ok"] = e3._MM_DTYPE_OK[0]
    res["addmm_dtype_ok"] = e3._ADDMM_DTYPE_OK[0]
    log(f"breakdown: {json.dumps(res)}")
    return res


# ---------------------------------------------------------------- fp8


def fp8_inputs(T, H, gen):
    # rows of very different magnitudes, one all-zero row, a few outliers
    mag = torch.pow(10.0, torch.empty(T, 1, device="cuda").uniform_(-3, 3, generator=gen))
    x = torch.randn(T, H, device="cuda", generator=gen) * mag
    if T > 2:
        x[1] = 0
        x[2, H // 3] *= 50
    return x.to(torch.bfloat16)


def fp8_correctness(gen) -> list[dict]:
    shapes = [
        (1, 8),
        (3, 7),
        (2, 12),
        (5, 24),
        (257, 4096),
        (1000, 7168),
        (64, 21504),
        (33, 12288),
        (7, 40000),
        (4, 65536),
        (3, 70000),
        (129, 5000),
    ]
    rows = []
    for T, H in shapes:
        x = fp8_inputs(T, H, gen)
        qr, sr = fp8_pack_reference(x)
        code_mismatch = scale_mismatch = 0
        for variant in (1, 2, 3, 4, 5, 0):  # every kernel; the auto choice last, its output used below
            q = torch.full((T, H), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)  # NaN codes
            s = torch.full((T,), float("nan"), device="cuda")
            fp8_cuda.pack(x, q, s, variant=variant)
            code_mismatch += int((q.view(torch.uint8) != qr.view(torch.uint8)).sum())
            scale_mismatch += int((s != sr).sum())
        cpu_mismatch = None
        if T * H <= 1 << 20:
            qc, sc = fp8_pack_reference(x.cpu())
            cpu_mismatch = int((q.view(torch.uint8).cpu() != qc.view(torch.uint8)).sum()) + int((s.cpu() != sc).sum())
        row = {
            "T": T,
            "H": H,
            "code_mismatches": code_mismatch,
            "scale_mismatches": scale_mismatch,
            "cpu_reference_mismatches": cpu_mismatch,
        }
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            y = torch.full((T, H), float("nan"), dtype=dt, device="cuda")
            fp8_cuda.unpack(q, s, dt, out=y)
            yr = fp8_unpack_reference(q, s, dt)
            row[f"unpack_{str(dt)[6:]}_mismatches"] = int((y.view(-1) != yr.view(-1)).sum()) + int(torch.isnan(y).sum())
        y = fp8_cuda.unpack(q, s, torch.float32)
        nz = x.float().abs().amax(1) > 0
        rel = ((y - x.float()).norm(dim=1)[nz] / x.float().norm(dim=1)[nz]).max().item() if nz.any() else 0.0
        row["roundtrip_max_row_rel_err"] = rel
        row["ok"] = (
            code_mismatch == 0
            and scale_mismatch == 0
            and not cpu_mismatch
            and all(v == 0 for k, v in row.items() if k.startswith("unpack_"))
            and rel < 0.04
        )
        rows.append(row)
        log(f"fp8 check {T}x{H}: {'ok' if row['ok'] else 'FAIL ' + json.dumps(row)}")
    return rows


def fp8_speed(shapes, compile_ok: bool) -> list[dict]:
    rows = []
    pack_c = torch.compile(fp8_pack_reference, dynamic=False) if compile_ok else None
    unpack_c = torch.compile(fp8_unpack_reference, dynamic=False) if compile_ok else None
    for T, H in shapes:
        rows += fp8_speed_shape(T, H, pack_c, unpack_c, compile_ok)  # its tensors are freed when it returns
        torch.cuda.empty_cache()
    return rows


def fp8_speed_shape(T, H, pack_c, unpack_c, compile_ok: bool) -> list[dict]:
    rows = []
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    q, s = fp8_pack(x)
    pack_bytes = T * H * 2 + T * H + T * 4
    unpack_bytes = T * H + T * 4 + T * H * 2
    impls = {
        "speclock_cuda": (lambda: fp8_pack(x), lambda: fp8_unpack(q, s)),
        "speclock_v1_regs": (lambda: fp8_cuda.pack(x, variant=1), None),
        "speclock_v2_2pass256": (lambda: fp8_cuda.pack(x, variant=2), None),
        "speclock_v5_2pass512": (lambda: fp8_cuda.pack(x, variant=5), None),
        "eager": (lambda: fp8_pack_reference(x), lambda: fp8_unpack_reference(q, s)),
        "torch_compile": (lambda: pack_c(x), lambda: unpack_c(q, s, torch.bfloat16)) if compile_ok else None,
    }
    for name, fns in impls.items():
        if fns is None:
            continue
        for op, fn, nbytes in (("pack", fns[0], pack_bytes), ("unpack", fns[1], unpack_bytes)):
            if fn is None:
                continue
            try:
                t0 = time.time()
                ms = time_ms_batched(fn)
                ms_single = time_ms(fn, warmup=1, iters=10)
                mem = peak_extra_bytes(fn)
                rows.append(
                    {
                        "op": op,
                        "impl": name,
                        "T": T,
                        "H": H,
                        "ms": ms,
                        "TBps": nbytes / ms / 1e9,
                        "ms_single_call": ms_single,
                        "peak_extra_GB": mem / 1e9,
                        "wall_s": time.time() - t0,
                    }
                )
                log(f"fp8 {op:6s} {name:14s} {T}x{H}: {ms:.3f} ms {nbytes / ms / 1e9:.2f} TB/s extra {mem / 1e9:.2f} GB")
            except Exception as err:
                rows.append({"op": op, "impl": name, "T": T, "H": H, "error": repr(err)[:500]})
                log(f"fp8 {op} {name} {T}x{H}: ERROR {err!r}"[:300])
    return rows


# ---------------------------------------------------------------- loss


def loss_inputs(T, H, V, gen, dtype=torch.bfloat16):
    h = (torch.randn(T, H, device="cuda", generator=gen) * 1.0).to(dtype)
    w = (torch.randn(V, H, device="cuda", generator=gen) / math.sqrt(H) * 4).to(dtype)
    # a target that agrees with the drafter on some tokens and not others
    tl = (h.float() @ w.float().t()) * 0.5 + torch.randn(T, V, device="cuda", generator=gen) * 2
    p = torch.softmax(tl, dim=-1)
    return h, w, p


def loss_reference64(h, w, p, mask):
    hd = h.detach().double().requires_grad_()
    wd = w.detach().double().requires_grad_()
    logits = hd @ wd.t()
    per = -(p.double() * torch.log_softmax(logits, -1)).sum(-1)
    valid = torch.ones_like(per) if mask is None else mask.double()
    loss = (per * valid).sum() / valid.sum().clamp_min(1)
    loss.backward()
    hits = ((logits.argmax(-1) == p.argmax(-1)).long() * valid.long()).sum()
    return loss.item(), int(hits), hd.grad, wd.grad


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def loss_correctness(gen) -> list[dict]:
    cases = [
        (300, 64, 1000, True, 128),
        (1000, 512, 3000, True, 256),
        (2048, 1024, 32000, False, None),
        (4096, 4096, 32000, True, None),
        (513, 256, 4097, True, 100),
    ]
    rows = []
    for T, H, V, use_mask, chunk in cases:
        h, w, p = loss_inputs(T, H, V, gen)
        mask = (torch.rand(T, device="cuda", generator=gen) > 0.25) if use_mask else None
        poison_allocator(4 << 30)
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss, correct = eagle3_loss(hh, ww, p, mask, chunk_tokens=chunk)
        loss.backward()
        lr, cr, ghr, gwr = loss_reference64(h, w, p, mask)
        n_valid = T if mask is None else int(mask.sum())
        row = {
            "T": T,
            "H": H,
            "V": V,
            "mask": use_mask,
            "chunk": chunk,
            "loss": loss.item(),
            "loss_ref": lr,
            "loss_rel_err": abs(loss.item() - lr) / abs(lr),
            "correct": int(correct),
            "correct_ref": cr,
            "n_valid": n_valid,
            "grad_hidden_rel_err": rel(hh.grad, ghr),
            "grad_weight_rel_err": rel(ww.grad, gwr),
            "grads_finite": bool(torch.isfinite(hh.grad).all() and torch.isfinite(ww.grad).all()),
        }
        if mask is not None:
            row["masked_rows_grad_zero"] = bool((hh.grad[~mask] == 0).all())
        row["ok"] = (
            row["loss_rel_err"] < 1e-3
            and row["grad_hidden_rel_err"] < 1e-2
            and row["grad_weight_rel_err"] < 1e-2
            and abs(row["correct"] - cr) <= max(2, n_valid // 500)
            and row["grads_finite"]
            and row.get("masked_rows_grad_zero", True)
        )
        rows.append(row)
        log(
            f"loss check {T}x{H}x{V}: {'ok' if row['ok'] else 'FAIL'} "
            + json.dumps({k: row[k] for k in row if "err" in k or "correct" in k})
        )
        del h, w, p, hh, ww, ghr, gwr
        torch.cuda.empty_cache()
    return rows


def liger_vs_ours(gen, T=4096, H=4096, V=32000) -> dict:
    """Same gradient: liger's forward KL against our soft cross-entropy on target = softmax(teacher)."""
    from liger_kernel.transformers import LigerFusedLinearJSD

    h, w, _ = loss_inputs(T, H, V, gen)
    th = torch.randn(T, H, device="cuda", generator=gen, dtype=torch.bfloat16)
    tw = (torch.randn(V, H, device="cuda", generator=gen) / math.sqrt(H) * 4).to(torch.bfloat16)
    p = torch.softmax((th @ tw.t()).float(), -1)
    a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
    LigerFusedLinearJSD(jsd_beta=0.0)(a, b, th, tw, None).backward()
    c, d = h.clone().requires_grad_(), w.clone().requires_grad_()
    eagle3_loss(c, d, p)[0].backward()
    return {"grad_hidden_rel_diff": rel(c.grad, a.grad), "grad_weight_rel_diff": rel(d.grad, b.grad)}


def loss_speed(shapes, compile_shapes, have_liger: bool, budget_end: float) -> list[dict]:
    rows = []
    liger = None
    if have_liger:
        from liger_kernel.transformers import LigerFusedLinearJSD

        liger = LigerFusedLinearJSD(jsd_beta=0.0)
    compiled = torch.compile(eagle3_loss_eager, dynamic=False)
    for T, H, V in shapes:
        rows += loss_speed_shape(T, H, V, compiled, (T, H, V) in compile_shapes, liger, budget_end)  # frees its tensors
        torch.cuda.empty_cache()
    return rows


def loss_speed_shape(T, H, V, compiled, with_compile: bool, liger, budget_end: float) -> list[dict]:
    rows = []
    have_liger = liger is not None
    gen = torch.Generator(device="cuda").manual_seed(T + H + V)
    h = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    w = (torch.randn(V, H, device="cuda", generator=gen) / math.sqrt(H) * 4).to(torch.bfloat16).requires_grad_()
    p = torch.softmax(torch.randn(T, V, device="cuda", generator=gen), -1).to(torch.bfloat16)
    th = tw = None
    if have_liger:
        th = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
        tw = (torch.randn(V, H, device="cuda", generator=gen) / math.sqrt(H) * 4).to(torch.bfloat16)
    flop3 = 3 * 2 * T * H * V

    def step(fn):
        def run():
            h.grad = None
            w.grad = None
            out = fn()
            (out[0] if isinstance(out, tuple) else out).backward()

        return run

    def accum(kind, fn):
        def run():
            e3.DW_ACCUM[0] = kind
            try:
                return fn()
            finally:
                e3.DW_ACCUM[0] = "float32"

        return run

    def separate(fn):
        def run():
            e3.INPLACE_GRAD[0] = False
            try:
                return fn()
            finally:
                e3.INPLACE_GRAD[0] = True

        return run

    impls = [
        ("speclock_triton", step(lambda: eagle3_loss(h, w, p)), flop3),
        ("speclock_separate_grad_buf", step(separate(lambda: eagle3_loss(h, w, p))), flop3),
        ("speclock_chunk8192_bf16acc", step(accum("weight", lambda: eagle3_loss(h, w, p, chunk_tokens=8192))), flop3),
        ("eager", step(lambda: eagle3_loss_eager(h, w, p)), flop3),
    ]
    if with_compile:
        impls.append(("torch_compile", step(lambda: compiled(h, w, p)), flop3))
    if have_liger:
        impls.append(("liger_jsd_beta0", step(lambda: liger(h, w, th, tw, None)), 4 * 2 * T * H * V))
    for name, fn, flops in impls:
        if time.time() > budget_end and not name.startswith("speclock"):
            rows.append({"impl": name, "T": T, "H": H, "V": V, "skipped": "time budget"})
            continue
        try:
            t0 = time.time()
            fn()  # compile / autotune outside the timed region
            setup = time.time() - t0
            ms = time_ms(fn, warmup=2, iters=15)
            h.grad = w.grad = None
            mem = peak_extra_bytes(fn)
            rows.append(
                {
                    "impl": name,
                    "T": T,
                    "H": H,
                    "V": V,
                    "ms": ms,
                    "peak_extra_GB": mem / 1e9,
                    "gemm_flops": flops,
                    "achieved_TFLOPs": flops / ms / 1e9,
                    "model_TFLOPs_3gemm": flop3 / ms / 1e9,
                    "first_call_s": setup,
                }
            )
            log(
                f"loss {name:16s} {T}x{H}x{V}: {ms:.2f} ms, extra {mem / 1e9:.2f} GB, "
                f"{flops / ms / 1e9:.0f} TFLOP/s ({flops // (2 * T * H * V)} GEMMs), first call {setup:.1f}s"
            )
        except Exception as err:
            rows.append({"impl": name, "T": T, "H": H, "V": V, "error": repr(err)[:500]})
            log(f"loss {name} {T}x{H}x{V}: ERROR {err!r}"[:300])
        h.grad = w.grad = None
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--quick", action="store_true", help="small shapes only (a smoke run)")
    ap.add_argument("--budget-s", type=float, default=420, help="skip baselines once this much time has passed")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget_end = T0 + args.budget_s
    props = torch.cuda.get_device_properties(0)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        liger_version = version("liger-kernel")
    except Exception:
        liger_version = None
    RESULT["env"] = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "liger_kernel": liger_version,
        "fp8_library": str(fp8_cuda._candidate_dirs()),
        "kernels_dir": os.environ.get("SPECLOCK_KERNELS_DIR"),
        "driver": subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip(),
    }
    log(json.dumps(RESULT["env"]))
    gen = torch.Generator(device="cuda").manual_seed(int(time.time()))  # fresh inputs every run
    ok = True
    steps = [
        ("ceilings", lambda: ceilings()),
        ("fp8_correctness", lambda: fp8_correctness(gen)),
        ("loss_correctness", lambda: loss_correctness(gen)),
        ("loss_breakdown", lambda: loss_breakdown()),
        ("liger_gradient_agreement", lambda: liger_vs_ours(gen) if liger_version else {"skipped": "no liger"}),
        (
            "fp8_speed",
            lambda: fp8_speed(
                [(8192, 4096), (16384, 7168)] if args.quick else [(8192, 4096), (16384, 7168), (32768, 21504), (65536, 12288)],
                True,
            ),
        ),
        (
            "loss_speed",
            lambda: loss_speed(
                [(8192, 4096, 32000)]
                if args.quick
                else [(16384, 7168, 32000), (8192, 4096, 32000), (32768, 4096, 32000), (32768, 7168, 32000)],
                {(8192, 4096, 32000), (16384, 7168, 32000)},
                bool(liger_version),
                budget_end,
            ),
        ),
    ]
    for name, fn in steps:
        log(f"== {name}")
        try:
            RESULT["sections"][name] = fn()
        except Exception:
            RESULT["sections"][name] = {"error": traceback.format_exc()[-3000:]}
            log(traceback.format_exc())
            ok = False
        save(out)
    for name in ("fp8_correctness", "loss_correctness"):
        sec = RESULT["sections"].get(name)
        if not isinstance(sec, list) or not all(r["ok"] for r in sec):
            ok = False
    RESULT["all_checks_ok"] = ok
    RESULT["wall_s"] = time.time() - T0
    save(out)
    log(f"== summary: checks {'PASS' if ok else 'FAIL'}")
    for r in RESULT["sections"].get("fp8_speed", []) if isinstance(RESULT["sections"].get("fp8_speed"), list) else []:
        if "ms" in r:
            print(
                f"fp8 {r['op']:6s} {r['impl']:14s} {r['T']:6d}x{r['H']:<6d} {r['ms']:8.3f} ms {r['TBps']:5.2f} TB/s {r['peak_extra_GB']:6.2f} GB"
            )
    for r in RESULT["sections"].get("loss_speed", []) if isinstance(RESULT["sections"].get("loss_speed"), list) else []:
        if "ms" in r:
            print(
                f"loss {r['impl']:16s} {r['T']:6d}x{r['H']}x{r['V']} {r['ms']:8.2f} ms {r['peak_extra_GB']:6.2f} GB {r['achieved_TFLOPs']:5.0f} TFLOP/s"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
