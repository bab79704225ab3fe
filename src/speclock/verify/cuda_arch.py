"""Which GPU architectures a compiled extension can run on, read with NVIDIA's `cuobjdump`.

`cuobjdump --list-elf` / `--list-ptx` list the cubins (SASS) and PTX in a library's fat binary.
`--list-elf` prints a family cubin (sm_100f) as plain sm_100; the true target is the
`-arch sm_100f` string in the cubin's `.note.nv.tkinfo` note, so cubins of sm_100 and newer are
extracted once (`-xelf all`) and their notes read. cuobjdump comes from PyPI's
`nvidia-cuda-cuobjdump` (downloaded into the host cache when not already present).

Whether code runs on a GPU of compute capability M.m:
  SASS sm_XY   exact when X.Y == M.m; compatible when X == M and Y < m (same-major binary
               compatibility), except arch-specific sm_XYa, which runs only on X.Y exactly
  SASS sm_XYf  family: X == M and Y <= m
  PTX  compute_XY  JIT-compiled by the driver when X.Y <= M.m (the 'a' kind only on X.Y, 'f' within
               the family)
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

from speclock.build.wheelhouse import cached_wheel_intact, record_cached_wheel
from speclock.core.errors import BadInput, EnvironmentProblem, SpeclockError
from speclock.core.files import TEMP_PREFIX, atomic_write_json, read_json
from speclock.core.heartbeat import Progress
from speclock.core.layout import cache_dir

CUOBJDUMP_PACKAGE = "nvidia-cuda-cuobjdump"
_ARCH = re.compile(r"^(?:sm|compute)_(\d+)([af]?)$")
_ELF_LINE = re.compile(r"ELF file\s+\d+:\s+(\S+)")
_PTX_LINE = re.compile(r"PTX file\s+\d+:\s+(\S+)")
_TK_ARCH = re.compile(rb"-arch[ =](sm_\d+[af]?)")

# Compiled libraries the serving path loads: the engine's own and those of the kernel packages it
# calls (FlashInfer with its precompiled cubin / jit-cache wheels, DeepGEMM, Triton's bundled
# libraries, torch), and which of them apply to which compute capability (SGLang picks
# sgl_kernel/sm90 on Hopper and sgl_kernel/sm100 everywhere else: load_utils.py). A package that
# is not installed adds nothing.
KERNEL_PACKAGES = ["flashinfer", "flashinfer_cubin", "flashinfer_jit_cache*", "deep_gemm", "triton", "torch/lib"]


class EngineLibraries(TypedDict):
    packages: list[str]  # site-packages globs whose compiled libraries the engine loads
    only: dict[str, Callable[[tuple[int, int]], bool]]  # library path prefix -> on which compute capabilities it loads


ENGINE_LIBRARIES: dict[str, EngineLibraries] = {
    "vllm": {"packages": ["vllm", *KERNEL_PACKAGES], "only": {}},
    "sglang": {
        "packages": ["sgl_kernel", *KERNEL_PACKAGES],
        "only": {"sgl_kernel/sm90/": lambda cc: cc == (9, 0), "sgl_kernel/sm100/": lambda cc: cc != (9, 0)},
    },
}
# Packages that ship loose cubins (read as one library per package: the union of their archs).
CUBIN_PACKAGES = ("flashinfer_cubin",)


def parse_arch(name: str) -> tuple[int, int, str]:
    """'sm_100f' -> (10, 0, 'f'); 'sm_90a' -> (9, 0, 'a'); raises BadInput for other text."""
    m = _ARCH.match(name.strip())
    if not m:
        raise BadInput(f"{name!r} is not a CUDA architecture", hint="e.g. sm_90a, sm_100, sm_103a, sm_120")
    digits = m[1]
    return int(digits[:-1]), int(digits[-1]), m[2]


def device_cc(target: str) -> tuple[int, int]:
    major, minor, _ = parse_arch(target)
    return major, minor


# ---------------------------------------------------------------- cuobjdump


def _cuobjdump_in(root: Path) -> Path | None:
    for cand in sorted(root.glob("nvidia/cu*/bin/cuobjdump")) + sorted(root.glob("nvidia/cuda_cuobjdump/bin/cuobjdump")):
        if cand.is_file():
            return cand
    return None


def find_cuobjdump(extra_roots: list[Path] | None = None, download: bool = True) -> Path:
    """cuobjdump from $SPECLOCK_CUOBJDUMP, PATH, an installed nvidia-cuda-cuobjdump, or the host cache."""
    env = os.environ.get("SPECLOCK_CUOBJDUMP")
    if env:
        if not Path(env).is_file():
            raise EnvironmentProblem(f"SPECLOCK_CUOBJDUMP={env} does not exist")
        return Path(env)
    on_path = shutil.which("cuobjdump")
    if on_path:
        return Path(on_path)
    for root in list(extra_roots or []) + [Path(p) for p in sys.path if p]:
        found = _cuobjdump_in(Path(root)) if Path(root).is_dir() else None
        if found:
            return found
    tools = cache_dir() / "tools" / "cuobjdump"
    found = _cuobjdump_in(tools)
    if found:
        return found
    if not download:
        raise EnvironmentProblem("cuobjdump not found", hint=f"pip install {CUOBJDUMP_PACKAGE} (or set SPECLOCK_CUOBJDUMP)")
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    have = sorted(wheels.glob("nvidia_cuda_cuobjdump-*.whl"))
    for wheel in have:  # re-verified on every use: a truncated download is removed and fetched again
        if not cached_wheel_intact(wheel):
            wheel.unlink(missing_ok=True)
    have = [w for w in have if w.is_file()]
    if not have:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", CUOBJDUMP_PACKAGE, "-d", str(wheels)],
            capture_output=True,
            text=True,
        )
        have = sorted(wheels.glob("nvidia_cuda_cuobjdump-*.whl"))
        for wheel in have:
            record_cached_wheel(wheel)
        if proc.returncode != 0 or not have:
            raise EnvironmentProblem(
                f"cannot download {CUOBJDUMP_PACKAGE}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}",
                hint=f"install it (pip install {CUOBJDUMP_PACKAGE}) or set SPECLOCK_CUOBJDUMP",
            )
    # Unpacked into a temp folder renamed into place (a folder: speclock.core.files writes files), removed
    # on any failure, Ctrl-C included, so a killed run never leaves a half-unpacked tool behind.
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=f"{TEMP_PREFIX}cuobjdump."))
    try:
        try:
            with zipfile.ZipFile(have[-1]) as z:
                z.extractall(tmp)
        except (zipfile.BadZipFile, EOFError) as err:
            have[-1].unlink(missing_ok=True)  # a damaged download: fetched again next time
            raise EnvironmentProblem(
                f"{have[-1]} is not a whole wheel ({err}); removed", hint="run the command again to download it again"
            ) from None
        found = _cuobjdump_in(tmp)
        if not found:
            raise EnvironmentProblem(f"{have[-1].name} holds no cuobjdump binary")
        found.chmod(0o755)
        tools.parent.mkdir(parents=True, exist_ok=True)
        if tools.exists() and _cuobjdump_in(tools) is None:  # a damaged copy (no cuobjdump in it): replaced
            shutil.rmtree(tools, ignore_errors=True)
        if not tools.exists():
            os.replace(tmp, tools)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    installed = _cuobjdump_in(tools)
    if installed is None:
        raise EnvironmentProblem(f"{tools} holds no cuobjdump", hint=f"remove {tools} and run the command again")
    return installed


@dataclass
class Inventory:
    """What a library's fat binary holds: SASS archs (true names, e.g. sm_100f) and PTX archs."""

    path: str
    sass: list[str]
    ptx: list[str]

    @property
    def has_device_code(self) -> bool:
        return bool(self.sass or self.ptx)


