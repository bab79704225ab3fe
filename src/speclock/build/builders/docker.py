"""docker with BuildKit: the builder most users have. Not reproducible (mtimes, `created`)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from speclock.build.builders._proc import build_failure, capture, stream, tool_json
from speclock.build.records import ImageLayer
from speclock.build.registry.client import registry_digest
from speclock.core.errors import CheckFailed, EnvironmentProblem

# dockerd's default data root (layers land here): the heartbeat of silent build steps watches its disk.
DOCKER_DATA_DIR = Path("/var/lib/docker")


def docker_cli() -> str:
    """The CLI that can drive BuildKit here: Debian's docker.io client before a newer one without buildx."""
    override = os.environ.get("SPECLOCK_DOCKER")
    if override:
        return override
    if Path("/usr/bin/docker").is_file():
        return "/usr/bin/docker"
    return shutil.which("docker") or "docker"


class Docker:
    name = "docker"

    def _env(self) -> dict[str, str]:
        return dict(os.environ, DOCKER_BUILDKIT="1")

    def check_available(self) -> str:
        cli = docker_cli()
        if not shutil.which(cli):
            raise EnvironmentProblem("docker is not installed", hint="apt-get install docker.io, or use --builder buildah")
        proc = capture([cli, "version", "--format", "{{.Server.Version}}"], env=self._env())
        if proc.returncode != 0 or not proc.stdout.strip():
            raise EnvironmentProblem(
                f"the docker daemon is not reachable: {proc.stderr.strip()[-300:]}",
                hint="start dockerd (e.g. `setsid dockerd >/tmp/dockerd.log 2>&1 &`) or use --builder buildah",
            )
        return proc.stdout.strip()

    def image_exists(self, ref: str) -> bool:
        return capture([docker_cli(), "image", "inspect", ref]).returncode == 0

    def build(
        self,
        *,
        containerfile: Path,
        context: Path,
        tag: str,
        build_args: dict[str, str],
        labels: dict[str, str],
        target: str | None,
        no_cache: bool,
        timestamp: int,
        layers: bool = True,  # buildah's one-commit mode; BuildKit has none (build.tail is buildah's)
    ) -> str:
        cmd = [docker_cli(), "build", "--progress", "plain", "--network", "none", "-f", str(containerfile), "-t", tag]
        if no_cache:
            cmd.append("--no-cache")
        if target:
            cmd += ["--target", target]
        for key, value in build_args.items():
            cmd += ["--build-arg", f"{key}={value}"]
        for key, value in labels.items():
            cmd += ["--label", f"{key}={value}"]
        with tempfile.TemporaryDirectory(prefix="speclock-iid-") as tmp:
            iid = Path(tmp) / "iid"
            cmd += ["--iidfile", str(iid), str(context)]
            rc, tail = stream(cmd, env=self._env(), watch=DOCKER_DATA_DIR)
            if rc != 0:
                raise build_failure("docker", rc, tail)
            return iid.read_text().strip()

    def image_id(self, ref: str) -> str:
        proc = capture([docker_cli(), "image", "inspect", "--format", "{{.Id}}", ref])
        if proc.returncode != 0:
            raise CheckFailed(f"no image {ref} in docker", hint="build it first")
        return proc.stdout.strip()

    def layers(self, ref: str) -> list[ImageLayer]:
        proc = capture([docker_cli(), "history", "--no-trunc", "--format", "{{json .}}", ref])
        rows = [tool_json(line, f"docker history {ref}") for line in proc.stdout.splitlines() if line.strip()]
        out: list[ImageLayer] = []
        for row in reversed(rows):
            size = _parse_size(row.get("Size", "0B"))
            if size:
                out.append({"created_by": row.get("CreatedBy", ""), "size": size})
        return out

    def labels(self, ref: str) -> dict[str, str]:
        proc = capture([docker_cli(), "image", "inspect", "--format", "{{json .Config.Labels}}", ref])
        if proc.returncode != 0:
            raise CheckFailed(f"no image {ref} in docker", hint="build it first")
        labels: dict[str, str] = tool_json(proc.stdout or "null", f"docker image inspect {ref}", expect=(dict, type(None))) or {}
        return labels

    def push(self, ref: str, dest: str, *, insecure: bool) -> str:
        cli = docker_cli()
        if capture([cli, "tag", ref, dest]).returncode != 0:
            raise CheckFailed(f"could not tag {ref} as {dest}")
        rc, tail = stream([cli, "push", dest])
        if rc != 0:
            raise EnvironmentProblem(
                f"the registry refused the push of {dest} (exit {rc}):\n{tail[-1500:]}",
                hint="check the registry address, that it runs, and `docker login`; "
                "plain-HTTP registries other than 127.0.0.0/8 need dockerd's insecure-registries",
            )
        # the registry's own answer, not a line of docker's log
        return registry_digest(dest, insecure=insecure)

    def remove(self, ref: str) -> None:
        capture([docker_cli(), "rmi", "-f", ref])

    def copy_to_docker(self, ref: str) -> str:
        """A docker build is in docker's store already, or nowhere."""
        if in_docker(ref):
            return ref
        raise EnvironmentProblem(f"image {ref} is not in docker's store", hint="build it again with --builder docker")


def in_docker(ref: str) -> bool:
    """Whether docker (which must be running: images run there) holds `ref`."""
    BUILDER.check_available()
    return BUILDER.image_exists(ref)


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"([\d.]+)\s*([kKMG]?B)", text.strip())
    if not m:
        return 0
    scale = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}[m[2]]
    return int(float(m[1]) * scale)


BUILDER = Docker()
