"""On the build host: what the lent GPU machine needs for `speclock host-env` of several stacks, in parts
that each fit one device call (a call carries at most 64 MiB, the working tree included).

    python benchmarks/gpu/make_parts.py --stacks vllm-0.26.0-torch2.11-cu130,sglang-0.5.15-torch2.11-cu130
    python benchmarks/gpu/make_parts.py --files .carry-train/src --out .carry-train \
        --manifest benchmarks/gpu/train_parts.json --part-bytes 40000000     # the training run (TRAINING.md)

Each part is a self-contained tar (fixed order, mtime 0: the same wheelhouse gives the same bytes) of whole
wheelhouse entries `<sha256>/<file>`, or of numbered pieces of one entry too large for a part. The first
stack's files come first, so its run can start before the later stacks' parts are staged, and a file two
stacks share travels once. The manifest (benchmarks/gpu/parts.json, committed: the device run reads it)
names every part's sha256 and, per stack, how many parts must be staged before its host-env can run.

Which files: the lock's host target (3.12-x86_64) packages and assets, less the packages the GPU host
provides (benchmarks/h200/host-packages.txt, passed to host-env as --use-host-packages), plus, for a stack
with kernels.build, the nvcc toolchain wheels (host-env builds the kernel library from them even where the
host has its own copy of a CUDA runtime package).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "src"))

from speclock.build.wheelhouse import store_dir  # noqa: E402
from speclock.core.names import normalize  # noqa: E402
from speclock.spec.lock import lock_path, read_lock  # noqa: E402
from speclock.spec.resolve import KERNEL_TOOLCHAIN  # noqa: E402
from speclock.spec.stack import load_stack  # noqa: E402

TARGET = "3.12-x86_64"
# 64 MiB per call less the working tree and room for the run's own files: ~4.5 MB once the drafter's weights
# (--repo-file, 19.7 MB) travel in a part instead of in the tree, ~24 MB otherwise (--part-bytes 41000000).
PART_BYTES = 60_000_000
MANIFEST = HERE / "parts.json"


def host_patterns() -> list[str]:
    return [
        normalize(n) if not any(c in n for c in "*?[") else n
        for n in (REPO / "benchmarks/h200/host-packages.txt").read_text().strip().split(",")
    ]


def needed_files(stack_name: str) -> list[tuple[str, Path]]:
    """(`<sha256>/<file>`, path in the wheelhouse) of every file host-env reads for this stack."""
    stack = load_stack(stack_name)
    target = read_lock(lock_path(stack), stack=stack)["targets"][TARGET]
    host = host_patterns()
    toolchain = set(KERNEL_TOOLCHAIN) if stack.kernels else set()
    out = []
    for entry in target["packages"] + target.get("assets", []):
        name = normalize(entry["name"])
        if name not in toolchain and any(fnmatch.fnmatchcase(name, pat) for pat in host):
            continue
        rel = f"{entry['sha256']}/{entry['filename']}"
        path = store_dir() / rel
        if not path.is_file():
            raise SystemExit(f"{path} is missing: run `speclock fetch --stack {stack_name} --target {TARGET}` first")
        out.append((rel, path))
    return out


def folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(`<sha256>/<file>`, path) of every file in `folder` and its subfolders (--files mode: wheels and data
    files for the training run); the same member names as the wheelhouse's, so run.py's staging joins and checks
    them unchanged. Wheels first (the environment is built from them), then the rest, each group by name."""
    files = sorted((p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".log")), key=lambda p: p.name)
    files.sort(key=lambda p: not p.name.endswith(".whl"))
    return [(f"{hashlib.sha256(p.read_bytes()).hexdigest()}/{p.name}", p) for p in files]


