"""Build speclock's CUDA kernels with nvcc into a plain shared library, for an explicit arch list.

    python -m speclock.kernels.build --archs sm_90a,sm_100a,sm_103a,sm_120a --out DIR
    python -m speclock.kernels.build --stack cuda-vllm --out DIR      # archs and CUDA from the stack
    python -m speclock.kernels.build --stack S --toolchain DIR --out OUT --check
                                   # nvcc and cuobjdump from the lock's toolchain wheels installed in DIR
                                   # (pip --target): what the image's kernels stage and `speclock host-env` run

Why a plain library and not a torch CUDAExtension: the image's builder stage (and CI) may hold
a CPU torch, which cannot build CUDA extensions; nvcc alone can, with no GPU. The library has a
C ABI (see csrc/fp8_pack.cu) and `speclock.kernels.fp8_cuda` loads it with ctypes next to any
torch. It links the CUDA runtime statically, so it needs only the driver at run time.

DIR receives `libspeclock_fp8.so` and `kernels.json` (archs, nvcc release, source and library
sha256), written to temporary names first and renamed, so a failed build leaves nothing behind.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NotRequired, TypedDict

from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem, SpeclockError
from speclock.core.files import atomic_output, atomic_write_text, file_sha256
from speclock.core.heartbeat import Progress
from speclock.spec.schema import ARCH_MIN_CUDA
from speclock.spec.stack import Stack, load_stack

CSRC = Path(__file__).resolve().parent / "csrc"
FP8_SOURCE = CSRC / "fp8_pack.cu"
FP8_LIBRARY = "libspeclock_fp8.so"
MANIFEST = "kernels.json"
ABI_VERSION = 1  # must equal SPECLOCK_FP8_ABI in csrc/fp8_pack.cu
_ARCH = re.compile(r"^sm_(\d+)([af]?)$")


def find_nvcc(explicit: str | None = None) -> str:
    """nvcc from --nvcc, $NVCC, PATH or the usual CUDA folders; EnvironmentProblem if none."""
    candidates = [explicit, os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for cand in candidates:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    raise EnvironmentProblem(
        "nvcc not found (looked at --nvcc, $NVCC, PATH, /usr/local/cuda/bin)",
        hint="install the CUDA compiler of the stack's gpu.cuda release in the builder stage, or pass --nvcc PATH",
    )


def toolchain_tools(root: Path) -> tuple[str, str]:
    """(nvcc, cuobjdump) of the lock's nvcc toolchain wheels (spec.resolve.KERNEL_TOOLCHAIN) installed in `root` with
    `pip install --target`; EnvironmentProblem naming the wheel when one is not there."""
    found = {}
    for tool, wheel in (("nvcc", "nvidia-cuda-nvcc"), ("cuobjdump", "nvidia-cuda-cuobjdump")):
        path = next((p for p in sorted(Path(root).glob(f"**/bin/{tool}")) if p.is_file() and os.access(p, os.X_OK)), None)
        if path is None:
            raise EnvironmentProblem(
                f"--toolchain {root}: no bin/{tool} (from the {wheel} wheel)",
                hint="install the lock's kernel toolchain wheels there (kernels.txt: "
                "pip install --no-deps --require-hashes --target DIR)",
            )
        found[tool] = str(path)
    return found["nvcc"], found["cuobjdump"]


def check_host_compiler() -> str:
    """nvcc compiles host code with the gcc on PATH (as C++: g++'s cc1plus); EnvironmentProblem naming what to install."""
    gcc, gxx = shutil.which("gcc"), shutil.which("g++")
    if not gcc or not gxx:
        raise EnvironmentProblem(
            f"nvcc needs a C++ host compiler and this PATH has no {'gcc' if not gcc else 'g++'}",
            hint="install g++ (Debian/Ubuntu: apt-get install g++; RHEL/Rocky: dnf install gcc-c++) and put it on PATH, "
            "or, for `speclock host-env`, pass --kernels DIR with the library built into the stack's image",
        )
    return gcc


def nvcc_release(nvcc: str) -> tuple[int, int]:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise EnvironmentProblem(f"{nvcc} --version printed no release number", hint="check the CUDA installation")
    return int(m.group(1)), int(m.group(2))


def nvcc_known_archs(nvcc: str) -> set[str]:
    """Real architectures nvcc can emit code for (without the a/f suffix, which it does not list)."""
    out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=False).stdout
    return set(out.split())


