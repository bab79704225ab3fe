"""Doctor's torch-archs check: torch's compiled GPU code covers every stack GPU arch.

The rule (cuda_arch.coverage, the same as the gpu-archs table), for a stack arch sm_XY[a|f], which
names a GPU of compute capability X.Y:
  - torch SASS sm_XY runs there (exact); a plain or family sm_XV[f] cubin with V < Y runs there too
    (same-major binary compatibility: torch's sm_100 covers sm_103);
  - an arch-specific cubin sm_XYa runs only on X.Y, so torch's sm_90a covers sm_90a and nothing else;
  - the stack's own 'a'/'f' suffix only says how speclock's kernels are built: the GPU is X.Y, so
    torch's plain sm_100 covers a stack arch sm_100a;
  - PTX compute_XY is JIT-compiled forward by the driver onto any X'.Y' >= X.Y (slow first start,
    but it runs): reported as covered via PTX;
  - nothing else covers an arch (a different major, a higher minor, another GPU's 'a' cubin).
torch's arch list is `torch._C._cuda_getArchFlags()` (SASS and PTX; no GPU needed on a CUDA build).
"""

from __future__ import annotations

from speclock.verify import cuda_arch
from speclock.verify.doctor.context import Check, Context, Question


def torch_inventory(flags: list[str]) -> cuda_arch.Inventory:
    sass = [f for f in flags if f.startswith("sm_")]
    ptx = [f for f in flags if f.startswith("compute_")]
    return cuda_arch.Inventory("torch", sass, ptx)


def check_torch_archs(ctx: Context) -> Check:
    targets = ctx.stack.gpu["archs"]
    if not ctx.stack.is_gpu or not targets:
        return Check("torch-archs", "skip", "the stack targets no GPU architecture")
    a = ctx.engine_answers.get("torch_archs")
    if not a or not a["ok"]:
        return Check(
            "torch-archs", "fail", f"could not ask torch in the engine's Python: {(a or {}).get('error', ctx.python_note)}"
        )
    r = a["result"]
    hint = f"lock a CUDA build of torch that has them (torch.version in the stack, now {ctx.stack.torch['version']})"
    if not r.get("cuda"):
        return Check("torch-archs", "fail", f"torch {r['version']} is a CPU build in a GPU stack; {hint}", r)
    inv = torch_inventory(r["flags"])
    cells = {t: cuda_arch.coverage(inv, t) for t in targets}
    detail = {**r, "targets": cells}
    missing = [t for t, c in cells.items() if c["kind"] == "missing"]
    if missing:
        return Check(
            "torch-archs",
            "fail",
            f"torch {r['version']} (CUDA {r['cuda']}) has no code for {', '.join(missing)} "
            f"(its archs: {' '.join(r['flags']) or 'none'}); {hint}",
            detail,
        )
    via = ", ".join(f"{t} ({c['kind']} {c['via']})" for t, c in cells.items())
    return Check("torch-archs", "pass", f"torch {r['version']} (CUDA {r['cuda']}) covers {via}", detail)


class TorchArchs:
    name = "torch-archs"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {"torch_archs": ["torch_archs", []]} if ctx.stack.is_gpu and ctx.stack.gpu["archs"] else {}

    def run(self, ctx: Context) -> Check:
        return check_torch_archs(ctx)
