#!/usr/bin/env bash
# One device call per phase (a machine taken back mid-call returns nothing, so phases stay short).
#   run_hostenv.sh setup        join the carried wheelhouse, `speclock host-env` (offline, hash-checked,
#                               the host's CUDA stack version-checked), with the image's kernel library
#   run_hostenv.sh kernels      the image's fp8 kernel library checked against the reference on this GPU (setup runs it)
#   run_hostenv.sh no-cc        doctor + a 4-prompt smoke as the image before the fix (no C compiler): expected to fail
#   run_hostenv.sh cc           selfcheck as the image after the fix (gcc present)
#   run_hostenv.sh bench CONFIGS [SETTINGS-JSON]   tokens/s with and without the drafter
# Everything lands in $OUT; nothing is written into the repository.
set -uo pipefail
S=${STACK:-vllm-0.26.0-torch2.11-cu130} P=/tmp/speclock-parts E=/tmp/speclock-env  # STACK=... for another stack
REPO=$PWD
setup() {
  [ -x "$E/bin/speclock" ] && { echo "host env already in $E"; return 0; }
  cat $P/wh.part* > /tmp/wh312.tar
  echo "$(cat benchmarks/h200/SHA256SUMS.$S)  /tmp/wh312.tar" | sha256sum -c - || return 3
  mkdir -p /tmp/speclock-wh && tar -xf /tmp/wh312.tar -C /tmp/speclock-wh && rm /tmp/wh312.tar
  kernels=()
  if [ -f $P/kernels.tar ]; then  # /opt/speclock/kernels copied out of the stack's built image
    mkdir -p /tmp/speclock-kernels && tar -xf $P/kernels.tar -C /tmp/speclock-kernels
    kernels=(--kernels /tmp/speclock-kernels/kernels)
  fi
  PYTHONPATH="$REPO/src" python3 -m speclock host-env --stack $S --dest $E --target 3.12-x86_64 \
    --wheelhouse /tmp/speclock-wh "${kernels[@]}" \
    --use-host-packages "$(cat benchmarks/h200/host-packages.txt)" --json > "$OUT/host-env.json"
}
case "$1" in
  setup) setup > "$OUT/setup.log" 2>&1; echo "setup exit $?" >> "$OUT/setup.log"; tail -n 25 "$OUT/setup.log"
    [ -d /tmp/speclock-kernels/kernels ] && bash "$0" kernels ;;
  kernels)  # the image's own fp8 kernel library on this GPU, bit-exact against the PyTorch reference
    ( COMPILER=yes; . benchmarks/h200/hostenv.sh
      SPECLOCK_KERNELS_DIR=/tmp/speclock-kernels/kernels PYTHONPATH="$E/speclock/src" timeout 200 $E/bin/python \
        benchmarks/kernels_bench.py --out "$OUT/kernels" --quick --budget-s 150; echo "kernels exit $?" ) > "$OUT/kernels.log" 2>&1
    tail -n 30 "$OUT/kernels.log" ;;
  no-cc)
    ( COMPILER=no; . benchmarks/h200/hostenv.sh
      mkdir -p "$OUT/no-compiler"
      timeout 120 $E/bin/speclock doctor --json > "$OUT/no-compiler/doctor.json"; echo "doctor exit $?"
      timeout 200 $E/bin/speclock smoke --out "$OUT/no-compiler" --num-prompts 4 --max-tokens 16; echo "smoke exit $?" ) > "$OUT/no-compiler.log" 2>&1
    grep -v '^\s*$' "$OUT/no-compiler.log" | tail -n 40 ;;
  cc)
    ( COMPILER=yes; . benchmarks/h200/hostenv.sh
      timeout 500 $E/bin/speclock selfcheck --out "$OUT/with-compiler" --baseline none; echo "selfcheck exit $?" ) > "$OUT/with-compiler.log" 2>&1
    grep -v '^\s*$' "$OUT/with-compiler.log" | tail -n 40 ;;
  bench)
    ( COMPILER=yes; . benchmarks/h200/hostenv.sh
      timeout 540 $E/bin/python benchmarks/h200/spec_throughput.py --stack $E/speclock/stacks/$S.toml \
        --target $E/speclock/target --draft $E/speclock/draft --prompts $E/speclock/prompts/prompts.jsonl \
        --configs "$2" --settings "${3:-{\}}" --out "$OUT/bench.jsonl"; echo "bench exit $?" ) > "$OUT/bench.log" 2>&1
    grep -E '^\{|Error|exit' "$OUT/bench.log" | tail -n 20 ;;
esac
