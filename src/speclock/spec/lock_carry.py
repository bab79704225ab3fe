"""`speclock lock --stack NEW --from-lock OTHER.lock`: a stack's lock carried from another stack's resolved lock,
without resolving, where the two stacks resolve the same packages.

`speclock stack new` writes a stack from the engine release's committed stack: same base, Python, torch, engine,
CUDA, archs, prune and kernels; only what no wheel depends on differs (its name, its target served from a folder,
its drafter, its smoke settings). Such a stack's resolve would pick the committed lock's versions again on the day
they were locked, or newer ones on a later day; carrying the committed lock pins the very wheels that lock was
checked with, needs no network (a GPU host has none) and lets the image share the committed image's venv layers.

Refused (exit 2, naming each key) where the two stacks differ in anything a wheel depends on: then resolve
(`speclock lock --stack NEW`). The data wheels follow the new stack: a target served from a folder drops the
other stack's target wheel; a data wheel the other lock lacks cannot be carried."""

from __future__ import annotations

import copy

from speclock.core.errors import BadInput
from speclock.core.names import normalize
from speclock.spec.lock import _diff
from speclock.spec.lock_types import LockDoc
from speclock.spec.stack import Stack, pinned_view

# Stack keys no wheel depends on: they may differ between the stack and the lock it is carried from (pinned_view
# already leaves out what a lock never pins, such as thresholds). Everything else must be equal.
FREE_KEYS = (
    "schema",
    "name",
    "description",
    "target",
    "draft",
    "smoke",
    "patches",
    "engine.settings",
    "engine.env",
    "engine.k_per_batch_size",
    "gpu.arch_settings",
    "gpu.known_gaps",
)


def _free(diff: str) -> bool:
    key = diff.split(":", 1)[0]
    return any(key == k or key.startswith(k + ".") for k in FREE_KEYS)


def carried_lock(stack: Stack, other: LockDoc, source: str) -> LockDoc:
    """`other` (read from `source`) re-addressed to `stack`: its packages, targets, base and prune as they are, the
    stack's own data and data wheels. The caller finishes it (spec.resolve.portable_lock: URLs, models, hash)."""
    blocking = [d for d in _diff(pinned_view(other["stack_data"]), pinned_view(stack.data)) if not _free(d)]
    # fewer GPU archs than the other stack's: the wheels that cover its archs cover these (kernels follow the stack)
    archs_then = set((other["stack_data"].get("gpu") or {}).get("archs") or [])
    if set(stack.gpu["archs"]) <= archs_then:
        blocking = [d for d in blocking if not d.startswith("gpu.archs:")]
    if blocking:
        raise BadInput(
            f"{source} (stack {other['stack']}) cannot be carried to stack {stack.name}: they differ in what the "
            "wheels depend on:\n  " + "\n  ".join(d.replace("lock has", f"{other['stack']} has", 1) for d in blocking),
            hint=f"resolve it instead: `speclock lock --stack {stack.name}` (needs the network)",
        )
    have = {normalize(a["name"]): a for a in other["assets"]}
    want = [normalize(spec.split("==")[0].split("[")[0]) for spec in stack.assets()]
    lacking = [name for name in want if name not in have]
    if lacking:
        raise BadInput(
            f"{source} (stack {other['stack']}) has no data wheel {', '.join(lacking)}, which stack {stack.name} "
            "names (target.package, smoke.prompts_package or python.build_only)",
            hint=f"resolve it instead: `speclock lock --stack {stack.name}` (needs the network)",
        )
    doc = copy.deepcopy(other)
    doc["stack"], doc["stack_sha256"], doc["stack_data"] = stack.name, stack.source_sha256, stack.data
    doc["assets"] = [have[name] for name in want]
    doc.pop("models", None)  # the stack's own model folders are read again (portable_lock)
    doc.setdefault("resolver", {})["carried_from"] = {"stack": other["stack"], "lock_sha256": other["lock_sha256"]}
    return doc
