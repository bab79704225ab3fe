"""The GPU run in one command, run on the lent GPU machine once per device call:

    python3 benchmarks/gpu/run.py [--budget-s 540] [--only PHASE,...] [--retry PHASE,...]

Every call does what is due next and stops before its budget is spent (a call may run at most 600 s):
  1. stage the wheelhouse parts the call carries (.carry/part-NNN.tar, benchmarks/gpu/parts.json: sha256
     checked, pieces joined, each file's sha256 checked against its wheelhouse name) in /tmp/speclock-gpu;
  2. then, in order, each phase not yet done: `machine` (what the host is), per stack of the manifest
     `<engine>-env` (speclock host-env, offline, hash-checked, the host's CUDA stack version-checked, the
     kernel library built from the lock's nvcc wheels), `<engine>-selfcheck` (doctor, smoke, gate under the
     image's limits: benchmarks/h200/hostenv.sh), for vLLM `vllm-fault-eager` (the drafter forced to eager
     mode: the gate must FAIL on speed), then `bench-<engine>-<i>-<config>` (tokens/s at batch 1 and 80 per
     draft length, each configuration in a process of its own, plain first and last).
A phase whose files must come from parts not yet staged waits for them.

Where it resumes: the results of each call land in $OUT/<run>/ (<run> = <date>-<gpu>, e.g.
2026-12-06-h100), which the caller copies into docs/gpu-runs/<run>/ (benchmarks/gpu/collect.py: whole
files or nothing). A phase is done when its result is there (it travels back with the working tree) or
was finished by an earlier call on this same machine (/tmp/speclock-gpu/done/). A machine taken back
mid-call returns nothing, so nothing half-written reaches the repository; staged parts and built
environments go with the machine, and the next call starts staging again. A failed phase is recorded
(exit code and log) and counts as done: `--retry PHASE` runs it again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "benchmarks/gpu/parts.json"
HOSTENV_SH = REPO / "benchmarks/h200/hostenv.sh"
HOST_PACKAGES = (REPO / "benchmarks/h200/host-packages.txt").read_text().strip()
STATE = Path(os.environ.get("SPECLOCK_GPU_STATE", "/tmp/speclock-gpu"))  # the device's /tmp goes with the machine
WH, PIECES, DONE = STATE / "wh", STATE / "pieces", STATE / "done"
BENCH_CONFIGS = ["plain", "1", "2", "3", "4", "5", "plain"]
# Seconds a phase may need at most (measured on the H100, 2026-12-06: host-env 74 s vLLM / 105 s SGLang,
# selfcheck 361 s / 304 s, three engine starts of 65-77 s included; since 2026-12-07 the self-check also warms up until
# steady and times 80 requests at once in runs of 3+ s per engine, about a minute more); a phase starts only when the
# call has that much left, so a call never runs into the device's 600 s limit and loses its results.
ESTIMATE = {"machine": 20, "env": 150, "selfcheck": 480, "fault": 330, "bench": 150, "profile": 150}


def log(msg: str) -> None:
    print(f"[gpu-run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- staging
def stage(manifest: dict, carry: Path = REPO / ".carry") -> set[str]:
    """Unpack the carried parts; returns the names of every part staged on this machine so far."""
    by_name = {p["name"]: p for p in manifest["parts"]}
    STATE.mkdir(parents=True, exist_ok=True)  # a first call whose part is refused still records what is staged
    staged_file = STATE / "staged.json"
    staged = set(json.loads(staged_file.read_text())) if staged_file.is_file() else set()
    for part in sorted(carry.glob("part-*.tar")):
        row = by_name.get(part.name)
        if row is None or part.name in staged:
            continue
        if sha256(part) != row["sha256"]:
            log(f"{part.name}: sha256 differs from the manifest; not staged (make the parts again)")
            continue
        with tarfile.open(part) as tar:
            for member in tar.getmembers():
                if member.name.startswith("repo/"):  # a repository file (make_parts --repo-file)
                    dest = STATE / member.name
                else:
                    dest = (PIECES if ".piece-" in member.name else WH) / member.name
                if not dest.resolve().is_relative_to(STATE.resolve()) or not member.isfile():
                    raise SystemExit(f"{part.name}: unexpected member {member.name}")
                dest.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(dest.with_name(dest.name + ".tmp"), "wb") as out:
                    shutil.copyfileobj(src, out)
                os.replace(dest.with_name(dest.name + ".tmp"), dest)
        staged.add(part.name)
        log(f"staged {part.name} ({row['bytes'] / 1e6:.1f} MB)")
    join_pieces()
    staged_file.write_text(json.dumps(sorted(staged)))
    restore_repo_files(manifest)
    return staged


def restore_repo_files(manifest: dict) -> None:
    """Put back the repository files that travelled in a part (each call's tree is a fresh copy without them)."""
    for rel, digest in manifest.get("repo_files", {}).items():
        dest, src = REPO / rel, STATE / "repo" / rel
        if dest.is_file() or not src.is_file():
            continue
        if sha256(src) != digest:
            raise SystemExit(f"{rel}: the staged copy does not match the manifest's sha256")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        log(f"restored {rel} from the staged parts")


def join_pieces() -> None:
    for first in PIECES.rglob("*.piece-000-of-*"):
        stem, count = first.name.split(".piece-000-of-")
        parts = [first.with_name(f"{stem}.piece-{i:03d}-of-{count}") for i in range(int(count))]
        if not all(p.is_file() for p in parts):
            continue
        rel = first.relative_to(PIECES).parent / stem
        dest = WH / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".tmp")
        with tmp.open("wb") as out:
            for p in parts:
                out.write(p.read_bytes())
        if sha256(tmp) != rel.parts[0]:
            tmp.unlink()
            raise SystemExit(f"{rel}: the joined pieces do not match the file's sha256")
        os.replace(tmp, dest)
        for p in parts:
            p.unlink()
        log(f"joined {stem} from {count} pieces")


