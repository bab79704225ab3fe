#!/usr/bin/env bash
# Runs on the lent GPU machine: keep one carried part in /tmp/speclock-parts (a carried folder is
# removed there by the next call that does not name it), and print what the machine has, once.
set -euo pipefail
mkdir -p /tmp/speclock-parts
for f in .carry/*; do [ -f "$f" ] && cp "$f" /tmp/speclock-parts/ && echo "staged $(basename "$f") $(stat -c %s "$f")"; done
ls -la /tmp/speclock-parts
if [ "${1:-}" = "--probe" ]; then
  mkdir -p "$OUT"
  { python3 -V; which python3 gcc cc clang g++ nvcc zstd xz || true; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true;
    nproc; free -g; df -h /tmp; } > "$OUT/machine.txt" 2>&1
  python3 -m pip list --format json > "$OUT/pip-list.json" 2>/dev/null || true
  python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_arch_list())" >> "$OUT/machine.txt" 2>&1 || true
  cat "$OUT/machine.txt"
fi
