"""On the build host, after each device call of benchmarks/gpu/run.py: copy what the call returned
($OUT/<run>/..., under the device tool's files_at folder) into docs/gpu-runs/<run>/.

    python benchmarks/gpu/collect.py FILES_AT

SPECLOCK_GPU_RUNS=DIR collects elsewhere (during a run: every call carries the working tree, and a call's
64 MiB hold one staging part beside it, so logs wait outside the tree until the run ends).

Each file is written beside its destination and renamed over it, so the repository holds whole files
only; a call whose machine was taken back returns nothing and changes nothing here. Prints the phases
recorded so far per run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = Path(os.environ.get("SPECLOCK_GPU_RUNS", REPO / "docs/gpu-runs"))


def _write(dest: Path, data: bytes) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
    return dest


def unpack(bundle: Path) -> list[Path]:
    """A call's <run>.results.tar.gz (run.py packs its files so that more than 8 come back): each regular member
    whose path stays inside DOCS, written whole."""
    copied = []
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            rel = Path(member.name)
            if not member.isfile() or rel.is_absolute() or ".." in rel.parts or len(rel.parts) < 2:
                continue
            src = tar.extractfile(member)
            if src is not None:
                copied.append(_write(DOCS / rel, src.read()))
    return copied


def collect(files_at: Path) -> list[Path]:
    copied = []
    for src in sorted(p for p in files_at.rglob("*") if p.is_file()):
        if src.name.endswith(".results.tar.gz"):
            copied += unpack(src)
            continue
        rel = src.relative_to(files_at)
        if len(rel.parts) < 2 or rel.parts[0] in ("", ".", ".."):
            continue
        dest = DOCS / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        copied.append(dest)
    return copied


def main() -> int:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    files_at = Path(sys.argv[1])
    copied = collect(files_at)
    runs = sorted({p.relative_to(DOCS).parts[0] for p in copied})
    print(f"{len(copied)} files into {', '.join(str(DOCS / r) for r in runs) or '(nothing returned)'}")
    for run in runs:
        for marker in sorted((DOCS / run / "phases").glob("*.json")):
            row = json.loads(marker.read_text())
            print(f"  {run} {row['phase']}: exit {row['exit']} in {row['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
