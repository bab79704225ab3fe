"""Doctor's sglang-jit check: SGLang's run-time JIT kernels can be built in the environment the engine runs with.

SGLang (0.5.15 read) compiles kernels on CUDA at their first call through tvm_ffi (sglang/jit_kernel/utils.py:
load_jit -> tvm_ffi.cpp.load_inline): the fused RoPE (jit_kernel/rope.py, from srt/layers/rotary_embedding/base.py:
RotaryEmbedding.forward_cuda, for every head size), SiluAndMul (jit_kernel/activation.py), decode positions
(jit_kernel/clamp_position.py) and the KV-cache store (jit_kernel/kvcache.py). No server argument or variable turns
these off on CUDA. tvm_ffi runs ninja, $CUDA_HOME/bin/nvcc (CUDA_HOME or CUDA_PATH, else nvcc on PATH; nvcc's host
compiler is gcc with C++, i.e. cc1plus from g++), CUDA headers (runtime, crt, and cccl's <nv/target>), and links
with $CXX (c++) against $CUDA_HOME/lib64/libcudart.so. Measured: without nvcc the engine dies at its first forward
("ninja exited with status 127 ... nvcc: not found").

The check builds SGLang's own fused RoPE source (its installed jit_kernel/csrc/elementwise/rope.cuh) for the stack's
first GPU arch with tvm_ffi's load_inline in the engine's Python, with an empty cache, in the environment the engine
gets: this process's, the stack's engine.env, and the CUDA_HOME speclock's SGLang adapter sets (engines.sglang.jit_env).
nvcc compiles for any arch without a GPU. A debian-rootfs base without g++ fails too (the host compile here may use a
compiler the image does not have).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import TypedDict

from speclock.core.jsonread import loads
from speclock.engines import sglang as sglang_engine
from speclock.verify import cuda_arch
from speclock.verify.doctor.context import Check, Context, Question

NAME = "sglang-jit"
CUDA_WHEELS = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl")
CXX_PACKAGE = "g++"

# Run by the engine's Python: tvm_ffi's own CUDA_HOME search and build, on SGLang's RoPE source (argv: site, arch
# as "9.0", build dir). Prints one JSON line.
PROBE = r"""
import json, os, shutil, sys, time
site, arch, build = sys.argv[1:4]
out = {"installed": False}
try:
    import tvm_ffi
    from tvm_ffi.cpp import extension, load_inline
except Exception as err:
    print(json.dumps(dict(out, error=f"{type(err).__name__}: {err}"))); sys.exit(0)
out.update(installed=True, version=getattr(tvm_ffi, "__version__", "?"), ninja=shutil.which("ninja"),
           cxx=os.environ.get("CXX") or shutil.which("c++"))
try:
    home = extension._find_cuda_home()
except Exception as err:
    home, out["cuda_home_error"] = None, str(err)
out["cuda_home"] = home
out["nvcc"] = os.path.join(home, "bin", "nvcc") if home else None
kernel = os.path.join(site, "sglang", "jit_kernel")
rope = os.path.join(kernel, "csrc", "elementwise", "rope.cuh")
if os.path.isfile(rope):
    out["source"] = "sglang/jit_kernel/csrc/elementwise/rope.cuh"
    cuda = [f'#include "{rope}"', "TVM_FFI_DLL_EXPORT_TYPED_FUNC(run_rope, (FusedRopeKernel<true, 64, false, bf16_t>::run));"]
    flags, inc = [f"-DSGL_CUDA_ARCH={arch.replace('.', '')}0", "-std=c++20", "-O3", "--expt-relaxed-constexpr"], [os.path.join(kernel, "include")]
else:
    out["source"] = "a trivial kernel"
    cuda = ["__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }", "int launch_k(int n) { return n; }",
            "TVM_FFI_DLL_EXPORT_TYPED_FUNC(launch, launch_k);"]
    flags, inc = ["-O2"], []
os.environ["TVM_FFI_CUDA_ARCH_LIST"] = arch
t0 = time.time()
try:
    load_inline("speclock_sglang_jit_probe", cpp_sources=[], cuda_sources=cuda, extra_cflags=["-std=c++20", "-O3"],
                extra_cuda_cflags=flags, extra_include_paths=inc, build_directory=build)
    out["built"] = True
except Exception as err:
    lines = [l for l in str(err).splitlines() if l.strip()]
    out.update(built=False, output_tail=lines[-12:])
    out["built"] = os.path.isfile(os.path.join(build, "speclock_sglang_jit_probe.so"))