def _run_list(tool: Path, flag: str, lib: Path) -> list[str]:
    proc = subprocess.run([str(tool), flag, str(lib)], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and "does not contain device code" not in out and "No " not in out:
        raise EnvironmentProblem(
            f"cuobjdump {flag} {lib} failed: {out.strip().splitlines()[-1] if out.strip() else proc.returncode}"
        )
    regex = _ELF_LINE if flag == "--list-elf" else _PTX_LINE
    return regex.findall(out)


def _arch_of_member(name: str) -> str:
    m = re.search(r"\.(sm_\d+[af]?)\.(?:cubin|ptx)$", name)
    return m[1] if m else "?"


def _tkinfo_archs(tool: Path, lib: Path, names: list[str]) -> dict[str, str]:
    """True -arch of cubins, read from their .note.nv.tkinfo after extracting them in one pass: only the members whose
    listed arch can hide a family variant (`-xelf` takes partial names: "sm_100.cubin" matches no sm_100a member;
    libtorch_cuda.so's 2975 cubins are 5.1 GB extracted, its 1009 ambiguous ones 2.2 GB)."""
    out: dict[str, str] = {}
    suffixes = ",".join(sorted({f"{_arch_of_member(n)}.cubin" for n in names}))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(tool), "-xelf", suffixes, str(lib)], cwd=tmp, capture_output=True, check=False)
        for name in names:
            p = Path(tmp) / name
            if not p.is_file():
                continue
            m = _TK_ARCH.search(p.read_bytes())
            if m:
                out[name] = m[1].decode()
    return out


def _cache_key(lib: Path) -> str:
    st = lib.stat()
    return hashlib.sha256(f"{lib.resolve()}|{st.st_size}|{st.st_mtime_ns}|v1".encode()).hexdigest()[:32]