# ---------------------------------------------------------------- phases
class Run:
    def __init__(self, args: argparse.Namespace, manifest: dict, staged: set[str]):
        self.args, self.manifest, self.staged = args, manifest, staged
        self.deadline = time.monotonic() + args.budget_s
        self.gpu = gpu_short_name()
        self.run_id = os.environ.get("RUN_ID") or f"{time.strftime('%Y-%m-%d', time.gmtime())}-{self.gpu}"
        self.repo_dir = REPO / "docs/gpu-runs" / self.run_id  # earlier calls' results, collected
        self.out = Path(os.environ.get("OUT", "/tmp/speclock-gpu/out")) / self.run_id
        self.out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def done(self, phase: str) -> bool:
        if phase in self.args.retry:
            return (DONE / phase).is_file() and (DONE / phase).stat().st_mtime > START_WALL
        return (self.repo_dir / "phases" / f"{phase}.json").is_file() or (DONE / phase).is_file()

    def finish(self, phase: str, code: int, seconds: float, **extra) -> None:
        row = {"phase": phase, "exit": code, "seconds": round(seconds, 1), "gpu": self.gpu, **extra}
        (self.out / "phases").mkdir(exist_ok=True)
        (self.out / "phases" / f"{phase}.json").write_text(json.dumps(row, indent=1) + "\n")
        DONE.mkdir(parents=True, exist_ok=True)
        (DONE / phase).write_text(json.dumps(row))
        log(f"{phase}: exit {code} in {seconds:.0f} s")

    def sh(self, phase: str, script: str, estimate: int, **extra) -> int | None:
        """Run `script` under bash for `phase`, its output in <out>/<phase>.log; None when the call has too
        little time left for it (the next call runs it)."""
        if self.left() < estimate:
            log(f"{phase}: needs up to {estimate} s, {self.left():.0f} s left in this call: next call")
            return None
        log(f"{phase}: starting ({self.left():.0f} s left)")
        t0 = time.monotonic()
        timeout = int(self.left() - 15)
        env = {**os.environ, "REPO": str(REPO), "R": str(self.out), "HOST_PACKAGES": HOST_PACKAGES, "PYTHONUNBUFFERED": "1"}
        with (self.out / f"{phase}.log").open("w") as logf:
            try:
                code = subprocess.run(
                    ["bash", "-c", f"set -o pipefail; {script}"],
                    cwd=REPO,
                    env=env,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                ).returncode
            except subprocess.TimeoutExpired:
                code = 124
        tail = (self.out / f"{phase}.log").read_text(errors="replace").splitlines()[-25:]
        print("\n".join(f"    {line}" for line in tail), flush=True)
        self.finish(phase, code, time.monotonic() - t0, **extra)
        return code


