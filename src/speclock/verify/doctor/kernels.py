"""Doctor's kernels check: speclock's own CUDA kernel library holds a cubin for exactly each stack GPU
arch and no PTX (cuobjdump), and is the library its kernels.json describes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

from speclock.core.files import expect, file_sha256, read_json
from speclock.core.layout import IMAGE, in_image
from speclock.kernels import build as kbuild
from speclock.verify import cuda_arch
from speclock.verify.doctor.context import Check, Context, Question


class KernelsDetail(TypedDict, total=False):
    dir: str
    manifest: dict[str, Any]  # kernels.json as read: only abi, library_sha256, nvcc and archs have their types checked
    targets: list[str]
    rows: list[cuda_arch.CoverageRow]
    table: str
    cuobjdump: str


def kernels_dir() -> Path | None:
    """Where the built kernel library should be: $SPECLOCK_KERNELS_DIR, else the image's folder (in an image)."""
    if os.environ.get("SPECLOCK_KERNELS_DIR"):
        return Path(os.environ["SPECLOCK_KERNELS_DIR"])
    return IMAGE.root / "kernels" if in_image() or IMAGE.lock_file.is_file() else None


def check_kernels(ctx: Context) -> Check:
    if not ctx.stack.kernels:
        return Check("kernels", "skip", "the stack builds no speclock kernels (kernels.build is empty)")
    folder = kernels_dir()
    if folder is None:
        return Check(
            "kernels",
            "skip",
            "the kernel library is built into the image (kernels stage): run doctor inside "
            "the image, or set SPECLOCK_KERNELS_DIR to a `speclock kernels-build` folder",
        )
    targets = list(ctx.stack.gpu["archs"])
    lib, man_path = folder / kbuild.FP8_LIBRARY, folder / kbuild.MANIFEST
    if not lib.is_file() or not man_path.is_file():
        if (IMAGE.root / "host-env.json").is_file():  # a host environment (speclock host-env) in the image's layout
            return Check(
                "kernels",
                "fail",
                f"no {kbuild.FP8_LIBRARY} with {kbuild.MANIFEST} in {folder}, and kernels.build "
                f"of stacks/{ctx.stack.name}.toml asks for it: re-create the environment with "
                "`speclock host-env --force` (it builds the library with the lock's nvcc and the "
                "host's g++), or with --kernels DIR (the library copied out of the stack's image)",
                {"dir": str(folder)},
            )
        return Check(
            "kernels",
            "fail",
            f"no {kbuild.FP8_LIBRARY} with {kbuild.MANIFEST} in {folder}: the image was built "
            "without its kernels stage (kernels.build); rebuild it with `speclock build-image`",
            {"dir": str(folder)},
        )
    hint = "rebuild the kernel library with `speclock kernels-build` (or the image with `speclock build-image`)"
    man = read_json(man_path, what="kernel library manifest", hint=hint)
    for key, types in (("abi", (int, str)), ("library_sha256", str), ("nvcc", str)):
        if man.get(key) is not None:
            expect(man[key], types, key, path=man_path, hint=hint)
    for i, a in enumerate(expect(man.get("archs", []), list, "archs", path=man_path, hint=hint)):
        expect(a, str, f"archs[{i}]", path=man_path, hint=hint)
    detail: KernelsDetail = {"dir": str(folder), "manifest": man, "targets": targets}
    problems = []
    if man.get("abi") != kbuild.ABI_VERSION:
        problems.append(f"ABI {man.get('abi')}, speclock needs {kbuild.ABI_VERSION}")
    if man.get("library_sha256") != file_sha256(lib):
        problems.append(f"{kbuild.FP8_LIBRARY} is not the library {kbuild.MANIFEST} describes (sha256 differs)")
    tool = cuda_arch.find_cuobjdump(extra_roots=[ctx.site_packages] if ctx.site_packages else None)
    inv = cuda_arch.inventory(lib, tool=tool)
    rows = cuda_arch.coverage_table([lib], folder, targets, tool=tool)
    detail.update({"rows": rows, "table": cuda_arch.format_table(rows, targets) if rows else "", "cuobjdump": str(tool)})
    missing = [t for t in targets if not rows or rows[0]["targets"][t]["kind"] != "exact"]
    if missing:
        problems.append(f"no cubin for {', '.join(missing)}: the library was not built for this gpu.archs; rebuild the image")
    extra = sorted(set(inv.sass) - set(targets))
    if extra or inv.ptx:
        problems.append(f"code beyond gpu.archs: {', '.join(extra + inv.ptx)}")
    if sorted(man.get("archs", [])) != sorted(targets):
        problems.append(f"{kbuild.MANIFEST} lists {', '.join(man.get('archs', []))}, gpu.archs is {', '.join(targets)}")
    if problems:
        return Check("kernels", "fail", f"{kbuild.FP8_LIBRARY}: " + "; ".join(problems), detail)
    return Check(
        "kernels",
        "pass",
        f"{kbuild.FP8_LIBRARY} (nvcc {man.get('nvcc')}) has a cubin for exactly {', '.join(inv.sass)} and no PTX",
        detail,
    )


class Kernels:
    name = "kernels"
    needs_engine = False  # speclock's own library: no engine Python needed

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {}

    def run(self, ctx: Context) -> Check:
        return check_kernels(ctx)