out["seconds"] = round(time.time() - t0, 1)
print(json.dumps(out))
"""


class JitBuild(TypedDict, total=False):
    """PROBE's answer (its one JSON line), or ask_build's own when the probe could not run; check_sglang_jit adds
    adapter_env. Keys as PROBE sets them: each may be absent."""

    installed: bool  # tvm_ffi imports
    error: str
    version: str  # tvm_ffi's
    ninja: str | None
    cxx: str | None
    cuda_home: str | None
    cuda_home_error: str
    nvcc: str | None
    source: str  # what was built
    built: bool
    output_tail: list[str]
    seconds: float
    adapter_env: dict[str, str]  # what speclock's SGLang adapter adds to the engine's environment


def jit_kernel_dir(ctx: Context) -> Path | None:
    d = Path(ctx.site_packages) / "sglang" / "jit_kernel" if ctx.site_packages else None
    return d if d and (d / "utils.py").is_file() else None


def engine_sys_path(ctx: Context, env: dict[str, str]) -> list[Path]:
    """The engine Python's import path (its site-packages, then a host environment's host site-packages): where the
    adapter looks for the CUDA wheels when the engine starts."""
    run_env = dict(env, PYTHONPATH=os.pathsep.join([str(ctx.site_packages), *filter(None, [env.get("PYTHONPATH")])]))
    try:
        proc = subprocess.run(
            [str(ctx.python), "-c", "import json, sys; print(json.dumps(sys.path))"],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        paths = loads((proc.stdout.strip().splitlines() or ["[]"])[-1])
    except (OSError, subprocess.SubprocessError, ValueError):
        paths = []
    found = [Path(p) for p in paths if isinstance(p, str) and p and Path(p).is_dir()]
    return found or ([Path(ctx.site_packages)] if ctx.site_packages else [])


def engine_run_env(ctx: Context) -> tuple[dict[str, str], dict[str, str]]:
    """(the environment the engine runs with, what speclock's adapter adds to it)."""
    env = {**os.environ, **ctx.stack.engine_env}
    added = sglang_engine.jit_env(env, search=engine_sys_path(ctx, env))
    return {**env, **added}, added


def _jit_arch(arch: str) -> str:
    major, minor = cuda_arch.device_cc(arch)
    return f"{major}.{minor}"  # SGLang sets TVM_FFI_CUDA_ARCH_LIST to the GPU's major.minor (no a/f suffix)


def ask_build(ctx: Context, env: dict[str, str], arch: str, timeout: int = 300) -> JitBuild:
    with tempfile.TemporaryDirectory(prefix="speclock-sglang-jit.") as tmp:
        run_env = dict(env, TVM_FFI_CACHE_DIR=str(Path(tmp) / "cache"))
        run_env["PYTHONPATH"] = os.pathsep.join([str(ctx.site_packages), *filter(None, [env.get("PYTHONPATH")])])
        try:
            proc = subprocess.run(
                [str(ctx.python), "-c", PROBE, str(ctx.site_packages), _jit_arch(arch), str(Path(tmp) / "build")],
                env=run_env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"installed": True, "built": False, "output_tail": [f"the build took over {timeout} s"]}
        except OSError as err:
            return {"installed": False, "error": f"cannot run {ctx.python}: {err}"}
    try:
        answer: JitBuild = loads((proc.stdout.strip().splitlines() or [""])[-1])  # PROBE prints one such object
        return answer
    except ValueError:
        return {"installed": False, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def _stack_file(ctx: Context) -> str:
    return f"stacks/{ctx.stack.name}.toml"


def diagnose(ctx: Context, r: JitBuild, env: dict[str, str]) -> tuple[str, str]:
    """(cause, what to do) of a failed build, from the probe's answer."""
    tail = " ".join(r.get("output_tail") or [])
    major = (ctx.stack.gpu.get("cuda") or "13").split(".")[0]
    nvcc = r.get("nvcc")
    if not r.get("cuda_home") or (nvcc and not Path(nvcc).is_file()) or "nvcc: not found" in tail:
        where = r.get("cuda_home_error") or f"no nvcc at {nvcc}"
        return (
            f"{where} (CUDA_HOME={env.get('CUDA_HOME') or env.get('CUDA_PATH') or 'unset'}, no nvcc on PATH, "
            "and the engine's site-packages has no nvidia/cu*/bin/nvcc)",
            f"lock the CUDA {major} compiler wheels ({', '.join(CUDA_WHEELS)}) in python.extra of {_stack_file(ctx)} "
            "(speclock's SGLang adapter points CUDA_HOME at them), or set engine.env CUDA_HOME to a CUDA toolkit",
        )
    if "nv/target" in tail or "cuda/std" in tail:
        return (
            "CUDA headers are missing (cuda_fp16.h includes <nv/target> from CCCL)",
            f"move nvidia-cuda-cccl from python.build_only to python.extra in {_stack_file(ctx)} and re-lock",
        )
    missing = re.search(r"fatal error: ([\w./-]+\.h): No such file", tail)
    if missing and missing[1] != "Python.h":
        return (
            f"the CUDA header {missing[1]} is missing from CUDA_HOME {r.get('cuda_home')}",
            f"lock the CUDA {major} wheel that ships it (cuda_runtime.h: nvidia-cuda-runtime) where the engine's "
            "Python imports it (the adapter merges every nvidia/cu* tree on its path)",
        )
    if "cc1plus" in tail or "c++: not found" in tail or "gcc: not found" in tail or "g++" in tail or not r.get("cxx"):
        return ("no C++ compiler (nvcc's host compile needs gcc with cc1plus, tvm_ffi links with c++)", _cxx_fix(ctx))
    if "-lcudart" in tail:
        return (
            f"the linker finds no libcudart.so under {r.get('cuda_home')}/lib64",
            "point CUDA_HOME at a toolkit with lib64/libcudart.so (speclock's SGLang adapter makes one from the wheels)",
        )
    if not r.get("ninja"):
        return ("ninja is not on PATH", "put the engine venv's bin folder (ninja from the lock) on PATH")
    return (
        f"the build failed: {' | '.join((r.get('output_tail') or ['no output'])[-3:])}",
        "see the compiler output in the details",
    )


def _cxx_fix(ctx: Context) -> str:
    if ctx.stack.base.get("kind") == "debian-rootfs":
        return f'add "{CXX_PACKAGE}" to base.packages in {_stack_file(ctx)} and re-lock (changes the base)'
    return "use a base image (base.ref) that has g++ (or set engine.env CXX to a C++ compiler it has)"


def check_sglang_jit(ctx: Context) -> Check:
    if ctx.stack.engine["name"] != "sglang":
        return Check(NAME, "skip", f"{ctx.stack.engine['name']} compiles no kernels through tvm_ffi")
    if not ctx.stack.is_gpu or not ctx.stack.gpu["archs"]:
        return Check(NAME, "skip", "CPU stack: SGLang's JIT kernels run only on CUDA")
    if not ctx.python or not ctx.site_packages:
        return Check(NAME, "fail", f"no engine Python to build in: {ctx.python_note}")
    kernel = jit_kernel_dir(ctx)
    if kernel is None:
        return Check(
            NAME, "skip", f"{ctx.stack.engine['package']} {ctx.stack.engine['version']} has no sglang/jit_kernel: no run-time JIT"
        )
    env, added = engine_run_env(ctx)
    arch = ctx.stack.gpu["archs"][0]
    r = ask_build(ctx, env, arch)
    r["adapter_env"] = added
    if not r.get("installed"):
        return Check(
            NAME,
            "fail",
            f"SGLang JIT-compiles its RoPE through tvm_ffi, which does not import in the engine's Python "
            f"({r.get('error')}); lock apache-tvm-ffi (an SGLang dependency)",
            r,
        )
    if not r.get("built"):
        cause, fix = diagnose(ctx, r, env)
        return Check(
            NAME,
            "fail",
            f"SGLang {ctx.stack.engine['version']} JIT-compiles its fused RoPE (and SiluAndMul, positions) "
            f"with nvcc through tvm_ffi at its first forward, and that build fails here: {cause}; {fix}",
            r,
        )
    via = f"CUDA_HOME {r['cuda_home']}" + (" (set by speclock's SGLang adapter)" if added else "")
    if ctx.stack.base.get("kind") == "debian-rootfs" and CXX_PACKAGE not in ctx.stack.base.get("packages", []):
        return Check(
            NAME,
            "fail",
            f"tvm_ffi {r['version']} built {r['source']} for sm_{_jit_arch(arch).replace('.', '')} here with {via} "
            f"and {r.get('cxx')}, but the image's base has no C++ compiler (nvcc's host compile and tvm_ffi's "
            f"link need one); {_cxx_fix(ctx)}",
            r,
        )
    return Check(
        NAME,
        "pass",
        f"tvm_ffi {r['version']} built {r['source']} for sm_{_jit_arch(arch).replace('.', '')} with {via} "
        f"and {r.get('cxx')} in {r.get('seconds')} s",
        r,
    )


class SglangJit:
    name = NAME
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {}  # its own subprocess: a build in the engine's run environment, not a question to the engine

    def run(self, ctx: Context) -> Check:
        return check_sglang_jit(ctx)
