"""The probe's toolchain questions (CUDA, Triton's C build, torch's archs), apart from its engine questions; stdlib only."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

# An answer goes to the parent process as one JSON line, and the parent checks the shape it reads (patches/probes.py,
# the doctor): here it is an open JSON object.
Answer = dict[str, Any]


def cuda_info() -> Answer:
    """CUDA runtime and driver versions and visible GPUs, through cuda-python's bindings."""
    try:
        try:
            # heavy, optional (cuda): imported only where it is used
            from cuda.bindings import driver as drv
            from cuda.bindings import runtime as rt
        except ImportError:
            from cuda import cuda as drv  # cuda-python before 12.6
            from cuda import cudart as rt
    except ImportError as err:
        return {"available": False, "reason": f"cuda-python is not installed in this Python ({err})"}
    out: Answer = {"available": True, "runtime": None, "driver": 0, "gpus": []}
    try:
        rc, version = rt.cudaRuntimeGetVersion()
        out["runtime"] = int(version) if int(rc) == 0 else None
    except Exception as err:  # libcudart missing
        out["runtime_error"] = f"{type(err).__name__}: {err}"
    try:
        rc, version = rt.cudaDriverGetVersion()
        out["driver"] = int(version) if int(rc) == 0 else 0
    except Exception as err:
        out["driver_error"] = f"{type(err).__name__}: {err}"
    if not out["driver"]:
        return out
    try:
        (rc,) = drv.cuInit(0)
        if int(rc) != 0:
            out["init_error"] = str(rc)
            return out
        rc, count = drv.cuDeviceGetCount()
        for i in range(count):
            rc, dev = drv.cuDeviceGet(i)
            _, major = drv.cuDeviceGetAttribute(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            _, minor = drv.cuDeviceGetAttribute(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
            rc, name = drv.cuDeviceGetName(64, dev)
            out["gpus"].append(
                {"index": i, "name": name.split(b"\0")[0].decode(errors="replace"), "cc": [int(major), int(minor)]}
            )
    except Exception as err:
        out["init_error"] = f"{type(err).__name__}: {err}"
    return out


# A trivial C extension, built through Triton's own launcher build path (compiler from $CC, else gcc or
# clang on PATH; Python.h from sysconfig) and loaded: what Triton does before its first kernel runs.
_TRITON_SRC = r"""
#include <Python.h>
#include <stdlib.h>
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "speclock_triton_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_speclock_triton_probe(void) { return PyModule_Create(&module); }
"""
_TRITON_BUILD = (
    "import sys\n"
    "from triton.runtime.build import compile_module_from_src\n"
    "mod = compile_module_from_src(sys.argv[1], 'speclock_triton_probe')\n"
    "assert mod.answer() == 42, 'the built extension returned the wrong value'\n"
    "print('built')\n"
)


def _python_include() -> str:
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # Debian's scheme; Triton maps it the same way
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def triton_build() -> Answer:
    """Build and load a C extension the way Triton builds its GPU launcher (no GPU needed).

    In a child process with an empty TRITON_CACHE_DIR, so neither a warm cache nor a compiler that
    Triton found earlier in this process can hide a missing one."""
    if importlib.util.find_spec("triton") is None:
        return {"installed": False}
    try:
        version = md.version("triton")
    except md.PackageNotFoundError:
        version = None
    include = _python_include()
    out: Answer = {
        "installed": True,
        "version": version,
        "cc_env": os.environ.get("CC"),
        "compiler": os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang"),
        "python_include": include,
        "python_h": os.path.isfile(os.path.join(include, "Python.h")),
        "python_version": f"{sys.version_info[0]}.{sys.version_info[1]}",
    }
    with tempfile.TemporaryDirectory(prefix="speclock-triton-") as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _TRITON_BUILD, _TRITON_SRC], env=env, capture_output=True, text=True, timeout=300
            )
            text, code = (proc.stdout + proc.stderr).strip(), proc.returncode
        except subprocess.TimeoutExpired:
            text, code = "the build took over 300 s", -1
    out["built"] = code == 0 and text.endswith("built")
    out["output_tail"] = [] if out["built"] else text.splitlines()[-8:]
    return out


def torch_archs() -> Answer:
    """torch's compiled GPU code: SASS (sm_XY) and PTX (compute_XY); no GPU needed on a CUDA build."""
    # heavy, optional (torch): imported only where it is used
    import torch

    flags: list[str] = []
    if torch.version.cuda:
        try:
            flags = str(torch._C._cuda_getArchFlags() or "").split()
        except Exception:  # an older or unusual build: the public list (SASS only)
            flags = list(torch.cuda.get_arch_list())
    return {"version": torch.__version__, "cuda": torch.version.cuda, "flags": flags}