def pieces(files: list[tuple[str, Path]], limit: int):
    """(tar member name, path, offset, length) pieces, each at most `limit` bytes."""
    for rel, path in files:
        size = path.stat().st_size
        if size <= limit:
            yield rel, path, 0, size
            continue
        count = -(-size // limit)
        for i in range(count):
            yield f"{rel}.piece-{i:03d}-of-{count:03d}", path, i * limit, min(limit, size - i * limit)


def write_part(dest: Path, members: list[tuple[str, Path, int, int]]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path, offset, length in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = length, 0, 0o644
            with path.open("rb") as f:
                f.seek(offset)
                tar.addfile(info, io.BytesIO(f.read(length)))
    data = buf.getvalue()
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return hashlib.sha256(data).hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stacks", default="", help="comma list, in the order the device run takes them")
    p.add_argument("--files", type=Path, help="instead of --stacks: carry every file of this folder (training run)")
    p.add_argument("--manifest", type=Path, default=MANIFEST, help="where the manifest goes (default parts.json)")
    p.add_argument("--out", default=str(REPO / ".carry"), help="folder for the parts (ignored by git; default .carry)")
    p.add_argument("--part-bytes", type=int, default=PART_BYTES)
    p.add_argument(
        "--repo-file",
        action="append",
        default=[],
        help="a repository file to carry in the first part (then moved out of the tree while staging, "
        "so the tree that travels with every call is smaller); run.py puts it back on the device",
    )
    args = p.parse_args()
    if bool(args.stacks) == bool(args.files):
        p.error("give --stacks or --files (one of them)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = args.part_bytes - 64 * 1024  # tar headers and padding
    seen: set[str] = set()
    parts: list[list[tuple[str, Path, int, int]]] = []
    ready_after: dict[str, int] = {}
    repo_files = {}
    for rel in args.repo_file:
        path = REPO / rel
        if not path.is_file():
            raise SystemExit(f"--repo-file {rel}: no such file (restore it: git checkout -- {rel})")
        repo_files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    groups = [str(args.files)] if args.files else args.stacks.split(",")
    for stack in groups:
        listed = folder_files(Path(stack)) if args.files else needed_files(stack)
        new = [(rel, path) for rel, path in listed if rel not in seen]
        if not parts and repo_files:  # the first stack's parts carry the repository files
            new += [(f"repo/{rel}", REPO / rel) for rel in repo_files]
        seen.update(rel for rel, _ in new)
        first = len(parts)  # a stack's files go in parts of its own: its run needs none of the next stack's
        order = new if args.files else sorted(new, key=lambda f: -f[1].stat().st_size)  # --files: wheels first
        for piece in pieces(order, budget):
            # first fit, largest first: fewer parts, so fewer device calls
            home = next((m for m in parts[first:] if sum(x[3] + 1024 for x in m) + piece[3] + 1024 <= budget), None)
            if home is None:
                parts.append(home := [])
            home.append(piece)
        ready_after["files" if args.files else stack] = len(parts)
    for old in out.glob("part-*.tar"):
        old.unlink()
    rows = []
    for i, members in enumerate(parts):
        name = f"part-{i:03d}.tar"
        sha = write_part(out / name, members)
        rows.append({"name": name, "sha256": sha, "bytes": (out / name).stat().st_size, "members": [m[0] for m in members]})
        print(f"{name}: {len(members)} members, {rows[-1]['bytes'] / 1e6:.1f} MB", flush=True)
    manifest = {
        "schema": "speclock.gpu-parts/v1",
        "target": TARGET,
        "stacks": [] if args.files else args.stacks.split(","),
        "ready_after": ready_after,
        "repo_files": repo_files,
        "parts": rows,
    }
    if args.files:  # what the training run finds staged: file name -> `<sha256>/<file>`
        manifest["files"] = {rel.split("/", 1)[1]: rel for rel, _ in folder_files(args.files)}
        manifest["total_bytes"] = sum(r["bytes"] for r in rows)
    dest = args.manifest.resolve()
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(dest)
    shown = dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest
    print(f"{len(rows)} parts in {out}; manifest {shown}; ready after: {ready_after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