def inventory(lib: Path, tool: Path | None = None, use_cache: bool = True) -> Inventory:
    """SASS and PTX archs of one library (cached per file on the host)."""
    lib = Path(lib)
    cache = cache_dir() / "cuobjdump-inventory" / f"{_cache_key(lib)}.json"
    if use_cache and cache.is_file():
        cached = _read_inventory_cache(cache)
        if cached is not None:
            return Inventory(str(lib), *cached)
    tool = tool or find_cuobjdump()
    elf = _run_list(tool, "--list-elf", lib)
    ptx = _run_list(tool, "--list-ptx", lib)
    listed = {n: _arch_of_member(n) for n in elf}
    # Only sm_100 and newer have family ('f') variants that --list-elf hides.
    ambiguous = [n for n, a in listed.items() if not a.endswith(("a", "f")) and a != "?" and parse_arch(a)[0] >= 10]
    true = _tkinfo_archs(tool, lib, ambiguous) if ambiguous else {}
    sass = sorted({true.get(n, a) for n, a in listed.items() if a != "?"}, key=_sort_key)
    ptxs = sorted({_arch_of_member(n).replace("sm_", "compute_") for n in ptx if _arch_of_member(n) != "?"}, key=_sort_key)
    inv = Inventory(str(lib), sass, ptxs)
    if use_cache:
        try:
            atomic_write_json(cache, {"sass": inv.sass, "ptx": inv.ptx}, indent=None)
        except (OSError, SpeclockError):
            pass  # a read-only image or a full disk: no cache, still correct
    return inv


def _read_inventory_cache(cache: Path) -> tuple[list[str], list[str]] | None:
    """A cached inventory, or None when it is damaged (then it is recomputed and written again)."""
    try:
        data = read_json(cache, what="cuobjdump inventory cache")
    except SpeclockError:
        return None
    sass, ptx = data.get("sass"), data.get("ptx")
    if not all(isinstance(x, list) and all(isinstance(a, str) for a in x) for x in (sass, ptx)):
        return None
    return sass, ptx


def _sort_key(arch: str) -> tuple[int, int, str]:
    major, minor, suffix = parse_arch(arch)
    return (major, minor, suffix)


# ---------------------------------------------------------------- coverage

CoverageKind = Literal["exact", "compatible", "ptx", "missing", "n/a", "accepted-gap"]


class Coverage(TypedDict):
    """How one library serves one target arch (a cell of the coverage table)."""

    kind: CoverageKind
    via: str | None  # the SASS or PTX arch that serves it; None when nothing does (or n/a, accepted-gap)
    reason: NotRequired[str]  # n/a: why the serving path never loads it there; accepted-gap: the stack's reason


# off_path(library, arch): why the serving path never loads that library's code on that arch, or None.
OffPath = Callable[[str, str], str | None]


class CoverageRow(TypedDict):
    library: str  # relative to the table's root where it lies inside it
    sass: list[str]
    ptx: list[str]
    targets: dict[str, Coverage]  # target arch -> its cell
    ok: bool  # no cell is missing


def coverage(inv: Inventory, target: str) -> Coverage:
    """How `target` (a GPU arch, e.g. sm_100) is served by a library: exact / compatible / ptx / missing."""
    cc = device_cc(target)
    best: Coverage | None = None
    for arch in inv.sass:
        x, y, s = parse_arch(arch)
        if (x, y) == cc:
            return {"kind": "exact", "via": arch}
        if x == cc[0] and y < cc[1] and s in ("", "f") and best is None:
            best = {"kind": "compatible", "via": arch}
    if best:
        return best
    for arch in reversed(inv.ptx):
        x, y, s = parse_arch(arch)
        if (s == "" and (x, y) <= cc) or (s == "f" and x == cc[0] and y <= cc[1]) or (s == "a" and (x, y) == cc):
            return {"kind": "ptx", "via": arch}
    return {"kind": "missing", "via": None}


def engine_libraries(engine: str, site_packages: Path) -> list[Path]:
    """Compiled libraries the engine's serving path loads: every .so under its packages and its kernel
    packages (KERNEL_PACKAGES), each file once, plus one folder per package of loose cubins."""
    spec = ENGINE_LIBRARIES.get(engine)
    if spec is None:
        raise BadInput(f"no library table for engine {engine!r}", hint=f"known: {', '.join(ENGINE_LIBRARIES)}")
    libs, seen = [], set()
    for pattern in spec["packages"]:
        for root in sorted(Path(site_packages).glob(pattern)):
            if not root.is_dir():
                continue
            if root.name in CUBIN_PACKAGES:
                if any(root.rglob("*.cubin")):
                    libs.append(root)
                continue
            for p in sorted(root.rglob("*.so")):
                real = p.resolve()
                if p.is_file() and real not in seen:  # a symlinked copy is read once
                    seen.add(real)
                    libs.append(p)
    return libs


