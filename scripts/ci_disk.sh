#!/usr/bin/env bash
# Make room for a CI run before it starts, on a machine that may keep state from earlier runs.
#
# The suite writes about 6 GB of its own temporary files per run (tests/ builds real images and
# engine envs), on top of the caches it reuses (engine envs, wheelhouse, image layers). A run that
# starts with too little free space fails half-way with ENOSPC in hundreds of tests, which says
# nothing about the change under test. So: reclaim what earlier runs left, in order of cost to the
# next run, and refuse to start (exit 3, naming the biggest folders) when that is not enough.
#
#   SPECLOCK_CI_MIN_FREE_GB   free space the run needs (default 20)
#   SPECLOCK_CI_PYTEST_TMP    pytest's per-user temporary root (default /tmp/pytest-of-$USER)
#   SPECLOCK_CI_PRUNE_IMAGES  0: never prune image stores (default 1: only when still short)
#   SPECLOCK_CI_STORES        the image stores' folders (default: /var/lib/docker /var/lib/containers)
set -euo pipefail
need=${SPECLOCK_CI_MIN_FREE_GB:-20}
pytest_tmp=${SPECLOCK_CI_PYTEST_TMP:-/tmp/pytest-of-$(id -un)}
prune_images=${SPECLOCK_CI_PRUNE_IMAGES:-1}
cache=${SPECLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/speclock}
stores=${SPECLOCK_CI_STORES:-/var/lib/docker /var/lib/containers}
log() { printf '[ci-disk %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

case "$need" in '' | *[!0-9]*) echo "ci_disk.sh: SPECLOCK_CI_MIN_FREE_GB=$need is not a whole number of GB" >&2; exit 2 ;; esac

# The paths a run writes to; they may sit on different filesystems, so the least free one counts.
paths() { for p in "${TMPDIR:-/tmp}" "$cache" $stores; do if [ -e "$p" ]; then echo "$p"; fi; done; }
free_gb() { paths | xargs df -P --block-size=1G | awk 'NR > 1 { if (min == "" || $4 < min) min = $4 } END { print min + 0 }'; }

log "free: $(free_gb) GB, this run needs $need GB"

# 1. Temporary folders of earlier pytest runs (a green run keeps none, see pyproject.toml; a red one
#    keeps its own for reading). Only those untouched for an hour: a run in progress is left alone.
if [ -d "$pytest_tmp" ]; then
  stale=$(find "$pytest_tmp" -mindepth 1 -maxdepth 1 -type d -name 'pytest-[0-9]*' -mmin +60 | sort)
  if [ -n "$stale" ]; then
    log "removing $(echo "$stale" | wc -l) temporary folder(s) of earlier test runs: $(du -csh $stale | tail -1 | cut -f1)"
    echo "$stale" | xargs rm -rf
  fi
fi
[ "$(free_gb)" -ge "$need" ] && { log "enough: $(free_gb) GB free"; exit 0; }

# 2. Still short: image stores (their layers rebuild from the wheel and base caches in minutes).
if [ "$prune_images" = 1 ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    log "pruning docker's unused images and build cache"
    docker image prune -af >/dev/null || true
    docker builder prune -af >/dev/null || true
  fi
  if command -v buildah >/dev/null; then
    log "pruning buildah's unused images"
    buildah rmi --prune >/dev/null 2>&1 || true
    buildah rmi --all >/dev/null 2>&1 || true
  fi
fi
free=$(free_gb)
[ "$free" -ge "$need" ] && { log "enough: $free GB free"; exit 0; }

{
  echo "ci_disk.sh: only $free GB free where the test run writes ($(paths | tr '\n' ' ')); it needs $need GB."
  echo "  the biggest folders there:"
  { du -xsh $(paths) "$cache"/* "$pytest_tmp" 2>/dev/null || true; } | sort -rh | head -8 | sed "s/^/    /"
  echo "  what to do: free space on that disk (e.g. 'rm -rf $cache/envs' drops the cached engine envs, which the"
  echo "  next run reinstalls), or set SPECLOCK_CI_MIN_FREE_GB lower if you know the run needs less, then run CI again."
} >&2
exit 3