def gpu_short_name() -> str:
    try:
        name = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "nogpu"
    for short in ("H100", "H200", "B200", "B300", "GB200", "A100", "L40S"):
        if short in name:
            return short.lower()
    return name.split()[-1].lower()


def engine_of(stack: str) -> str:
    return stack.split("-")[0]


def env_script(stack: str, env_dir: Path) -> str:
    return (
        f". {HOSTENV_SH}; PYTHONPATH={REPO}/src python3 -m speclock host-env --stack {stack} --dest {env_dir} "
        f'--target 3.12-x86_64 --wheelhouse {WH} --use-host-packages "$HOST_PACKAGES" --json > $R/{engine_of(stack)}/host-env.json'
    )


def selfcheck_script(stack: str, env_dir: Path) -> str:
    baseline = "auto" if (REPO / "baselines" / stack).is_dir() else "none"
    # outputs to /tmp, then its files to $R/<engine>-selfcheck/: the device tool brings back files at most three
    # folders below $OUT (on 2026-12-06 it left out <run>/<engine>/selfcheck/ whole, the vLLM report with it)
    res = f"/tmp/speclock-gpu/res/{engine_of(stack)}/selfcheck"
    dest = f"$R/{engine_of(stack)}-selfcheck"
    return (
        f". {HOSTENV_SH}; rm -rf {res}; {env_dir}/bin/speclock selfcheck --out {res} --baseline {baseline}; rc=$?; "
        f"mkdir -p {dest}; find {res} -maxdepth 1 -type f -exec cp {{}} {dest}/ \\; ; exit $rc"
    )


OWN = "own-vllm"  # the stack `stack new` writes on the GPU machine (issue #36 item 5)


def own_env_script(stack: str, env_dir: Path) -> str:
    """Bring your own model on the GPU: `stack new` for the engine release of `stack` with the target the engine's env
    converted (a folder outside the repository, mounted at run time), its lock carried from the committed lock
    (`lock --from-lock`: no network here) with the folder's identity pinned, and its own environment built by host-env
    with `--model` (the host-env form of run-image's mount)."""
    eng, version = engine_of(stack), stack.split("-")[1]
    cli = f"PYTHONPATH={REPO}/src python3 -m speclock"
    return (
        f". {HOSTENV_SH}; set -e; mkdir -p $R/{OWN}; T=$(readlink -f {env_dir}/speclock/target); "
        f"{cli} stack new --engine {eng} --engine-version {version} --gpu {gpu_short_name()} --target $T "
        f"--draft models/smollm2-135m-eagle3 --name {OWN} --force --json > $R/{OWN}/stack-new.json; "
        f"cp stacks/{OWN}.toml $R/{OWN}/; "
        f"{cli} lock --stack {OWN} --from-lock locks/{stack}.lock; {cli} lock --stack {OWN} --check; "
        f"cp locks/{OWN}.lock $R/{OWN}/; "
        f"{cli} host-env --stack {OWN} --dest {STATE / f'env-{OWN}'} --target 3.12-x86_64 --wheelhouse {WH} "
        f'--use-host-packages "$HOST_PACKAGES" --model $T --json > $R/{OWN}/host-env.json'
    )


def own_selfcheck_script() -> str:
    """The own-model environment's self-check (doctor with model-identity, smoke, gate), as for the committed stacks;
    then doctor on a copy of the target with one weight byte changed, which must be exit 2 naming the file."""
    own_dir = STATE / f"env-{OWN}"
    res, dest, other = f"/tmp/speclock-gpu/res/{OWN}/selfcheck", f"$R/{OWN}-selfcheck", "/tmp/speclock-gpu/other-model"
    return (
        f". {HOSTENV_SH}; rm -rf {res}; {own_dir}/bin/speclock selfcheck --out {res} --baseline none; rc=$?; "
        f"mkdir -p {dest}; find {res} -maxdepth 1 -type f -exec cp {{}} {dest}/ \\; ; "
        f"rm -rf {other}; cp -r $(readlink -f {own_dir}/speclock/target) {other}; "
        f"python3 - {other}/model.safetensors <<'PY'\n"
        "import sys\n"
        "with open(sys.argv[1], 'r+b') as f:\n"
        "    f.seek(-1, 2); b = f.read(1); f.seek(-1, 2); f.write(bytes([b[0] ^ 1]))\n"
        "PY\n"
        f"{own_dir}/bin/speclock doctor --target {other} --only model-identity > {dest}/other-model-doctor.txt 2>&1; "
        f'echo "other model: doctor exit $?" >> {dest}/other-model-doctor.txt; exit $rc'
    )


