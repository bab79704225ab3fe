"""Side by side: speclock's image build against the naive Dockerfile a user would write (#18).

In ONE run on this machine, for each of --runs rounds:

naive  /work/shared/peers/naive-cpu-vllm.Dockerfile, built as naive-run.sh builds it (docker
       BuildKit, --network host, the CA bundle as a build secret, pip from the package index):
       a context with the Dockerfile, wheels/ holding the torch 2.13.0+cpu wheel that
       locks/cpu-vllm.lock names (hard-linked from the wheelhouse) and app/main.py, on the base
       image local/debian:bookworm-minbase (made once: a plain `mmdebstrap --variant=minbase`
       bookworm tarball, `docker import`ed; speclock's cached base rootfs is not plain minbase, it
       has python3 in it). Cold (--no-cache), warm after a one-line edit of app/main.py, cold again
       with the same inputs (same image id?), size = `docker image inspect .Size`.
speclock  `speclock build-image --no-cache --skip-selfcheck --json` on a scratch copy of the repo
       (the checkout is never edited), with a private SPECLOCK_CACHE (hard links to the fetched
       wheelhouse and base rootfs, so other builds of the stack on this machine neither wait on nor
       disturb the staged context) and, for buildah, a private image store. Cold; warm after a
       one-line edit of src/speclock/__init__.py, then of one more module (--edit-module); the edit
       reverted and rebuilt (the original image id?); cold again (the same image id?). Build step =
       the record's build_seconds, end to end = the command's wall time. Size = docker's .Size (a
       buildah image is copied into docker to be measured the same way as the naive one), model
       assets (/opt/speclock/target, draft, prompts) measured by `du -sb` in the image and excluded.

Before and after every build: the 1-minute load average. Also recorded: the machine, tool versions,
the git revision, free disk. Medians over the rounds, ratios speclock/naive, the issue's goals.
Cleans up what it built (its tags, its build cache, the private store); keeps the naive base image.

    python benchmarks/image_build.py --runs 3 --out docs/benchmarks-image.json
    python benchmarks/image_build.py --runs 1 --skip-naive --builder buildah     # quick check
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import copy_repo  # noqa: E402
from image_build_stats import SCHEMA, summarize, table, write_json  # noqa: E402

STACK = "cpu-vllm"
PEERS = Path(os.environ.get("SPECLOCK_BENCH_PEERS", "/work/shared/peers"))
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
NAIVE_BASE = "local/debian:bookworm-minbase"
NAIVE_TAG = "speclock-bench-naive"
SIZE_TAG = "speclock-bench-size"  # a buildah image copied into docker to be measured
BENCH_CACHE = Path(os.path.expanduser("~/.cache/speclock-bench"))
ASSET_DIRS = ("/opt/speclock/target", "/opt/speclock/draft", "/opt/speclock/prompts")


def shared_cache() -> Path:
    """speclock's own cache (read only here: the fetched wheelhouse and base rootfs are linked from it)."""
    setting = os.environ.get("SPECLOCK_CACHE")
    return Path(setting) if setting else Path(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))) / "speclock"


def say(msg: str) -> None:
    print(msg, flush=True)


