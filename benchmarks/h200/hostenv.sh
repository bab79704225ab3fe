# Sourced: the limits of the stack's image applied to a host run on the lent GPU machine.
# No nvcc / CUDA toolkit (the image has neither: CUDA_HOME points nowhere, /usr/local/cuda/bin is off
# PATH), no network (the machine has none). COMPILER=no also takes every C compiler off PATH (the
# image before the fix); COMPILER=yes keeps gcc (the image after it: base.packages has gcc).
export CUDA_HOME=/nonexistent-cuda CUDA_PATH=/nonexistent-cuda
unset CC CXX
NOCC=/tmp/speclock-nocc-bin
if [ "${COMPILER:-yes}" = no ]; then
  rm -rf "$NOCC" && mkdir -p "$NOCC"
  for d in /opt/torch/.venv/bin /usr/local/bin /usr/bin /bin; do
    for f in "$d"/*; do
      b=$(basename "$f")
      case "$b" in cc|c++|gcc*|g++*|clang*|cpp*|x86_64-linux-gnu-*|tcc|ld|ld.*|as|nvcc) continue;; esac
      [ -e "$NOCC/$b" ] || ln -s "$f" "$NOCC/$b"
    done
  done
  export PATH="$NOCC"
else
  export PATH="/opt/torch/.venv/bin:/usr/local/bin:/usr/bin:/bin"
fi
echo "host run as the image: COMPILER=${COMPILER:-yes} gcc=$(command -v gcc || echo none) nvcc=$(command -v nvcc || echo none) CUDA_HOME=$CUDA_HOME"
