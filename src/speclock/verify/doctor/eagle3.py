"""Doctor's eagle3-target check: the engine's registry resolves the target architecture and the engine's
own EAGLE-3 check passes on that (outer) class, the one the engine checks at load time."""

from __future__ import annotations

from speclock.verify.doctor.context import Check, Context, Question, TargetFacts


def check_eagle3(ctx: Context, facts: TargetFacts) -> Check:
    arch = facts["arch"]
    if not arch:
        return Check(
            "eagle3-target",
            "warn",
            "target architecture unknown (no target config.json, no drafter manifest): "
            "eagle3-target could not run; pass --target or --arch",
        )
    a = ctx.engine_answers.get("eagle3")
    if not a or not a["ok"]:
        return Check("eagle3-target", "fail", f"could not ask the engine: {(a or {}).get('error', ctx.python_note)}")
    r = a["result"][arch]
    if not r.get("resolved"):
        return Check("eagle3-target", "fail", r["reason"], r)
    return Check("eagle3-target", "pass" if r["eagle3"] else "fail", r["reason"], r)


class Eagle3Target:
    name = "eagle3-target"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        arch = ctx.facts.get("arch")
        return {"eagle3": ["eagle3", [ctx.stack.engine["name"], arch]]} if arch else {}

    def run(self, ctx: Context) -> Check:
        return check_eagle3(ctx, ctx.facts)