def run(cmd: list[str], *, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return proc


def load1() -> float:
    return round(os.getloadavg()[0], 2)


MIN_FREE_GB = 8.0  # set by --min-free-gb: a cold build needs ~2x its image while it commits


def wait_for_disk(label: str, wait_s: float = 300.0) -> None:
    """The disk is shared: wait (up to `wait_s`) for MIN_FREE_GB before a build, rather than fill it for everyone."""
    deadline = time.monotonic() + wait_s
    while disk_free_gb() < MIN_FREE_GB:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {disk_free_gb()} GB free on /var/lib (need {MIN_FREE_GB}) before {label}")
        say(f"[{label}] waiting: {disk_free_gb()} GB free, {MIN_FREE_GB} GB wanted")
        time.sleep(15)


def timed(label: str, fn: Callable[[], dict[str, Any]], *, cold: bool = False) -> dict[str, Any]:
    """Run one build, with the load average before and after it; print a progress line."""
    if cold:
        wait_for_disk(label)
    before = load1()
    result = fn()
    result.update(load_before=before, load_after=load1())
    shown = (
        f"{result['seconds']:.2f} s"
        if "build_s" not in result
        else f"build step {result['build_s']:.2f} s, end to end {result['wall_s']:.2f} s"
    )
    say(f"[{label}] {shown} (load {before} -> {result['load_after']}) {result.get('image_id', '')[:19]}")
    return result


# ---------------------------------------------------------------- the machine


def machine_info() -> dict[str, Any]:
    mem_kib = next(
        (int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:")), 0
    )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    osname = (
        next(
            (
                line.split("=", 1)[1].strip('"')
                for line in Path("/etc/os-release").read_text().splitlines()
                if line.startswith("PRETTY_NAME=")
            ),
            "?",
        )
        if Path("/etc/os-release").exists()
        else "?"
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "os": osname,
        "hostname": platform.node(),
        "python": platform.python_version(),
    }


def tool_versions() -> dict[str, str | None]:
    def first_line(cmd):
        try:
            proc = run(cmd, check=False)
        except FileNotFoundError:
            return None
        return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else None

    return {
        "buildah": first_line(["buildah", "--version"]),
        "docker_client": first_line([DOCKER, "version", "--format", "{{.Client.Version}}"]),
        "docker_server": first_line([DOCKER, "version", "--format", "{{.Server.Version}}"]),
        "mmdebstrap": first_line(["mmdebstrap", "--version"]),
    }


def git_info() -> dict[str, Any]:
    head = run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=False).stdout.strip() or None
    dirty = run(
        [
            "git",
            "-C",
            str(ROOT),
            "status",
            "--porcelain",
            "--",
            "src",
            "containers",
            "stacks",
            "locks",
            "patches",
            "models",
            "baselines",
        ],
        check=False,
    ).stdout.strip()
    return {"revision": head, "build_inputs_dirty": bool(dirty)}


def disk_free_gb() -> float:
    return round(shutil.disk_usage("/var/lib").free / 1e9, 1)


# ---------------------------------------------------------------- docker helpers


class DockerAPI(http.client.HTTPConnection):
    """dockerd's API on its unix socket: the build cache records (with their creation times) and pruning by id."""

    def __init__(self, sock: str = "/var/run/docker.sock"):
        super().__init__("localhost", timeout=600)
        self.sock_path = sock

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.sock_path)


def _api(method: str, path: str) -> Any:
    conn = DockerAPI()
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"docker API {method} {path}: {resp.status} {body[:300]!r}")
    return json.loads(body or b"null")


def build_cache_records() -> list[dict]:
    return _api("GET", "/system/df").get("BuildCache") or []


def _parse_time(text: str) -> float:
    # RFC 3339 with nanoseconds: keep microseconds for fromisoformat
    head, _, frac = text.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


def naive_cache_prefixes(dockerfile: str) -> list[str]:
    """How BuildKit describes the cache records of the naive Dockerfile's RUN steps (their commands, mount
    flags left out): the naive builds' records are told from anyone else's by these."""
    text = dockerfile.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].upper() != "RUN":
            continue
        cmd = [w for w in words[1:] if not w.startswith("--mount=")]
        out.append("mount / from exec /bin/sh -c " + " ".join(cmd)[:40])
    return out


class BuildCacheJanitor:
    """BuildKit keeps every layer a build made as cache after the image is removed (a cold naive build:
    ~3.8 GB). Prune only records that are new since this run started AND were created while one of
    this run's own docker builds ran (and, for the naive builds, that describe its own steps or its
    context), so other people's caches on this machine are left alone as far as can be told."""

    def __init__(self):
        self.known = {r["ID"] for r in build_cache_records()}
        self.windows: list[tuple[float, float, Callable[[str], bool] | None]] = []

    def window(self, start: float, end: float, match: Callable[[str], bool] | None = None) -> None:
        self.windows.append((start - 1.0, end + 1.0, match))

    def _mine(self, rec: dict) -> bool:
        if rec["ID"] in self.known:
            return False
        t = _parse_time(rec["CreatedAt"])
        return any(a <= t <= b and (match is None or match(rec.get("Description") or "")) for a, b, match in self.windows)

    def prune(self, settle_s: float = 30.0) -> int:
        """Prune this run's records; a build just stopped keeps some in use for a moment, so wait for them."""
        freed = 0
        deadline = time.monotonic() + settle_s
        while True:
            mine = [r for r in build_cache_records() if self._mine(r)]
            deleted = 0
            for rec in mine:
                if rec.get("InUse"):
                    continue
                filters = urllib.parse.quote(json.dumps({"id": [rec["ID"]]}))
                answer = _api("POST", f"/build/prune?filters={filters}")
                deleted += len(answer.get("CachesDeleted") or [])
                freed += answer.get("SpaceReclaimed") or 0
            if not mine or time.monotonic() > deadline:
                return freed
            if not deleted:  # in use (or a parent of a record in use): give it a moment
                time.sleep(2)


