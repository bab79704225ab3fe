#!/usr/bin/env bash
# On the build host (network): everything the lent GPU machine needs for `speclock host-env`, in parts
# of 44 MB (a device call carries at most 64 MiB with the working tree, ~22 MB).
#   benchmarks/h200/make_parts.sh STACK OUTDIR [KERNELS_TAR]
# 1. the lock's 3.12-x86_64 target into the wheelhouse, less the host's CUDA stack (host-packages.txt:
#    torch, triton, torchvision, torchaudio, the nvidia-* CUDA libraries and cuda-toolkit, which the H200
#    has at the lock's versions; host-env version-checks them there), but with every wheel of the nvcc
#    toolchain (spec.resolve.KERNEL_TOOLCHAIN): host-env builds speclock's kernels from those wheels
#    even where the venv takes the same package (nvidia-cuda-runtime) from the host;
# 2. those wheels as one tar in fetch's <sha256>/<file> layout, split, and its sha256;
# 3. optionally the image's kernel library (tar of /opt/speclock/kernels) beside them (then host-env takes it
#    with --kernels instead of building it; without it, the host needs gcc/g++, as the lent machine has).
set -euo pipefail
S=$1 OUTDIR=$2 KTAR=${3:-}
HOST=$(cat "$(dirname "$0")/host-packages.txt")
# fetch leaves out what --use-host-packages names: the kernel toolchain's wheels must not be among them
FETCH_HOST=$(python -c 'import sys; from speclock.spec.resolve import KERNEL_TOOLCHAIN as K
print(",".join(n for n in sys.argv[1].split(",") if n not in K))' "$HOST")
python -m speclock fetch --stack "$S" --target 3.12-x86_64 --use-host-packages "$FETCH_HOST"
WH=${SPECLOCK_CACHE:-$HOME/.cache/speclock}/wheelhouse
mkdir -p "$OUTDIR"
python - "$S" "$HOST" > "$OUTDIR/files.txt" <<'PY'
import json, sys
from speclock.core.names import normalize
from speclock.spec.lock import lock_path
from speclock.spec.resolve import KERNEL_TOOLCHAIN
from speclock.spec.stack import load_stack
stack = load_stack(sys.argv[1]); host = {normalize(n) for n in sys.argv[2].split(",")}
toolchain = set(KERNEL_TOOLCHAIN) if stack.kernels else set()
t = json.loads(lock_path(stack).read_text())["targets"]["3.12-x86_64"]
for p in t["packages"] + t.get("assets", []):
    if normalize(p["name"]) not in host or normalize(p["name"]) in toolchain:
        print(f"{p['sha256']}/{p['filename']}")
PY
tar -cf "$OUTDIR/wh312.tar" -C "$WH" -T "$OUTDIR/files.txt"
(cd "$OUTDIR" && rm -f wh.part* && split -b 44000000 -d -a 2 wh312.tar wh.part && sha256sum wh312.tar | cut -d' ' -f1 > SHA256SUMS.wh312 && rm wh312.tar)
[ -n "$KTAR" ] && cp "$KTAR" "$OUTDIR/kernels.tar"
echo "$(ls "$OUTDIR"/wh.part* | wc -l) parts in $OUTDIR; copy SHA256SUMS.wh312 to benchmarks/h200/SHA256SUMS.$S, the parts to .carry/"
