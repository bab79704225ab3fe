"""What a registry holds: the manifest digest a tag names, asked with skopeo (not read from a push's log), and a
small client of the OCI distribution API for what skopeo cannot do (pushing an artifact that refers to an image)."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from pathlib import Path

from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.jsonread import loads

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def registry_digest(dest: str, *, insecure: bool) -> str:
    """The digest of the manifest the registry serves for `dest` (HOST[:PORT]/REPO:TAG), exactly as
    stored: `skopeo inspect --raw` would give its bytes, `{{.Digest}}` their sha256."""
    if not shutil.which("skopeo"):
        raise EnvironmentProblem(
            "skopeo is not installed (push-image reads the pushed digest with it)",
            hint="apt-get install skopeo (scripts/bootstrap.sh does)",
        )
    cmd = ["skopeo", "inspect", "--format", "{{.Digest}}"]
    if insecure:
        cmd.append("--tls-verify=false")
    # subprocess directly: the builders import this module, so it must not import them back
    proc = subprocess.run([*cmd, f"docker://{dest}"], capture_output=True, text=True)
    digest = proc.stdout.strip()
    if proc.returncode != 0 or not DIGEST_RE.fullmatch(digest):
        raise EnvironmentProblem(
            f"skopeo could not read the digest of {dest} from the registry "
            f"(exit {proc.returncode}): {proc.stderr.strip()[-600:]}",
            hint="check the registry address and your login (skopeo reads docker's and "
            "buildah's credentials), and --insecure for a plain-HTTP registry",
        )
    return digest


# ---- the OCI distribution API ------------------------------------------------------------------------

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPES = (
    OCI_MANIFEST,
    "application/vnd.docker.distribution.manifest.v2+json",
    OCI_INDEX,
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


def split_registry(registry: str, repository: str) -> tuple[str, str]:
    """("host[:port]", "namespace/repository") from push-image's --registry HOST[:PORT][/NAMESPACE] and repository."""
    if not registry or registry.startswith(("http://", "https://", "docker://")) or " " in registry:
        raise BadInput(f"bad registry {registry!r}", hint="give HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000 or ghcr.io/org")
    host, _, namespace = registry.rstrip("/").partition("/")
    return host, f"{namespace}/{repository}" if namespace else repository


def auth_for(host: str) -> str | None:
    """'user:password' for `host` from the auth files buildah/podman and docker write (REGISTRY_AUTH_FILE first)."""
    candidates = [
        os.environ.get("REGISTRY_AUTH_FILE"),
        os.path.join(os.environ.get("XDG_RUNTIME_DIR", ""), "containers", "auth.json")
        if os.environ.get("XDG_RUNTIME_DIR")
        else None,
        os.path.expanduser("~/.config/containers/auth.json"),
        os.path.expanduser("~/.docker/config.json"),
    ]
    for name in filter(None, candidates):
        try:
            auths = loads(Path(name).read_text()).get("auths", {})
        except (OSError, ValueError, AttributeError):
            continue
        entry = auths.get(host) or auths.get(f"https://{host}") or {}
        if isinstance(entry, dict) and entry.get("auth"):
            try:
                return base64.b64decode(entry["auth"]).decode()
            except ValueError:
                continue
    return None


class RegistryClient:
    """The few calls of the OCI distribution API a referrer push needs, with Basic/Bearer auth on a 401."""

    def __init__(self, registry: str, repository: str, *, insecure: bool):
        self.host, self.name = split_registry(registry, repository)
        self.base = f"{'http' if insecure else 'https'}://{self.host}"
        self.token: str | None = None

    def call(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200,),
        absent_ok: bool = False,
    ) -> tuple[int, Message, bytes]:
        url = path if path.startswith("http") else self.base + path
        for attempt in range(2):
            req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
            if self.token:
                req.add_header("Authorization", self.token)
            try:
                resp: http.client.HTTPResponse  # what urlopen gives for http(s) (typeshed says Any)
                with urllib.request.urlopen(req, timeout=120) as resp:
                    return resp.status, resp.headers, resp.read()
            except urllib.error.HTTPError as err:
                body = err.read()
                if err.code == 401 and attempt == 0 and self._login(err.headers.get("WWW-Authenticate", "")):
                    continue
                if err.code == 404 and absent_ok:
                    return 404, err.headers, body
                if err.code in ok:
                    return err.code, err.headers, body
                raise CheckFailed(
                    f"registry {self.host}: {method} {urllib.parse.urlsplit(url).path} answered "
                    f"{err.code}: {body[:300].decode('utf-8', 'replace')}",
                    hint="check the repository name and that your credentials (buildah/docker login) may push there",
                ) from None
            except (urllib.error.URLError, OSError) as err:
                raise EnvironmentProblem(
                    f"registry {self.host} is not reachable: {err}",
                    hint="start it or check --registry (HOST[:PORT]); loopback registries use plain HTTP",
                ) from None
        raise CheckFailed(
            f"registry {self.host}: {method} {path} needs credentials that were refused",
            hint=f"log in with `buildah login {self.host}` (or docker login)",
        )

    def _login(self, challenge: str) -> bool:
        creds = auth_for(self.host)
        scheme, _, rest = challenge.partition(" ")
        if scheme.lower() == "basic" and creds:
            self.token = "Basic " + base64.b64encode(creds.encode()).decode()
            return True
        if scheme.lower() != "bearer":
            return False
        params = dict(p.split("=", 1) for p in rest.replace('"', "").split(",") if "=" in p)
        query: dict[str, str] = {k: params[k] for k in ("service", "scope") if k in params}
        query.setdefault("scope", f"repository:{self.name}:pull,push")
        req = urllib.request.Request(params.get("realm", "") + "?" + urllib.parse.urlencode(query))
        if creds:
            req.add_header("Authorization", "Basic " + base64.b64encode(creds.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                doc = loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        token = doc.get("token") or doc.get("access_token")
        self.token = f"Bearer {token}" if token else None
        return bool(token)

    def manifest(self, reference: str) -> tuple[str, bytes] | None:
        status, headers, body = self.call(
            "GET", f"/v2/{self.name}/manifests/{reference}", headers={"Accept": ", ".join(MANIFEST_TYPES)}, absent_ok=True
        )
        if status == 404:
            return None
        return (headers.get("Content-Type") or "").split(";")[0].strip(), body

    def blob(self, digest: str) -> bytes:
        body = self.call("GET", f"/v2/{self.name}/blobs/{digest}")[2]
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise CheckFailed(
                f"registry {self.host}: blob {digest} of {self.name} does not match its digest",
                hint="the registry's storage is damaged; push the image again",
            )
        return body

    def put_blob(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if self.call("HEAD", f"/v2/{self.name}/blobs/{digest}", absent_ok=True)[0] == 200:
            return digest
        _, headers, _ = self.call("POST", f"/v2/{self.name}/blobs/uploads/", data=b"", ok=(202,))
        location = urllib.parse.urljoin(self.base + "/", headers.get("Location", ""))
        sep = "&" if "?" in location else "?"
        self.call(
            "PUT",
            f"{location}{sep}digest={urllib.parse.quote(digest)}",
            data=data,
            ok=(201,),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))},
        )
        return digest

    def put_manifest(self, reference: str, media_type: str, body: bytes) -> Message:  # the answer's headers
        return self.call(
            "PUT", f"/v2/{self.name}/manifests/{reference}", data=body, ok=(201,), headers={"Content-Type": media_type}
        )[1]
