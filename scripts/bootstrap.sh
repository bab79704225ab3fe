#!/usr/bin/env bash
# Set up a build host (Debian/Ubuntu, as root): container tools, a running dockerd, and the
# Python environment for speclock, its tests and its training code. Idempotent: a second run
# reuses what is there (the venv is rebuilt only when its lock, scripts/requirements-host.lock.txt, changes).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SPECLOCK_VENV:-/opt/speclock-venv}
log() { printf '[bootstrap %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [ "$(id -u)" != 0 ]; then echo "bootstrap.sh must run as root (it installs Debian packages and starts dockerd)" >&2; exit 3; fi

# podman: the second runtime of `speclock run-image --runtime podman` (GPUs through CDI); it shares
# buildah's image store (containers-storage), so buildah builds run without a copy.
PKGS="docker.io buildah skopeo podman mmdebstrap debootstrap docker-registry uidmap fuse-overlayfs ca-certificates git nix-bin"
missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"; done)
if [ -n "$missing" ]; then
  log "installing Debian packages: $(echo $missing)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends $missing >/dev/null
fi

# dockerd does not start by itself on these hosts; the Debian CLI (/usr/bin/docker) drives BuildKit.
if ! /usr/bin/docker info >/dev/null 2>&1; then
  log "starting dockerd"
  setsid dockerd --iptables=false --ip-masq=false >/var/log/speclock-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 0.5; done
  /usr/bin/docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/speclock-dockerd.log" >&2; exit 3; }
fi

stamp="$VENV/.speclock-requirements.sha256"
# The venv is the committed lock of the host environment, scripts/requirements-host.lock.txt: every package at
# one version with its wheel's sha256 (python scripts/lock_host.py re-locks it from scripts/requirements-*.txt
# and locks/cpu-vllm.lock). Nothing is resolved here, so every machine gets the same wheels; the venv is
# rebuilt only when the lock changes (the editable install below is cheap).
lock="$ROOT/scripts/requirements-host.lock.txt"
want=$(sha256sum "$lock" | cut -d" " -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "creating the Python environment $VENV from $(basename "$lock") (about 20 s with uv, 1-2 min with pip)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  pip_hashed() { "$VENV/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps --only-binary :all: "$@"; }
  # --no-deps: the lock is the whole environment; the cpu-vllm stack's excluded packages (PyPI's CUDA
  # torchvision/torchaudio, which break imports next to CPU torch) are left out of it and never arrive.
  # uv installs it (about 4x faster than pip from an empty cache, docs/install.md), itself taken from the
  # lock, hash-checked, by the venv's pip. uv does not read pip's configuration, so the machine's package
  # sources (find-links, local indexes) are handed over; "unsafe-best-match" lets one package come from any
  # of them, which the hashes make safe. Should uv fail, pip installs the same lock.
  only=$(mktemp)
  grep -E '^uv==' "$lock" > "$only"
  mapfile -t uv_args < <("$VENV/bin/python" - <<'PY'
import ast, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
flags = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url"}
args: list[str] = []
for line in out.splitlines():
    key, _, value = line.partition("=")
    flag = flags.get(key.rsplit(".", 1)[-1])
    for v in ast.literal_eval(value).split() if flag else []:
        if v not in args:
            args += [flag, v]
print("\n".join(args))
PY
)
  if ! { pip_hashed -r "$only" && "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --require-hashes --no-deps \
      --only-binary :all: --index-strategy unsafe-best-match "${uv_args[@]}" -r "$lock"; }; then
    log "uv could not install the lock; installing it with pip"
    grep -E '^pip==' "$lock" > "$only"
    pip_hashed -r "$only"
    pip_hashed -r "$lock"
  fi
  rm -f "$only"
  echo "$want" > "$stamp"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT" 2>/dev/null \
  || "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e "$ROOT"
log "ready: $VENV (activate with: . $VENV/bin/activate)"
