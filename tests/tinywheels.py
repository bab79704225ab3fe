"""Tiny real wheels, a tiny stack and locks made of them: for the lock-target and host-env tests.

The wheels are real (zip, dist-info with METADATA, WHEEL and a RECORD with hashes), so pip resolves
and installs them like any other; they are built in the test's folder in milliseconds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    folder: Path,
    name: str,
    version: str,
    *,
    tag: str = "py3-none-any",
    requires: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
) -> Path:
    """folder/<name>-<version>-<tag>.whl with a module `<name>` (VERSION = version, TAG = tag) and `files`."""
    folder.mkdir(parents=True, exist_ok=True)
    mod = name.replace("-", "_")
    dist = f"{mod}-{version}.dist-info"
    content = {f"{mod}/__init__.py": f"VERSION = {version!r}\nTAG = {tag!r}\n", **(files or {})}
    content[f"{dist}/METADATA"] = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    content[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: speclock-tests\nRoot-Is-Purelib: {'true' if tag.endswith('any') else 'false'}\nTag: {tag}\n"
    )
    record = "".join(f"{p},{_record_hash(d.encode())},{len(d.encode())}\n" for p, d in content.items()) + f"{dist}/RECORD,,\n"
    path = folder / f"{mod}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in content.items():
            zf.writestr(zipfile.ZipInfo(p, (2020, 1, 1, 0, 0, 0)), d)
        zf.writestr(zipfile.ZipInfo(f"{dist}/RECORD", (2020, 1, 1, 0, 0, 0)), record)
    return path


def entry(path: Path) -> dict:
    """A lock entry for a local wheel (file:// URL, as read_lock allows)."""
    name, version = path.name.split("-")[:2]
    return {
        "name": name.replace("_", "-"),
        "version": version,
        "filename": path.name,
        "url": path.resolve().as_uri(),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def write_stack(
    root: Path,
    *,
    name: str = "tiny",
    host_targets: tuple[str, ...] = (),
    engine_env: dict | None = None,
    python: str = "3.11",
    prompts: bool = True,
) -> Path:
    """root/stacks/<name>.toml: engine 'tinyengine 1.0' (vllm family), torch '9.9.9' (a tiny wheel), the committed
    (small) SGLang drafter export, target.path (no conversion), a prompts wheel."""
    (root / "stacks").mkdir(parents=True, exist_ok=True)
    env = "".join(f'{k} = "{v}", ' for k, v in (engine_env or {}).items()).rstrip(", ")
    text = f'''schema = 1
name = "{name}"
[base]
kind = "debian-rootfs"
packages = ["python3", "python3-venv", "libnuma1"]
[python]
version = "{python}"
host_targets = {json.dumps(list(host_targets))}
[torch]
version = "9.9.9"
[engine]
name = "vllm"
package = "tinyengine"
version = "1.0"
env = {{ {env} }}
[target]
name = "tiny"
path = "models/smollm2-135m-eagle3-sglang"
[draft]
path = "models/smollm2-135m-eagle3-sglang"
'''
    if prompts:
        text += '[smoke]\nprompts_package = "tinyprompts==1.0"\nprompts_file = "tinyprompts/q.jsonl"\n'
    path = root / "stacks" / f"{name}.toml"
    path.write_text(text)
    return path


def tiny_wheels(folder: Path) -> dict[str, Path]:
    """The wheels of the tiny stack: tinyengine for cp311 and cp312 on x86_64 and aarch64, its pure dependency,
    a pure 'torch 9.9.9', the prompts wheel."""
    out = {}
    for py in ("311", "312"):
        for machine in ("x86_64", "aarch64"):
            out[f"tinyengine-cp{py}-{machine}"] = make_wheel(
                folder, "tinyengine", "1.0", tag=f"cp{py}-cp{py}-manylinux_2_17_{machine}", requires=("tinydep>=1",)
            )
    out["tinydep"] = make_wheel(folder, "tinydep", "1.2")
    out["torch"] = make_wheel(folder, "torch", "9.9.9")
    out["tinyprompts"] = make_wheel(
        folder, "tinyprompts", "1.0", files={"tinyprompts/q.jsonl": '{"turns": ["Say hi."]}\n{"turns": ["Count to 3."]}\n'}
    )
    return out


def base_of_committed_lock() -> dict:
    return json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())["base"]


def tiny_lock(stack, *, python: str, packages: list, excluded: list, assets: list, targets: dict | None = None) -> dict:
    """A finished lock document of `stack` with these entries (the base taken from the committed lock: no rootfs is
    built in the tests that use it)."""
    from speclock.spec.lock import finish_lock
    from speclock.spec.lock_models import model_records
    from speclock.spec.pip_resolver import platform_tags

    doc = {
        "schema": "speclock.lock/v1",
        "stack": stack.name,
        "stack_sha256": stack.source_sha256,
        "stack_data": stack.data,
        "resolver": {"tool": "pip", "requirements": stack.requirements()},
        "python": {"version": python, "platforms": platform_tags(stack)},
        "base": base_of_committed_lock(),
        "source_date_epoch": 0,
        "packages": packages,
        "excluded": excluded,
        "assets": assets,
    }
    if targets:
        doc["targets"] = targets
    models = model_records(stack, progress=lambda *a: None)  # target.path: pinned by identity, as `lock` writes it
    if models is not None:
        doc["models"] = models
    return finish_lock(doc)
