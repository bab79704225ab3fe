"""Doctor's triton-build check: Triton, which vLLM and SGLang run on the GPU (rejection sampler, EAGLE input
preparation), can build its launcher, proved by really building a C extension through Triton's own build
path in the engine's Python, with an empty Triton cache. A runtime image without a C compiler or Python.h
cannot run a single Triton kernel (measured with triton 3.6.0: "Failed to find C compiler"), warm cache or not."""

from __future__ import annotations

from speclock.core.names import normalize
from speclock.verify.doctor.context import Check, Context, Question


def compiler_packages(python_version: str) -> list[str]:
    """Debian packages that give Triton a C compiler, libc headers and Python.h for the stack's Python."""
    return ["gcc", "libc6-dev", f"libpython{python_version}-dev"]


def fix_hint(ctx: Context, needed: list[str]) -> str:
    stack = ctx.stack
    if stack.base.get("kind") == "debian-rootfs":
        missing = [p for p in needed if p not in stack.base.get("packages", [])]
        add = ", ".join(f'"{p}"' for p in missing or needed)
        return f"add {add} to base.packages in the stack ({stack.name}) and rebuild the image"
    return (
        f"the base image (base.ref) must carry a C compiler, libc headers and Python.h ({', '.join(needed)} "
        "on Debian); use a base image that has them, or set CC to a compiler it has"
    )


def triton_pruned(ctx: Context) -> bool:
    return "triton" in {normalize(n) for n in ctx.stack.prune["packages"]}


def check_triton_build(ctx: Context) -> Check:
    if triton_pruned(ctx):  # nothing to build; the pruned check proves the serving path imports without it
        return Check("triton-build", "skip", "triton pruned by [prune].packages: no Triton launcher to build")
    if not ctx.stack.is_gpu:
        return Check("triton-build", "skip", "CPU stack: the engine's CPU path runs no Triton kernels")
    a = ctx.engine_answers.get("triton_build")
    if not a or not a["ok"]:
        return Check("triton-build", "fail", f"could not ask the engine's Python: {(a or {}).get('error', ctx.python_note)}")
    r = a["result"]
    if not r.get("installed"):
        return Check("triton-build", "skip", "Triton is not installed in the engine's Python: nothing to build", r)
    pkgs = compiler_packages(ctx.stack.python.get("version") or r.get("python_version") or "3")
    if r.get("built"):
        return Check(
            "triton-build",
            "pass",
            f"triton {r.get('version')} built and loaded a C extension with "
            f"{r.get('compiler')} (Python.h from {r.get('python_include')})",
            r,
        )
    tail = " | ".join(line.strip() for line in r.get("output_tail", [])[-3:] if line.strip())
    if not r.get("compiler"):
        cause, needed = "no C compiler: CC is unset and neither gcc nor clang is on PATH", pkgs[:2]
    elif not r.get("python_h"):
        cause, needed = f"Python.h is missing from {r.get('python_include')}", pkgs[2:]
    else:
        cause, needed = f"the build with {r.get('compiler')} failed: {tail or 'no output'}", pkgs
    return Check(
        "triton-build", "fail", f"triton {r.get('version')} cannot build its launcher ({cause}); {fix_hint(ctx, needed)}", r
    )


class TritonBuild:
    name = "triton-build"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {"triton_build": ["triton_build", []]} if ctx.stack.is_gpu and not triton_pruned(ctx) else {}

    def run(self, ctx: Context) -> Check:
        return check_triton_build(ctx)
