"""Doctor's patches check: the stack's patch series is in effect in the engine and every probe passes."""

from __future__ import annotations

from speclock.patches.probes import run_static_probes
from speclock.patches.series import load_series
from speclock.patches.trees import DirTree, installed_version
from speclock.verify.doctor.context import Check, Context, Question


def check_patches(ctx: Context) -> Check:
    if not ctx.stack.patch_series:
        return Check("patches", "pass", "the stack has no patches")
    if not ctx.site_packages:
        return Check("patches", "fail", f"no engine to check the patches against: {ctx.python_note}")
    patches = load_series(ctx.stack)
    version = installed_version(ctx.site_packages, ctx.stack.engine["package"])
    tree = DirTree(ctx.site_packages)
    failures, results = [], []
    eagle = (ctx.engine_answers.get("patch-eagle3") or {}).get("result", {})
    for p in patches:
        probes = run_static_probes(p, tree)
        for probe in p.runtime_probes:
            for arch in probe[1:]:
                r = eagle.get(arch, {"resolved": False, "eagle3": False, "reason": "engine probe did not answer"})
                probes.append(
                    {
                        "probe": f"eagle3-supported {arch}",
                        "passed": bool(r.get("resolved") and r.get("eagle3")),
                        "reason": r.get("reason", ""),
                    }
                )
        results.append({"patch": p.name, "probes": probes})
        failures += [f"{p.name}: {pr['probe']}: {pr['reason']}" for pr in probes if not pr["passed"]]
    if failures:
        return Check(
            "patches",
            "fail",
            f"{len(failures)} probe(s) fail, first: {failures[0]}",
            {"engine_version": version, "patches": results},
        )
    return Check(
        "patches",
        "pass",
        f"{len(patches)} patch(es) in effect, all {sum(len(r['probes']) for r in results)} probes pass",
        {"engine_version": version, "patches": results},
    )


class Patches:
    name = "patches"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        if not ctx.stack.patch_series:
            return {}
        # The runtime probes ask the engine whether it supports EAGLE-3 on these architectures.
        archs = sorted({a for p in load_series(ctx.stack) for probe in p.runtime_probes for a in probe[1:]})
        return {"patch-eagle3": ["eagle3", [ctx.stack.engine["name"], *archs]]} if archs else {}

    def run(self, ctx: Context) -> Check:
        return check_patches(ctx)