def fault_eager_script(stack: str, env_dir: Path) -> str:
    """The drafted engine with its drafter in eager mode (no CUDA graphs: each drafter pass a chain of small launches),
    slower than plain at batch 1: smoke and the gate must FAIL naming the speed threshold. 16 prompts x 32 tokens for
    the lossless/acceptance pass (the batch-1 measurement keeps the stack's smoke.speed_*)."""
    return (
        f". {HOSTENV_SH}; S={env_dir}/speclock/stacks/{stack}.toml; mkdir -p /tmp/speclock-gpu/fault; "
        f"F=/tmp/speclock-gpu/fault/{stack}.toml; "
        'python3 - "$S" "$F" <<\'PY\'\n'
        "import re, sys\n"
        "s = open(sys.argv[1]).read()\n"
        "s, n = re.subn(r'^settings = \\{ ', 'settings = { speculative_config = { enforce_eager = true }, ', s, count=1, flags=re.M)\n"
        "assert n == 1, 'no [engine] settings line'\n"
        "open(sys.argv[2], 'w').write(s)\n"
        "PY\n"
        "rm -rf /tmp/speclock-gpu/res/fault; "
        f"{env_dir}/bin/speclock smoke --stack $F --num-prompts 16 --max-tokens 32 --out /tmp/speclock-gpu/res/fault; "
        "echo smoke exit $?; mkdir -p $R/vllm-fault-eager; "
        "find /tmp/speclock-gpu/res/fault -maxdepth 1 -type f -exec cp {} $R/vllm-fault-eager/ \\; ; "
        f"{env_dir}/bin/speclock gate $R/vllm-fault-eager/report.json --stack $F --baseline none "
        "--markdown $R/vllm-fault-eager/gate.md; echo gate exit $?"
    )


def fault_slow_script(stack: str, env_dir: Path) -> str:
    """SGLang's drill (the eager-drafter drill is vLLM's): every drafted step sleeps 20 ms (benchmarks/gpu/faults/
    sitecustomize.py, loaded in every engine process through PYTHONPATH), so the drafted engine is slower than plain
    at batch 1: smoke and the gate must FAIL naming smoke.thresholds.min_speedup."""
    eng = engine_of(stack)
    return (
        f". {HOSTENV_SH}; rm -rf /tmp/speclock-gpu/res/fault-slow; "
        f"PYTHONPATH={REPO}/benchmarks/gpu/faults SPECLOCK_FAULT=slow:20 {env_dir}/bin/speclock smoke --num-prompts 16 "
        "--max-tokens 32 --speed-concurrent 0 --out /tmp/speclock-gpu/res/fault-slow; "
        f"echo smoke exit $?; mkdir -p $R/{eng}-fault-slow; "
        f"find /tmp/speclock-gpu/res/fault-slow -maxdepth 1 -type f -exec cp {{}} $R/{eng}-fault-slow/ \\; ; "
        f"{env_dir}/bin/speclock gate $R/{eng}-fault-slow/report.json --baseline none "
        f"--markdown $R/{eng}-fault-slow/gate.md; echo gate exit $?"
    )


def bench_script(stack: str, env_dir: Path, phase: str, config: str) -> str:
    return (
        f". {HOSTENV_SH}; mkdir -p $R/bench; {env_dir}/bin/python {REPO}/benchmarks/h200/spec_throughput.py "
        f"--stack {env_dir}/speclock/stacks/{stack}.toml --target {env_dir}/speclock/target "
        f"--draft {env_dir}/speclock/draft --prompts {env_dir}/speclock/prompts/prompts.jsonl "
        f"--configs {config} --out $R/bench/{phase}.jsonl"
    )