def docker_image(ref: str) -> dict | None:
    proc = run([DOCKER, "image", "inspect", ref], check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def du_in_image(ref: str, paths: list[str]) -> dict[str, int]:
    """Apparent sizes (du -sb, as docker's Size counts) of folders inside a docker image; missing ones are left out."""
    proc = run(
        [DOCKER, "run", "--rm", "--network", "none", "--user", "0:0", "--entrypoint", "du", ref, "-sb", *paths], check=False
    )
    out = {}
    for line in proc.stdout.splitlines():
        size, _, path = line.partition("\t")
        if size.isdigit():
            out[path] = int(size)
    return out


# ---------------------------------------------------------------- the naive peer


def ensure_naive_base() -> dict[str, Any]:
    """local/debian:bookworm-minbase: a plain mmdebstrap minbase of bookworm, imported once and kept."""
    found = docker_image(NAIVE_BASE)
    how = "already in docker"
    if not found:
        tar = BENCH_CACHE / "bookworm-minbase.tar"
        if not tar.is_file():
            BENCH_CACHE.mkdir(parents=True, exist_ok=True)
            part = tar.with_suffix(".tar.part")
            say(f"making {NAIVE_BASE}: mmdebstrap --variant=minbase bookworm (network, ~30 s)")
            run(
                [
                    "mmdebstrap",
                    "--mode=root",
                    "--variant=minbase",
                    "--format=tar",
                    "bookworm",
                    str(part),
                    "http://deb.debian.org/debian",
                ]
            )
            os.replace(part, tar)
        run([DOCKER, "import", str(tar), NAIVE_BASE])
        found = docker_image(NAIVE_BASE)
        how = f"imported now from {tar} (mmdebstrap --variant=minbase bookworm)"
    return {
        "ref": NAIVE_BASE,
        "id": found["Id"],
        "size_bytes": found["Size"],
        "made": how,
        "recipe": "mmdebstrap --mode=root --variant=minbase --format=tar bookworm OUT http://deb.debian.org/debian",
    }


def locked_torch(lock: dict) -> dict:
    torch = [p for p in lock["packages"] if p["name"] == "torch"]
    if len(torch) != 1:
        raise RuntimeError(f"locks/{STACK}.lock names {len(torch)} torch wheels")
    return torch[0]


def naive_context(where: Path, lock: dict) -> Path:
    """The context naive-run.sh expects: the Dockerfile, wheels/<the locked torch wheel>, app/main.py."""
    ctx = where / "naive"
    (ctx / "wheels").mkdir(parents=True)
    (ctx / "app").mkdir()
    shutil.copy(PEERS / "naive-cpu-vllm.Dockerfile", ctx / "Dockerfile")
    torch = locked_torch(lock)
    src = shared_cache() / "wheelhouse" / torch["sha256"] / torch["filename"]
    if not src.is_file():
        raise RuntimeError(f"{src} is missing: run `invoke fetch --stack {STACK}` first")
    h = hashlib.sha256()
    with open(src, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != torch["sha256"]:
        raise RuntimeError(f"{src} does not match the lock's sha256")
    try:
        os.link(src, ctx / "wheels" / torch["filename"])
    except OSError:
        shutil.copy(src, ctx / "wheels" / torch["filename"])
    (ctx / "app" / "main.py").write_text('print("the naive peer\'s app")\n')
    return ctx


def ca_bundle() -> str | None:
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return os.environ[var]
    default = "/etc/ssl/certs/ca-certificates.crt"
    return default if Path(default).is_file() else None


def naive_build(ctx: Path, tag: str, *, no_cache: bool, logs: Path, janitor: BuildCacheJanitor) -> dict[str, Any]:
    """`docker build` as naive-run.sh runs it (BuildKit, network on, CA secret); the whole command is timed."""
    prefixes = naive_cache_prefixes((ctx / "Dockerfile").read_text())
    cmd = [DOCKER, "build", "--network", "host"]
    ca = ca_bundle()
    if ca:
        cmd += ["--secret", f"id=ca,src={ca}"]
    cmd += ["-t", tag] + (["--no-cache"] if no_cache else []) + ["."]
    log = logs / f"{tag.replace(':', '_').replace('/', '_')}.log"
    start = time.time()
    t0 = time.monotonic()
    try:
        with open(log, "w") as out:
            rc = subprocess.run(
                cmd, cwd=ctx, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, DOCKER_BUILDKIT="1")
            ).returncode
    finally:  # a build stopped half-way left cache records too
        janitor.window(start, time.time(), lambda desc: desc.startswith(("local source for ", "fileop ", *prefixes)))
    seconds = time.monotonic() - t0
    if rc != 0:
        raise RuntimeError(f"naive build {tag} failed (exit {rc}); see {log}:\n{log.read_text()[-2000:]}")
    return {"seconds": round(seconds, 2), "image_id": docker_image(tag)["Id"]}


def naive_cleanup(tags: list[str], janitor: BuildCacheJanitor) -> int:
    for tag in tags:
        run([DOCKER, "rmi", tag], check=False)
    return janitor.prune()


def naive_round(ctx: Path, n: int, runs: int, logs: Path, janitor: BuildCacheJanitor) -> dict[str, Any]:
    app = ctx / "app" / "main.py"
    original = app.read_text()
    tags = [f"{NAIVE_TAG}:r{n}-{k}" for k in ("cold", "warm", "cold2")]
    out: dict[str, Any] = {}
    try:
        out["cold"] = timed(
            f"naive cold {n}/{runs}", lambda: naive_build(ctx, tags[0], no_cache=True, logs=logs, janitor=janitor), cold=True
        )
        out["size_bytes"] = docker_image(tags[0])["Size"]
        out["venv_bytes"] = du_in_image(tags[0], ["/opt/venv"]).get("/opt/venv")
        say(f"[naive size {n}/{runs}] {out['size_bytes'] / 1e9:.2f} GB, /opt/venv {(out['venv_bytes'] or 0) / 1e9:.2f} GB")
        app.write_text(original + f"# one-line edit {n} {time.time()}\n")
        out["warm_edit"] = timed(
            f"naive warm after an app edit {n}/{runs}",
            lambda: naive_build(ctx, tags[1], no_cache=False, logs=logs, janitor=janitor),
        )
        app.write_text(original)  # the same inputs as the first cold build
        naive_cleanup(tags[:2], janitor)  # the disk is shared: one naive image at a time
        out["cold2"] = timed(
            f"naive cold again, same inputs {n}/{runs}",
            lambda: naive_build(ctx, tags[2], no_cache=True, logs=logs, janitor=janitor),
            cold=True,
        )
        out["cold_same_id"] = out["cold"]["image_id"] == out["cold2"]["image_id"]
        say(f"[naive digests {n}/{runs}] same id for two cold builds: {out['cold_same_id']}")
    finally:
        app.write_text(original)
        freed = naive_cleanup(tags, janitor)
        say(f"[naive cleanup {n}/{runs}] removed its tags, pruned {freed / 1e9:.2f} GB of its build cache")
    return out


# ---------------------------------------------------------------- speclock


class PrivateStore:
    """A buildah image store of the benchmark's own (CONTAINERS_STORAGE_CONF): cold builds start from an
    empty store and cleaning up never touches anyone else's images."""

    def __init__(self, where: Path):
        self.root = where / "buildah"
        self.root.mkdir(parents=True)
        self.conf = self.root / "storage.conf"
        self.conf.write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{self.root / "storage"}"\nrunroot = "{self.root / "run"}"\n'
        )
        self.env = {"CONTAINERS_STORAGE_CONF": str(self.conf)}
        self.keep: set[str] = set()  # the imported base and its parent images (kept across rounds)

    def buildah(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(["buildah", "--storage-driver", "overlay", *args], check=check, env=dict(os.environ, **self.env))

    def images(self) -> list[dict]:
        return json.loads(self.buildah("images", "-a", "--json").stdout or "[]")

    def keep_current(self) -> None:
        self.keep = {i["id"] for i in self.images()}

    def purge(self, keep_base: bool = True) -> None:
        """Remove every image of this store (but the imported base): the next cold build starts empty."""
        for _ in range(3):
            doomed = [i["id"] for i in self.images() if not (keep_base and i["id"] in self.keep)]
            if not doomed:
                return
            self.buildah("rmi", "-f", *doomed, check=False)

    def size(self, ref: str) -> int:
        """Sum of the layer sizes buildah records (uncompressed tars)."""
        data = json.loads(self.buildah("inspect", "--type", "image", ref).stdout)
        manifest = json.loads(data.get("Manifest") or "{}")
        return sum(layer.get("size", 0) for layer in manifest.get("layers", []))

    def copy_to_docker(self, ref: str, dest: str) -> None:
        self.buildah("push", ref, f"docker-daemon:{dest}")

    def remove_all(self) -> None:
        self.purge(keep_base=False)


def private_cache(where: Path) -> Path:
    """A SPECLOCK_CACHE of hard links to the fetched wheelhouse and base rootfs (no copies, no downloads)."""
    src, dest = shared_cache(), where / "cache"
    for sub in ("wheelhouse", "base", "sbom"):
        if not (src / sub).is_dir():
            continue
        for path in (src / sub).rglob("*"):
            rel = path.relative_to(src / sub)
            if path.is_file() and not any(part.startswith(".") for part in rel.parts):
                target = dest / sub / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(path, target)
                except OSError:
                    shutil.copy2(path, target)
    return dest


class Speclock:
    def __init__(self, repo: Path, builder: str, cache: Path, logs: Path, store: PrivateStore | None, janitor: BuildCacheJanitor):
        self.repo, self.builder, self.cache, self.logs, self.store, self.janitor = repo, builder, cache, logs, store, janitor
        self.env = dict(os.environ, PYTHONPATH=str(repo / "src"), SPECLOCK_CACHE=str(cache), **(store.env if store else {}))
        self.made_refs: set[str] = set()  # docker refs this run created (never someone else's)
        self.made_ids: set[str] = set()
        self.count = 0

    def prime_base(self) -> None:
        """Import the locked base into the private store before timing anything (a user's store has it)."""
        code = (
            "from speclock.spec.stack import load_stack; from speclock.spec.lock import read_lock, lock_path; "
            "from speclock.build.builders import get_builder; from speclock.build.image import ensure_base_image; "
            f"s = load_stack({STACK!r}); print(ensure_base_image(s, read_lock(lock_path(s)), get_builder({self.builder!r})))"
        )
        proc = run([sys.executable, "-c", code], check=False, cwd=self.repo, env=self.env)
        say(f"[speclock/{self.builder}] base image: {proc.stdout.strip() or 'not primed: ' + proc.stderr.strip()[-300:]}")

    def build(self, *, no_cache: bool) -> dict[str, Any]:
        self.count += 1
        cmd = [
            sys.executable,
            "-m",
            "speclock",
            "build-image",
            "--stack",
            STACK,
            "--builder",
            self.builder,
            "--skip-selfcheck",
            "--json",
        ] + (["--no-cache"] if no_cache else [])
        log = self.logs / f"speclock-{self.builder}-{self.count:02d}.log"
        start = time.time()
        t0 = time.monotonic()
        try:
            with open(log, "w") as err:
                proc = subprocess.run(cmd, cwd=self.repo, env=self.env, stdout=subprocess.PIPE, stderr=err, text=True)
        finally:
            if self.builder == "docker":
                self.janitor.window(start, time.time())
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"speclock build failed (exit {proc.returncode}); see {log}:\n{log.read_text()[-2500:]}")
        record = json.loads(proc.stdout)
        if self.builder == "docker":
            self.made_ids.add(record["image_id"])
        return {
            "build_s": record["build_seconds"],
            "wall_s": round(wall, 2),
            "seconds": round(wall, 2),
            "image_id": record["image_id"],
            "tag": record["tag"],
            "ref": record["ref"],
            "total_seconds_in_record": record.get("total_seconds"),
            "layers": record.get("layers"),
        }

    def docker_refs(self) -> set[str]:
        """The stack's refs in docker now (before a docker build: what is not ours to remove afterwards)."""
        if self.builder != "docker":
            return set()
        proc = run([DOCKER, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", f"localhost/speclock-{STACK}"], check=False)
        return set(proc.stdout.split())

    def measure_size(self, ref: str) -> dict[str, Any]:
        """Docker's .Size (as for the naive image) and the model assets' du; a buildah image is copied in first."""
        out: dict[str, Any] = {}
        dref = ref
        if self.store:
            out["size_builder_bytes"] = self.store.size(ref)
            dref = f"{SIZE_TAG}:{ref.rsplit(':', 1)[-1]}"
            self.store.copy_to_docker(ref, dref)
        try:
            out["size_bytes"] = docker_image(dref)["Size"]
            if not self.store:
                out["size_builder_bytes"] = out["size_bytes"]
            sizes = du_in_image(dref, [*ASSET_DIRS, "/opt/venv"])
            out["assets"] = {p: sizes.get(p) for p in ASSET_DIRS}
            out["assets_bytes"] = sum(v for v in out["assets"].values() if v)
            out["size_without_assets_bytes"] = out["size_bytes"] - out["assets_bytes"]
            out["venv_bytes"] = sizes.get("/opt/venv")
        finally:
            if self.store:
                run([DOCKER, "rmi", dref], check=False)
        return out

    def cleanup_round(self) -> None:
        if self.store:
            self.store.purge()
            return
        for ref in sorted(self.made_refs):
            run([DOCKER, "rmi", ref], check=False)
        for iid in sorted(self.made_ids):  # untagged leftovers (a ref moved to a newer build); never forced
            run([DOCKER, "rmi", iid], check=False)
        self.made_refs.clear()
        self.made_ids.clear()
        self.janitor.prune()


def speclock_round(sp: Speclock, n: int, runs: int, edit_module: str) -> dict[str, Any]:
    init = sp.repo / "src" / "speclock" / "__init__.py"
    module = sp.repo / "src" / "speclock" / edit_module
    originals = {init: init.read_text(), module: module.read_text()}
    label = f"speclock/{sp.builder}"
    out: dict[str, Any] = {}

    def build(name: str, text: str, no_cache: bool):
        before = sp.docker_refs()
        out[name] = timed(f"{label} {text} {n}/{runs}", lambda: sp.build(no_cache=no_cache), cold=no_cache)
        if sp.builder == "docker" and out[name]["ref"] not in before:
            sp.made_refs.add(out[name]["ref"])  # a ref someone else had before is left in place

    try:
        build("cold", "cold", True)
        out.update(sp.measure_size(out["cold"]["ref"]))
        say(
            f"[{label} size {n}/{runs}] {out['size_bytes'] / 1e9:.2f} GB (docker Size), model assets "
            f"{out['assets_bytes'] / 1e6:.0f} MB, without them {out['size_without_assets_bytes'] / 1e9:.2f} GB"
        )
        init.write_text(originals[init] + f"# one-line edit {n} {time.time()}\n")
        build("warm_init", "warm after a one-line edit of __init__.py", False)
        init.write_text(originals[init])
        module.write_text(originals[module] + f"# one-line edit {n} {time.time()}\n")
        build("warm_module", f"warm after a one-line edit of {edit_module}", False)
        module.write_text(originals[module])
        build("revert", "rebuild with the edits reverted", False)
        out["revert_same_id"] = out["revert"]["image_id"] == out["cold"]["image_id"]
        sp.cleanup_round()  # cold2 needs no cache; the disk is shared: keep its peak at one image
        build("cold2", "cold again, same inputs", True)
        out["cold_same_id"] = out["cold2"]["image_id"] == out["cold"]["image_id"]
        say(
            f"[{label} digests {n}/{runs}] same id after revert: {out['revert_same_id']}, "
            f"same id for two cold builds: {out['cold_same_id']}"
        )
    finally:
        for path, text in originals.items():
            path.write_text(text)
        sp.cleanup_round()
    for name in ("warm_init", "warm_module", "revert", "cold2"):
        out[name].pop("layers", None)  # the cold build's layers say enough
    return out


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    global MIN_FREE_GB
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="rounds; medians are taken over them (default 3)")
    parser.add_argument(
        "--builder",
        choices=["buildah", "docker", "both"],
        default="buildah",
        help="speclock's builder(s) (default buildah, the reproducible one)",
    )
    parser.add_argument("--skip-naive", action="store_true", help="build speclock only (a quick check)")
    parser.add_argument(
        "--edit-module",
        default="core/files.py",
        help="the second file under src/speclock/ given a one-line edit (default core/files.py)",
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here (atomically)")
    parser.add_argument(
        "--min-free-gb",
        type=float,
        default=MIN_FREE_GB,
        help=f"wait for this much free disk before each build (default {MIN_FREE_GB:g})",
    )
    parser.add_argument("--logs", type=Path, help="folder for the builds' logs (default a new /tmp/speclock-bench-logs-*)")
    args = parser.parse_args(argv)
    # a plain `kill` cleans up too (a background job started by a shell ignores SIGINT)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM; cleaning up"))
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    MIN_FREE_GB = args.min_free_gb
    builders = ["buildah", "docker"] if args.builder == "both" else [args.builder]
    logs = args.logs or Path(tempfile.mkdtemp(prefix="speclock-bench-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    lock = json.loads((ROOT / "locks" / f"{STACK}.lock").read_text())
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "stack": STACK,
        "runs": args.runs,
        "builders": builders,
        "naive_included": not args.skip_naive,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "tools": tool_versions(),
        "git": git_info(),
        "lock_sha256": lock["lock_sha256"],
        "edit_module": args.edit_module,
        "disk_free_gb_before": disk_free_gb(),
        "logs": str(logs),
        "method": {
            "naive": "docker BuildKit, --network host, CA secret, pip from the index (naive-run.sh); seconds = the "
            "whole `docker build`; size = docker image inspect .Size",
            "speclock": "build-image --skip-selfcheck --json on a scratch copy, private SPECLOCK_CACHE (hard links "
            "to the fetched wheelhouse and base rootfs), network off; build_s = the record's "
            "build_seconds, wall_s = the whole command; size = docker .Size (buildah images copied into "
            "docker), model assets by du -sb in the image",
        },
        "rounds": [],
    }
    say(f"logs: {logs}; load now {load1()}; {result['disk_free_gb_before']} GB free")
    janitor = BuildCacheJanitor()
    scratch = Path(tempfile.mkdtemp(prefix="speclock-bench-", dir="/var/tmp"))
    store = None
    rc = 0
    try:
        if not args.skip_naive:
            result["naive_base"] = ensure_naive_base()
            naive_ctx = naive_context(scratch, lock)
        repo = copy_repo(scratch / "repo")
        cache = private_cache(scratch)
        runners = {}
        for builder in builders:
            if builder == "buildah":
                store = PrivateStore(scratch)
            runners[builder] = Speclock(repo, builder, cache, logs, store if builder == "buildah" else None, janitor)
            runners[builder].prime_base()
            if builder == "buildah":
                store.keep_current()
        for n in range(1, args.runs + 1):
            rnd: dict[str, Any] = {"round": n, "speclock": {}}
            if not args.skip_naive:
                rnd["naive"] = naive_round(naive_ctx, n, args.runs, logs, janitor)
            for builder, sp in runners.items():
                rnd["speclock"][builder] = speclock_round(sp, n, args.runs, args.edit_module)
            result["rounds"].append(rnd)
            result["summary"] = summarize(result["rounds"], builders)
            if args.out:  # a partial result survives a later failure
                write_json(args.out, result)
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        result["error"] = str(err)[-3000:]
        say(f"benchmark stopped: {err}")
        rc = 1
    finally:
        if store:
            store.remove_all()
        shutil.rmtree(scratch, ignore_errors=True)
        result["disk_free_gb_after"] = disk_free_gb()
    result["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    result["summary"] = summarize(result["rounds"], builders)
    if args.out:
        write_json(args.out, result)
    say("")
    say(table(result))
    if args.out:
        say(f"wrote {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