def _parse_release(text: str, key: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    if not m:
        raise BadInput(f"{key}: {text!r} is not a CUDA release", hint="write it as MAJOR.MINOR, e.g. '13.0'")
    return int(m.group(1)), int(m.group(2))


def validate_archs(
    archs: list[str], cuda: tuple[int, int], *, cuda_key: str = "gpu.cuda", nvcc_archs: set[str] | None = None
) -> list[str]:
    """Check each arch against speclock's table, the CUDA release and (if given) what nvcc knows.

    Errors name the stack key to change: `gpu.archs` for an unknown or unsupported arch,
    `cuda_key` when the CUDA release is too old for an arch.
    """
    if not archs:
        raise BadInput(
            "gpu.archs is empty: no architecture to build the kernels for",
            hint="list the GPU architectures, e.g. gpu.archs = ['sm_90a', 'sm_100a']",
        )
    seen: list[str] = []
    for arch in archs:
        if not _ARCH.match(arch) or arch not in ARCH_MIN_CUDA:
            raise BadInput(
                f"gpu.archs: {arch!r} is not an architecture speclock knows", hint=f"use one of {', '.join(ARCH_MIN_CUDA)}"
            )
        need = ARCH_MIN_CUDA[arch]
        if cuda < need:
            raise BadInput(
                f"{cuda_key}: {arch} needs CUDA {need[0]}.{need[1]} or newer, but the release is {cuda[0]}.{cuda[1]}",
                hint=f"raise {cuda_key} to {need[0]}.{need[1]}+ or drop {arch} from gpu.archs",
            )
        base = arch.rstrip("af")  # nvcc lists sm_90, not sm_90a
        if nvcc_archs is not None and base not in nvcc_archs:
            raise BadInput(
                f"gpu.archs: this nvcc ({cuda[0]}.{cuda[1]}) does not know {arch}",
                hint=f"drop {arch} from gpu.archs or raise gpu.cuda; nvcc knows {' '.join(sorted(nvcc_archs))}",
            )
        if arch not in seen:
            seen.append(arch)
    return seen


class KernelsManifest(TypedDict):
    """kernels.json next to the library (fp8_cuda reads it back as plain JSON)."""

    abi: int
    library: str
    archs: list[str]
    nvcc: str
    source_sha256: str
    library_sha256: str
    command: list[str]
    cubins: NotRequired[list[str]]  # `--check` adds what cuobjdump shows (printed, never written)


def gencode_flags(archs: list[str]) -> list[str]:
    """One -gencode per arch, machine code only (no PTX): exactly the targets asked for."""
    flags = []
    for arch in archs:
        num = arch[len("sm_") :]
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
    return flags


def build_fp8_library(
    archs: list[str],
    out_dir: Path,
    *,
    nvcc: str | None = None,
    cuda: str | None = None,
    cuda_key: str = "gpu.cuda",
    progress: Progress = print,
) -> KernelsManifest:
    """Compile csrc/fp8_pack.cu for `archs` into out_dir/libspeclock_fp8.so; returns the manifest.

    `cuda` is the release the stack declares (gpu.cuda); the nvcc found must be of that major
    release, and both it and nvcc must be new enough for every arch.
    """
    nvcc = find_nvcc(nvcc)
    check_host_compiler()
    have = nvcc_release(nvcc)
    if cuda is not None:
        want = _parse_release(cuda, cuda_key)
        validate_archs(archs, want, cuda_key=cuda_key)  # the stack's own mistakes first
        if want[0] != have[0]:
            raise EnvironmentProblem(
                f"nvcc at {nvcc} is CUDA {have[0]}.{have[1]} but {cuda_key} is {cuda}: the library would need a different driver",
                hint=f"install nvcc {want[0]}.x in the builder stage, or set {cuda_key} to {have[0]}.{have[1]}",
            )
    archs = validate_archs(
        archs, have, cuda_key=cuda_key if cuda is None else f"nvcc release (for {cuda_key})", nvcc_archs=nvcc_known_archs(nvcc)
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # --strip-all: nvcc names its temporary files after its PID and one of them lands in .symtab, so
    # unstripped libraries differ run to run (and so would image digests); ctypes needs only .dynsym.
    cmd = [
        nvcc,
        "-O3",
        "-std=c++17",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-cudart=static",
        "-Xlinker",
        "--strip-all",
        *gencode_flags(archs),
        str(FP8_SOURCE),
    ]
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        lib_tmp = Path(tmp) / FP8_LIBRARY
        progress(f"kernels: nvcc {have[0]}.{have[1]} building {FP8_LIBRARY} for {', '.join(archs)}")
        proc = subprocess.run([*cmd, "-o", str(lib_tmp)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CheckFailed(
                f"nvcc failed building {FP8_SOURCE.name} for {', '.join(archs)}:\n{proc.stderr.strip()}",
                hint="a target nvcc rejects belongs out of gpu.archs",
            )
        manifest: KernelsManifest = {
            "abi": ABI_VERSION,
            "library": FP8_LIBRARY,
            "archs": archs,
            "nvcc": f"{have[0]}.{have[1]}",
            "source_sha256": file_sha256(FP8_SOURCE),
            "library_sha256": file_sha256(lib_tmp),
            "command": [Path(cmd[0]).name, *cmd[1:-1], FP8_SOURCE.name],
        }
        # fsynced and renamed into place one by one (speclock.core.files), the library first: a manifest
        # never describes a library that is not there
        with (
            atomic_output(out_dir / FP8_LIBRARY, binary=True, mode=lib_tmp.stat().st_mode & 0o777) as out,
            open(lib_tmp, "rb") as fh,
        ):
            shutil.copyfileobj(fh, out, 1 << 20)
        atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n", mode=0o644)
    return manifest


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, the CUDA folders, $CUOBJDUMP or the copy Triton's package carries."""
    cands = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    try:
        spec = importlib.util.find_spec("triton")
        if spec and spec.origin:
            cands.append(str(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    except (ImportError, ValueError):
        pass
    for cand in cands:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def cubin_archs(library: Path, cuobjdump: str | None = None) -> list[str]:
    """The sm_XX[a] targets of the cubins embedded in a library, read with cuobjdump --list-elf."""
    tool = cuobjdump or find_cuobjdump()
    if not tool:
        raise EnvironmentProblem(
            "cuobjdump not found", hint="pip install nvidia-cuda-cuobjdump, or install triton (it carries one)"
        )
    proc = subprocess.run([tool, "--list-elf", str(library)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CheckFailed(f"cuobjdump --list-elf {library} failed: {proc.stderr.strip()}")
    return sorted(set(re.findall(r"\.(sm_\d+[af]?)\.cubin", proc.stdout)))


def check_library(out_dir: Path, archs: list[str]) -> list[str]:
    """CheckFailed unless the built library holds a cubin for exactly `archs` (no PTX)."""
    lib = Path(out_dir) / FP8_LIBRARY
    found = cubin_archs(lib)
    if sorted(found) != sorted(archs):
        raise CheckFailed(f"{lib} holds cubins for {found or 'nothing'}, expected {sorted(archs)}")
    return found


def archs_for_stack(stack: Stack) -> tuple[list[str], str]:
    """gpu.archs and gpu.cuda of a GPU stack that asks for kernels; BadInput for a CPU stack."""
    if not stack.gpu["cuda"]:
        raise BadInput(
            f"{stack.path}: kernels were requested for a CPU stack (gpu.cuda is empty)",
            hint="set gpu.cuda and gpu.archs, or remove kernels.build",
        )
    return list(stack.gpu["archs"]), stack.gpu["cuda"]


def _run(args: argparse.Namespace) -> int:
    if args.stack:
        stack = load_stack(args.stack)
        archs, cuda = archs_for_stack(stack)
        if args.archs:
            raise BadInput("give --stack or --archs, not both", hint="the stack's gpu.archs is the arch list")
    else:
        if not args.archs:
            raise BadInput("no architectures: give --archs sm_90a,... or --stack NAME")
        archs, cuda = [a.strip() for a in args.archs.split(",") if a.strip()], args.cuda
    if args.toolchain:
        if args.nvcc:
            raise BadInput("give --toolchain or --nvcc, not both", hint="--toolchain DIR takes nvcc and cuobjdump from DIR")
        args.nvcc, cuobjdump = toolchain_tools(Path(args.toolchain))
        os.environ["CUOBJDUMP"] = cuobjdump  # find_cuobjdump reads it: the --check uses the toolchain's own
    quiet = args.json
    manifest = build_fp8_library(
        archs, Path(args.out), nvcc=args.nvcc, cuda=cuda, progress=(lambda m: print(m, file=sys.stderr)) if quiet else print
    )
    if args.check:
        manifest["cubins"] = check_library(Path(args.out), manifest["archs"])
    if args.json:
        print(json.dumps(manifest, indent=2))
    else:
        print(
            f"kernels: wrote {Path(args.out) / FP8_LIBRARY} ({', '.join(manifest['archs'])})"
            + (f"; cuobjdump shows {', '.join(manifest['cubins'])}" if args.check else "")
        )
    return 0


def _parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--archs", help="comma-separated targets, e.g. sm_90a,sm_100a (default: the stack's gpu.archs)")
    parser.add_argument("--stack", help="take gpu.archs and gpu.cuda from this stack (name or path)")
    parser.add_argument("--cuda", help="CUDA release the archs are checked against (default: nvcc's own)")
    parser.add_argument("--out", required=True, help="folder for libspeclock_fp8.so and kernels.json")
    parser.add_argument("--nvcc", help="nvcc to use (default: $NVCC, then PATH)")
    parser.add_argument(
        "--toolchain",
        metavar="DIR",
        help="take nvcc and cuobjdump from the lock's toolchain wheels "
        "installed in DIR (pip install --target DIR -r kernels.txt)",
    )
    parser.add_argument("--check", action="store_true", help="verify the cubins with cuobjdump after building")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    parser.set_defaults(func=_run)
    return parser


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`speclock kernels-build`: the same as `python -m speclock.kernels.build`."""
    _parser(
        sub.add_parser(
            "kernels-build",
            help="compile speclock's CUDA kernels with nvcc for a stack's archs",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser(
        argparse.ArgumentParser(
            prog="python -m speclock.kernels.build", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
    )
    args = parser.parse_args(argv)
    try:
        rc: int = args.func(args)  # _run or a caller's handler: both return the exit status
        return rc
    except SpeclockError as err:
        print(f"speclock.kernels.build: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