def plan_script(stack: str, env_dir: Path, row: dict) -> str:
    """A phase of a --plan file: `profile` (profile_step.py: one engine, batch-1 steps, a summary of the trace) or
    `bench` (spec_throughput.py over row["configs"]), each with row["settings"] merged over the stack's."""
    settings = json.dumps(row.get("settings", {})).replace("'", "")
    common = (
        f"--stack {env_dir}/speclock/stacks/{stack}.toml --target {env_dir}/speclock/target "
        f"--draft {env_dir}/speclock/draft --prompts {env_dir}/speclock/prompts/prompts.jsonl --settings '{settings}'"
    )
    if row["kind"] == "profile":
        return (
            f". {HOSTENV_SH}; mkdir -p $R/profile; {env_dir}/bin/python {REPO}/benchmarks/gpu/profile_step.py {common} "
            f"--k {int(row['k'])} --tokens {int(row.get('tokens', 64))} --label {row['phase']} --out $R/profile"
        )
    return (
        f". {HOSTENV_SH}; mkdir -p $R/bench; {env_dir}/bin/python {REPO}/benchmarks/h200/spec_throughput.py {common} "
        f"--configs {row['configs']} --out $R/bench/{row['phase']}.jsonl"
        + (f" --k-per-batch-size '{json.dumps(row['k_per_batch_size'])}'" if row.get("k_per_batch_size") else "")
    )


