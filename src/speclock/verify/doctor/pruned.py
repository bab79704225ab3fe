"""Doctor's pruned check: what the stack's [prune].packages leaves out of the image is really absent, and the
engine's serving path imports without it (the LLM entry, the OpenAI server, the engine core and the EAGLE-3
proposer, imported in the engine's Python in the same subprocess as every other question). A pruned package that
the serving path needs fails here, naming the stack key, before smoke spends minutes finding it (docs/prune.md).
The import only proves what is imported at start; the image's smoke run proves the rest. [prune].paths: nothing
under the engine's site-packages matches them any more (the venv step's prune hook ran).
"""

from __future__ import annotations

import os
import re
from fnmatch import fnmatchcase
from pathlib import Path

from speclock.build.hostenv.record import RECORD, read_record
from speclock.core.layout import IMAGE, in_image
from speclock.core.names import normalize
from speclock.verify.doctor.context import Check, Context, Question

NAME = "pruned"
KEY = "[prune].packages"
# The modules a serving engine imports at start, per engine family: the in-process entry, the server, the engine
# core and the drafter's proposer. Only asked where the stack prunes packages.
SERVING_MODULES = {
    "vllm": (
        "vllm",
        "vllm.entrypoints.llm",
        "vllm.entrypoints.openai.api_server",
        "vllm.v1.engine.core",
        "vllm.v1.spec_decode.eagle",
    ),
    "sglang": ("sglang", "sglang.srt.entrypoints.engine", "sglang.srt.speculative.eagle_worker"),
}
# Distributions whose import name is not their own name (the rest: the name with '-' as '_').
IMPORT_NAMES = {
    "opencv-python-headless": ("cv2",),
    "opencv-python": ("cv2",),
    "pyyaml": ("yaml",),
    "pillow": ("PIL",),
    "scikit-learn": ("sklearn",),
    "pyzmq": ("zmq",),
}
_MISSING = re.compile(r"No module named '([^'.]+)")


def import_names(dist: str) -> tuple[str, ...]:
    key = normalize(dist)
    return IMPORT_NAMES.get(key, (key.replace("-", "_"),))


def leftover_paths(site: Path | None, globs: list[str]) -> dict[str, int]:
    """{glob: how many paths under `site` it still matches}, matched as the prune hook's `find -path` does ('*'
    spans '/'); a matched folder is not searched further. Empty when nothing is left (or there is no site)."""
    if not globs or not site or not Path(site).is_dir():
        return {}
    left: dict[str, int] = {}
    for top, dirs, names in os.walk(site):
        rel_top = os.path.relpath(top, site)
        for name in list(dirs) + names:
            rel = name if rel_top == "." else f"{rel_top}/{name}"
            for glob in globs:
                if fnmatchcase(rel, glob):
                    left[glob] = left.get(glob, 0) + 1
                    if name in dirs:
                        dirs.remove(name)
                    break
    return left


def from_the_host() -> dict[str, str]:
    """{pruned package: where} that a host environment sees in the host's site-packages (`speclock host-env
    --use-host-packages` shares them; its record lists them as pruned_from_host): not the environment's own. Empty in
    an image. The record is read through its model (build.hostenv.record, a module of core/ imports only)."""
    if not in_image() or not (IMAGE.root / RECORD).is_file():
        return {}
    record = read_record(IMAGE.root.parent)  # IMAGE.root is DIR/speclock in a host environment
    return {normalize(r["name"]): r["location"] for r in record.get("pruned_from_host") or []}


def _question(module: str) -> str:
    return f"pruned_import:{module}"


def check_pruned(ctx: Context) -> Check:
    pruned = sorted(normalize(n) for n in ctx.stack.prune["packages"])
    globs = ctx.stack.prune["paths"]
    if not pruned and not globs:
        return Check(NAME, "skip", "nothing pruned: the stack has no [prune]")
    left = leftover_paths(ctx.site_packages, globs)
    left_note = ", ".join(f"{n} match '{g}'" for g, n in left.items())
    if not pruned:
        if left:
            return Check(
                NAME,
                "fail" if in_image() else "warn",
                f"[prune].paths of stacks/{ctx.stack.name}.toml still match in {ctx.site_packages}: {left_note} "
                "(not built from this lock?)",
                {"left": left},
            )
        return Check(NAME, "pass", f"nothing under {ctx.site_packages} matches [prune].paths ({', '.join(globs)})")
    where = f"{KEY} of stacks/{ctx.stack.name}.toml"
    dists = ctx.engine_answers.get("dists")
    if not dists or not dists["ok"]:
        return Check(NAME, "fail", f"could not list the engine Python's packages: {(dists or {}).get('error', ctx.python_note)}")
    installed = sorted(set(pruned) & {normalize(k) for k in dists["result"]})
    modules = SERVING_MODULES.get(ctx.stack.engine["name"], (ctx.stack.engine["name"],))
    broken = []
    for module in modules:
        a = ctx.engine_answers.get(_question(module))
        if not a or not a["ok"]:
            broken.append((module, (a or {}).get("error", "not asked")))
    details = {
        "pruned": pruned,
        "installed": installed,
        "modules": list(modules),
        "left": left,
        "broken": [{"module": m, "error": e} for m, e in broken],
    }
    if broken:
        module, error = broken[0]
        missing = _MISSING.search(error or "")
        blamed = [p for p in pruned if missing and missing[1] in import_names(p)]
        if blamed:
            return Check(
                NAME,
                "fail",
                f"{where} removes {blamed[0]}, which the engine's serving path needs: importing "
                f"{module} fails ({error}); take {blamed[0]} out of {KEY} and relock",
                details,
            )
        return Check(
            NAME,
            "fail",
            f"the engine's serving path does not import with {', '.join(pruned)} pruned by {where}: {module}: {error}",
            details,
        )
    host = {n: w for n, w in from_the_host().items() if n in installed}
    own = [n for n in installed if n not in host]
    if own or left:
        # An image built from the lock never has them; a host's own engine Python may (it was not built from the lock).
        status = "fail" if in_image() else "warn"
        found = ([f"{', '.join(own)} pruned by {where}, but installed in the engine's Python"] if own else []) + (
            [f"[prune].paths still match: {left_note}"] if left else []
        )
        return Check(NAME, status, "; ".join(found) + " (not built from this lock?); serving modules import", details)
    if host:
        # The host environment's own site-packages has none; the host's shared one does, and host-env cannot remove it.
        return Check(
            NAME,
            "warn",
            f"{', '.join(host)} pruned by {where}: not in this environment, but visible from the "
            f"host's site-packages ({'; '.join(sorted(set(host.values())))}), which "
            "--use-host-packages shares; serving modules import",
            details | {"from_host": host},
        )
    paths = f"; nothing matches [prune].paths ({', '.join(globs)})" if globs else ""
    return Check(
        NAME,
        "pass",
        f"{', '.join(pruned)} absent ({KEY}){paths}; {len(modules)} serving modules of "
        f"{ctx.stack.engine['name']} import without them",
        details,
    )


class Pruned:
    name = NAME
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        if not ctx.stack.prune["packages"]:
            return {}
        modules = SERVING_MODULES.get(ctx.stack.engine["name"], (ctx.stack.engine["name"],))
        return {"dists": ["dists", []], **{_question(m): ["import", [m]] for m in modules}}

    def run(self, ctx: Context) -> Check:
        return check_pruned(ctx)