_NAME_ARCH = re.compile(r"[Ss]m_?(\d{2,3}[af]?)(?![0-9])")


def cubin_folder_inventory(folder: Path) -> Inventory:
    """Archs of a folder of loose cubins (flashinfer-cubin): from each file name where it carries the arch
    (fmhaSm100fKernel_..., ..._sm100f.cubin), else from the cubin's own .note.nv.tkinfo (-arch sm_90a)."""
    archs: set[str] = set()
    for p in Path(folder).rglob("*.cubin"):
        m = _NAME_ARCH.search(p.name)
        if not m:
            try:
                t = _TK_ARCH.search(p.read_bytes())
            except OSError:
                continue
            if t:
                archs.add(t[1].decode())
            continue
        try:
            parse_arch("sm_" + m[1])
        except BadInput:
            continue
        archs.add("sm_" + m[1])
    return Inventory(str(folder), sorted(archs, key=_sort_key), [])


def applies(engine: str, rel: str, target: str) -> bool:
    spec = ENGINE_LIBRARIES.get(engine)
    only = spec["only"] if spec else {}
    for prefix, rule in only.items():
        if rel.startswith(prefix):
            return rule(device_cc(target))
    return True


def parse_known_gaps(entries: list[str]) -> dict[tuple[str, str], str]:
    """'library:arch reason' entries of the stack -> {(library, arch): reason}."""
    out = {}
    for e in entries:
        head, _, reason = e.partition(" ")
        lib, sep, arch = head.rpartition(":")
        if not sep or not lib:
            raise BadInput(
                f"gpu.known_gaps entry {e!r} is not 'library:arch reason'",
                hint="e.g. 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so:sm_100 FA3 is Hopper-only'",
            )
        parse_arch(arch)
        out[(lib, arch)] = reason.strip() or "accepted in the stack"
    return out


def coverage_table(
    libs: list[Path],
    root: Path,
    targets: list[str],
    engine: str = "",
    known_gaps: dict[tuple[str, str], str] | None = None,
    tool: Path | None = None,
    log: Progress | None = None,
    off_path: OffPath | None = None,
) -> list[CoverageRow]:
    """One row per library with device code: per target arch, how it is served; accepted gaps marked.
    `off_path(library, arch)` gives the reason the serving path never loads that library's code on that arch
    (the stack's settings pick another kernel there), or None; such a cell is n/a with the reason."""
    rows: list[CoverageRow] = []
    known_gaps = known_gaps or {}
    for lib in libs:
        rel = str(Path(lib).relative_to(root)) if Path(lib).is_relative_to(root) else str(lib)
        if log:
            log(f"cuobjdump {rel}")
        inv = cubin_folder_inventory(lib) if Path(lib).is_dir() else inventory(lib, tool=tool)
        if not inv.has_device_code:
            continue
        cells: dict[str, Coverage] = {}
        for t in targets:
            if engine and not applies(engine, rel, t):
                cells[t] = {"kind": "n/a", "via": None}
                continue
            cell = coverage(inv, t)
            why_off = off_path(rel, t) if off_path and cell["kind"] == "missing" else None
            if why_off:
                cells[t] = {"kind": "n/a", "via": None, "reason": why_off}
                continue
            gap = known_gaps.get((rel, t)) or known_gaps.get((Path(rel).name, t))
            if cell["kind"] == "missing" and gap:
                cell = {"kind": "accepted-gap", "via": None, "reason": gap}
            cells[t] = cell
        rows.append(
            {
                "library": rel,
                "sass": inv.sass,
                "ptx": inv.ptx,
                "targets": cells,
                "ok": all(c["kind"] != "missing" for c in cells.values()),
            }
        )
    return rows


def format_table(rows: list[CoverageRow], targets: list[str]) -> str:
    short = {"exact": "sass", "compatible": "sass~", "ptx": "ptx", "missing": "MISSING", "n/a": "n/a", "accepted-gap": "gap(ok)"}
    width = max([len(r["library"]) for r in rows] + [7])
    lines = ["  " + "library".ljust(width) + "  " + "  ".join(t.ljust(14) for t in targets)]
    for r in rows:
        cells = []
        for t in targets:
            c = r["targets"][t]
            text = short[c["kind"]] + (f" {c['via']}" if c.get("via") and c["kind"] != "exact" else "")
            cells.append(text.ljust(14))
        lines.append("  " + r["library"].ljust(width) + "  " + "  ".join(cells))
    lines.append("  (sass = cubin for that arch; sass~ = same-major compatible cubin; ptx = JIT from PTX)")
    return "\n".join(lines)