def load_plan(path: Path, stacks: list[str]) -> list[dict]:
    """The phases of a plan file, checked: each names a kind, an engine of the manifest's stacks and a unique phase."""
    rows = json.loads(path.read_text())["phases"]
    seen: set[str] = set()
    by_engine = {engine_of(s): s for s in stacks}
    for i, row in enumerate(rows):
        where = f"{path}: phases[{i}]"
        if row.get("kind") not in ("profile", "bench"):
            raise SystemExit(f"{where}: kind must be profile or bench, not {row.get('kind')!r}")
        if row.get("engine") not in by_engine:
            raise SystemExit(f"{where}: engine must be one of {sorted(by_engine)}, not {row.get('engine')!r}")
        if row["kind"] == "profile" and not isinstance(row.get("k"), int):
            raise SystemExit(f"{where}: a profile needs an integer k (0: plain)")
        if row["kind"] == "bench" and not isinstance(row.get("configs"), str):
            raise SystemExit(f'{where}: a bench needs configs, e.g. "plain,3"')
        if not isinstance(row.get("phase"), str) or not row["phase"].replace("-", "").isalnum() or row["phase"] in seen:
            raise SystemExit(f"{where}: phase must be a unique name of letters, digits and dashes")
        seen.add(row["phase"])
        row["stack"] = by_engine[row["engine"]]
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-s", type=int, default=540, help="stop starting phases after this many seconds")
    p.add_argument("--only", default="", help="comma list of phase prefixes to run ('none': stage only; default: all due)")
    p.add_argument("--retry", default="", help="comma list of phases to run again although done")
    p.add_argument("--bench-configs", default=",".join(BENCH_CONFIGS))
    p.add_argument("--plan", type=Path, help="a JSON plan of profile/bench phases to run instead of the default list")
    args = p.parse_args()
    args.retry = {x for x in args.retry.split(",") if x}
    only = [x for x in args.only.split(",") if x]
    manifest = json.loads(MANIFEST.read_text())
    staged = stage(manifest)
    run = Run(args, manifest, staged)
    names = [row["name"] for row in manifest["parts"]]
    log(f"run {run.run_id}: {len(staged)} of {len(names)} parts staged; {run.left():.0f} s in this call")
    wanted = (lambda ph: any(ph.startswith(o) for o in only)) if only else (lambda ph: True)

    # What is due, in order: the verdicts first (each stack's self-check, the fault drill), the throughput table last.
    tasks: list[tuple[str, str | None, str, int]] = [("machine", None, "", ESTIMATE["machine"])]
    plan = {row["phase"]: row for row in load_plan(args.plan, manifest["stacks"])} if args.plan else {}
    for row in plan.values():
        tasks.append((row["phase"], row["stack"], "plan", ESTIMATE[row["kind"]]))
    for stack in [] if plan else manifest["stacks"]:
        eng = engine_of(stack)
        tasks.append((f"{eng}-selfcheck", stack, "selfcheck", ESTIMATE["selfcheck"]))
        if eng == "vllm":
            tasks.append(("vllm-fault-eager", stack, "fault", ESTIMATE["fault"]))
            tasks.append((f"{OWN}-env", stack, "own-env", ESTIMATE["env"]))
            tasks.append((f"{OWN}-selfcheck", stack, "own-selfcheck", ESTIMATE["selfcheck"]))
        if eng == "sglang":
            tasks.append(("sglang-fault-slow", stack, "fault-slow", ESTIMATE["fault"]))
    for stack in [] if plan else manifest["stacks"]:
        for i, config in enumerate(args.bench_configs.split(",")):
            tasks.append((f"bench-{engine_of(stack)}-{i}-{config}", stack, "bench", ESTIMATE["bench"]))
    machine_probe = (
        "{ python3 -V; which python3 gcc g++ nvcc || true; nvidia-smi; nproc; free -g; df -h /tmp; "
        "python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, "
        "torch.cuda.get_device_name(0))'; } > $R/machine.txt 2>&1; cat $R/machine.txt"
    )
    env_failed: set[str] = set()
    for phase, stack, kind, estimate in tasks:
        if not wanted(phase) or run.done(phase):
            continue
        if stack is None:
            run.sh(phase, machine_probe, estimate)
            continue
        eng = engine_of(stack)
        env_dir = STATE / f"env-{eng}"
        if stack in env_failed:
            continue
        if not (env_dir / "bin/speclock").exists():
            missing = [n for n in names[: manifest["ready_after"][stack]] if n not in staged]
            if missing:
                log(f"{phase}: {stack} waits for {len(missing)} parts ({missing[0]} .. {missing[-1]})")
                continue
            (run.out / eng).mkdir(exist_ok=True)
            code = run.sh(f"{eng}-env", env_script(stack, env_dir), ESTIMATE["env"], stack=stack)
            if code is None:
                break
            if code != 0:
                log(f"{stack}: host-env failed (exit {code}); its phases are skipped in this call")
                env_failed.add(stack)
                continue
        (run.out / eng).mkdir(exist_ok=True)
        script = {
            "selfcheck": lambda stack=stack, env_dir=env_dir: selfcheck_script(stack, env_dir),
            "fault": lambda stack=stack, env_dir=env_dir: fault_eager_script(stack, env_dir),
            "fault-slow": lambda stack=stack, env_dir=env_dir: fault_slow_script(stack, env_dir),
            "own-env": lambda stack=stack, env_dir=env_dir: own_env_script(stack, env_dir),
            "own-selfcheck": own_selfcheck_script,
            "bench": lambda stack=stack, env_dir=env_dir, phase=phase: bench_script(
                stack, env_dir, phase, phase.rsplit("-", 1)[1]
            ),
            "plan": lambda stack=stack, env_dir=env_dir, phase=phase: plan_script(stack, env_dir, plan.get(phase, {})),
        }[kind]()
        expect = {"expect": "gate exit 1 (batch-1 speed below smoke.thresholds.min_speedup)"}
        extra = expect if kind.startswith("fault") else {}
        if run.sh(phase, script, estimate, stack=stack, **extra) is None:
            break
    pending = [n for n in names if n not in staged]
    bundle = pack_results(run.out)
    log(
        f"end of call: {len(staged)}/{len(names)} parts staged"
        + (f", next part {pending[0]}" if pending else "")
        + f"; results in {bundle or run.out}"
    )
    return 0


def pack_results(out: Path) -> Path | None:
    """The call's result files as one <run>.results.tar.gz beside <run>/ (the device tool brings back at most 8 files
    a call; a call with several phases writes more). collect.py unpacks it. None when the call wrote nothing."""
    files = sorted(p for p in out.rglob("*") if p.is_file())
    if not files:
        return None
    bundle = out.parent / f"{out.name}.results.tar.gz"
    tmp = bundle.with_name(bundle.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(out.parent)))
    os.replace(tmp, bundle)
    shutil.rmtree(out)
    return bundle


START_WALL = time.time()

if __name__ == "__main__":
    sys.exit(main())
