"""What a registry holds: the manifest digest a tag names, asked with skopeo (not read from a push's log)."""

from __future__ import annotations

import re
import shutil

from speclock.build.builders._proc import capture
from speclock.core.errors import EnvironmentProblem

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def registry_digest(dest: str, *, insecure: bool) -> str:
    """The digest of the manifest the registry serves for `dest` (HOST[:PORT]/REPO:TAG), exactly as
    stored: `skopeo inspect --raw` would give its bytes, `{{.Digest}}` their sha256."""
    if not shutil.which("skopeo"):
        raise EnvironmentProblem("skopeo is not installed (push-image reads the pushed digest with it)",
                                 hint="apt-get install skopeo (scripts/bootstrap.sh does)")
    cmd = ["skopeo", "inspect", "--format", "{{.Digest}}"]
    if insecure:
        cmd.append("--tls-verify=false")
    proc = capture([*cmd, f"docker://{dest}"])
    digest = proc.stdout.strip()
    if proc.returncode != 0 or not DIGEST_RE.fullmatch(digest):
        raise EnvironmentProblem(f"skopeo could not read the digest of {dest} from the registry "
                                 f"(exit {proc.returncode}): {proc.stderr.strip()[-600:]}",
                                 hint="check the registry address and your login (skopeo reads docker's and "
                                      "buildah's credentials), and --insecure for a plain-HTTP registry")
    return digest
