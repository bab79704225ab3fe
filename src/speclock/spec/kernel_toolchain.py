"""The nvcc toolchain wheels a kernels.build stack must lock, and the check that its lock has them (for resolve and env plans)."""

from __future__ import annotations

from speclock.core.errors import BadInput
from speclock.spec.lock_types import LockEntry
from speclock.spec.stack import Stack

# PyPI wheels that together make nvcc (compiler, cicc, crt and runtime headers, CCCL headers, static
# cudart) plus cuobjdump to check the cubins: what the kernel builder stage installs, hash-checked.
KERNEL_TOOLCHAIN = (
    "nvidia-cuda-nvcc",
    "nvidia-nvvm",
    "nvidia-cuda-crt",
    "nvidia-cuda-runtime",
    "nvidia-cuda-cccl",
    "nvidia-cuda-cuobjdump",
)


def kernel_toolchain(entries: list[LockEntry]) -> list[LockEntry]:
    """The lock entries (packages + assets) of KERNEL_TOOLCHAIN, by name: engine dependencies or python.build_only."""
    by_name = {e["name"]: e for e in entries}
    return [by_name[n] for n in KERNEL_TOOLCHAIN if n in by_name]


def check_kernel_toolchain(stack: Stack, entries: list[LockEntry]) -> None:
    """BadInput unless every wheel of the nvcc toolchain is locked, naming the stack key to add them to."""
    have = {e["name"]: e for e in kernel_toolchain(entries)}
    missing = [n for n in KERNEL_TOOLCHAIN if n not in have]
    if missing:
        major = (stack.gpu["cuda"] or "13").split(".")[0]
        raise BadInput(
            f"{stack.path}: kernels.build needs the nvcc toolchain wheels in the lock, and {', '.join(missing)} "
            "are not among the resolved packages",
            hint=f"add exact pins of CUDA {major}.x to python.build_only, e.g. "
            + ", ".join(f"'{n}==<version>'" for n in missing)
            + " (`pip index versions NAME` lists them)",
        )
    nvcc_major = have["nvidia-cuda-nvcc"]["version"].split(".")[0]
    if stack.gpu["cuda"] and nvcc_major != stack.gpu["cuda"].split(".")[0]:
        raise BadInput(
            f"{stack.path}: the locked nvidia-cuda-nvcc is {have['nvidia-cuda-nvcc']['version']}, "
            f"another major release than gpu.cuda = {stack.gpu['cuda']}",
            hint="pin nvidia-cuda-nvcc of the gpu.cuda major release in python.build_only, or change gpu.cuda",
        )
