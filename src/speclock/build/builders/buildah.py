"""buildah: the reproducible builder (fixed timestamps, overlay storage pinned, OCI format)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from speclock.build.builders._proc import build_failure, capture, stream, tool_json
from speclock.build.builders.docker import in_docker
from speclock.build.records import ImageLayer
from speclock.core.errors import CheckFailed, EnvironmentProblem, SpeclockError
from speclock.core.files import atomic_write_text
from speclock.core.jsonread import loads
from speclock.core.layout import cache_dir

# vfs and overlay give different digests for the same content: pin one.
STORAGE = ["--storage-driver", os.environ.get("SPECLOCK_BUILDAH_STORAGE_DRIVER", "overlay")]
# Where buildah writes layers (root's default store; rootless: under HOME): the heartbeat of silent steps watches it.
STORAGE_DIR = Path("/var/lib/containers/storage") if os.geteuid() == 0 else Path.home() / ".local/share/containers/storage"


def labelled_containerfile(text: str, labels: dict[str, str], *, first: bool = False) -> str:
    """The Containerfile with the labels as ONE LABEL instruction in the last stage (the image's): its last
    instruction, or with `first` the one right after that stage's FROM.

    buildah makes each `--label` option a step of its own (16 labels: ~4 s of a 6 s warm rebuild,
    docs/benchmarks.md); one LABEL is one step, and its text (sorted, JSON-quoted) is fixed by the
    values, so the same labels give the same history and digest. A one-commit build (`layers=False`) gives its
    layer to the last history entry: there the labels go first, so that entry stays the step that made the layer."""
    quoted = " \\\n      ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items()))
    label = f"# labels added by speclock build-image\nLABEL {quoted}\n"
    if not first:
        return text.rstrip("\n") + "\n" + label
    lines = text.splitlines(keepends=True)
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    return "".join(lines[: last_from + 1]) + label + "".join(lines[last_from + 1 :])


def binary_key(found: str) -> str:
    """The buildah binary as its stat: another install (a new file, inode and ctime) asks `buildah version` again."""
    real = os.path.realpath(found)
    st = os.stat(real)
    return f"{real}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _version_file() -> Path:
    return cache_dir() / "builders" / "buildah-version.json"


def _kept_version(key: str) -> str | None:
    """What `buildah version` said of this very binary (the builder version is an input of the image: build.reuse)."""
    try:
        kept = loads(_version_file().read_text())
    except (OSError, ValueError):
        return None
    if isinstance(kept, dict) and kept.get("binary") == key and isinstance(kept.get("version"), str):
        return str(kept["version"])
    return None


def _keep_version(key: str, version: str) -> None:
    try:
        _version_file().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_version_file(), json.dumps({"binary": key, "version": version}) + "\n")
    except (OSError, SpeclockError):
        pass  # best effort: asked again next time


class Buildah:
    name = "buildah"

    def __init__(self) -> None:
        # The last `buildah inspect` answer: build-image reads labels and layers of the image it just built, one
        # call for both (25-40 ms each on 2 cores). Forgotten by every build and removal in this process.
        # (ref, `buildah inspect` JSON: buildah's own open-ended document, read field by field)
        self._inspected: tuple[str, dict[str, Any]] | None = None

    def _cmd(self, *args: str) -> list[str]:
        return ["buildah", *STORAGE, *args]

    def check_available(self) -> str:
        found = shutil.which("buildah")
        if not found:
            raise EnvironmentProblem(
                "buildah is not installed", hint="apt-get install buildah (Debian/Ubuntu), or use --builder docker"
            )
        key = binary_key(found)
        kept = _kept_version(key)
        if kept:
            return kept
        proc = capture(self._cmd("version", "--json"))
        if proc.returncode != 0:
            raise EnvironmentProblem(
                f"buildah does not work here: {proc.stderr.strip()[-500:]}",
                hint="run as root or configure rootless buildah (subuid/subgid), or use --builder docker",
            )
        version: str = tool_json(proc.stdout, "buildah version --json").get("version", "?")
        _keep_version(key, version)
        return version

    def image_exists(self, ref: str) -> bool:
        return capture(self._cmd("inspect", "--type", "image", ref)).returncode == 0

    def _inspect(self, ref: str) -> dict[str, Any]:  # as _inspected says
        if self._inspected is None or self._inspected[0] != ref:
            proc = capture(self._cmd("inspect", "--type", "image", ref))
            if proc.returncode != 0:
                raise CheckFailed(f"no image {ref} in buildah's store", hint="build it first")
            self._inspected = (ref, tool_json(proc.stdout, f"buildah inspect {ref}"))
        return self._inspected[1]

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
        layers: bool = True,
    ) -> str:
        """`layers=False`: every step in one working container and one commit (build.tail's tail: a commit per
        step costs 0.3-0.6 s on 2 cores); the image's history still has one entry per instruction."""
        self._inspected = None
        with tempfile.TemporaryDirectory(prefix="speclock-buildah-") as tmp:
            if labels:  # buildah reads this copy; the context (and its inputs hash) stays as staged
                labelled = Path(tmp) / "Containerfile"
                labelled.write_text(labelled_containerfile(Path(containerfile).read_text(), labels, first=not layers))
                containerfile = labelled
            # --force-rm: a failed step's working container (a venv step's holds 2+ GB) is removed too; without
            # it every failed build (a full disk, most often) left one behind and made the next failure likelier.
            cmd = self._cmd(
                "build",
                "--format",
                "oci",
                "--layers" if layers else "--layers=false",
                "--force-rm",
                "--network",
                "none",
                "--identity-label=false",
                "--timestamp",
                str(timestamp),
                "-f",
                str(containerfile),
                "-t",
                tag,
            )
            if no_cache:
                cmd.append("--no-cache")
            cache_repo = os.environ.get("SPECLOCK_BUILDAH_CACHE_REPO")
            if cache_repo and layers:  # CI: layers from and to a registry repository (ci/speclock-upgrade.yml)
                cmd += ["--cache-from", cache_repo, "--cache-to", cache_repo]
            if target:
                cmd += ["--target", target]
            for key, value in build_args.items():
                cmd += ["--build-arg", f"{key}={value}"]
            iid = Path(tmp) / "iid"
            cmd += ["--iidfile", str(iid), str(context)]
            rc, tail = stream(cmd, watch=STORAGE_DIR)
            if rc != 0:
                raise build_failure("buildah", rc, tail)
            return iid.read_text().strip()

    def image_id(self, ref: str) -> str:
        proc = capture(self._cmd("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref))
        if proc.returncode != 0:
            raise CheckFailed(f"no image {ref} in buildah's store", hint="build it first")
        return "sha256:" + proc.stdout.strip().removeprefix("sha256:")

    def manifest_digest(self, ref: str) -> str:
        proc = capture(self._cmd("inspect", "--type", "image", "--format", "{{.FromImageDigest}}", ref))
        return proc.stdout.strip()

    def layers(self, ref: str) -> list[ImageLayer]:
        data = self._inspect(ref)
        history = [h for h in data["History"] if not h.get("empty_layer")]
        manifest = tool_json(data.get("Manifest") or "{}", f"buildah inspect {ref} (its Manifest)")
        msizes = [layer.get("size", 0) for layer in manifest.get("layers", [])]  # compressed sizes
        out: list[ImageLayer] = []
        for i, h in enumerate(history):
            out.append({"created_by": h.get("created_by", ""), "size": msizes[i] if i < len(msizes) else 0})
        return out

    def labels(self, ref: str) -> dict[str, str]:
        labels: dict[str, str] = (self._inspect(ref).get("OCIv1", {}).get("config", {}) or {}).get("Labels") or {}
        return labels

    def push(self, ref: str, dest: str, *, insecure: bool) -> str:
        with tempfile.NamedTemporaryFile(prefix="speclock-digest-") as dfile:
            cmd = self._cmd("push", "--digestfile", dfile.name)
            if insecure:
                cmd.append("--tls-verify=false")
            rc, tail = stream(cmd + [ref, f"docker://{dest}"])
            if rc != 0:
                raise EnvironmentProblem(
                    f"the registry refused the push of {dest} (exit {rc}):\n{tail[-1500:]}",
                    hint="check the registry address, that it runs, your login (buildah login), "
                    "and --insecure for a plain-HTTP registry",
                )
            digest = Path(dfile.name).read_text().strip()
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise EnvironmentProblem(f"buildah reported no digest for {dest}")
        return digest

    def remove(self, ref: str) -> None:
        self._inspected = None
        capture(self._cmd("rmi", "-f", ref))

    def copy_to_docker(self, ref: str) -> str:
        """Images run in docker: copy the build from buildah's store once (docker-daemon transport)."""
        if in_docker(ref):
            return ref
        print(f"copying {ref} from buildah's store into docker", file=sys.stderr, flush=True)
        rc, tail = stream(self._cmd("push", ref, f"docker-daemon:{ref}"), quiet=True)
        if rc != 0:
            raise EnvironmentProblem(f"could not copy {ref} into docker:\n{tail[-1000:]}", hint="check that dockerd runs")
        return ref


BUILDER = Buildah()
