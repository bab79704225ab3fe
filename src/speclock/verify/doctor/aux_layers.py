"""Doctor's aux-layers check: the layers the engine will feed the drafter (by the engine's own convention,
from the drafter's config) are the layers the drafter was trained on (its manifest's aux_layers_after)."""

from __future__ import annotations

from typing import Any

from speclock.drafter.models import DRAFT_MANIFEST, read_model_config
from speclock.verify.doctor.context import Check, Context, Question, TargetFacts


def check_aux_layers(ctx: Context, facts: TargetFacts, manifest: dict[str, Any] | None) -> Check:
    name = "aux-layers"
    if not ctx.draft_dir or not ctx.draft_dir.is_dir():
        return Check(name, "warn", f"no drafter folder at {ctx.draft_dir}: aux-layers could not run")
    if manifest is None:
        return Check(
            name,
            "warn",
            f"drafter {ctx.draft_dir} has no {DRAFT_MANIFEST}: aux-layers could not run "
            "(it compares the engine's layers with the manifest's aux_layers_after)",
        )
    if not (ctx.draft_dir / "config.json").is_file():
        return Check(name, "fail", f"drafter {ctx.draft_dir} has no config.json")
    read_model_config(ctx.draft_dir, what="drafter")  # its ids go to the engine: their types are checked first
    if not facts["arch"] or not facts["num_hidden_layers"]:
        return Check(name, "warn", "target architecture or layer count unknown: aux-layers could not run")
    a = ctx.engine_answers.get("capture")
    if not a or not a["ok"]:
        return Check(
            name, "fail", f"the engine could not say which layers it captures: {(a or {}).get('error', ctx.python_note)}"
        )
    r = a["result"]
    if not r.get("ok"):
        return Check(name, "fail", r["reason"], r)
    want = [int(x) for x in manifest["aux_layers_after"]]
    got = r["after_layers"]
    engine = ctx.stack.engine["name"]
    detail = dict(r, manifest_aux_layers_after=want, engine=engine)
    if got == want:
        return Check(
            name,
            "pass",
            f"{engine} feeds the drafter the hidden states after layers {got} "
            f"(ids {r['engine_ids']} from the {r['source']}), as trained",
            detail,
        )
    shift = {g - w for g, w in zip(got, want, strict=True)} if len(got) == len(want) else set()
    hint = (
        f" (off by {shift.pop():+d}: {engine}'s convention differs from the one the drafter was written for)"
        if len(shift) == 1
        else ""
    )
    return Check(
        name, "fail", f"{engine} will feed the hidden states after layers {got}, the drafter was trained on {want}{hint}", detail
    )


class AuxLayers:
    name = "aux-layers"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        facts, config = ctx.facts, (ctx.draft_dir / "config.json" if ctx.draft_dir else None)
        arch, layers, inner = facts.get("arch"), facts.get("num_hidden_layers"), facts.get("inner")
        if ctx.manifest is None or not arch or not layers or not (config and config.is_file()):
            return {}
        args: Question = [ctx.stack.engine["name"], arch, int(layers), str(config)]
        if inner and inner != arch:
            args.append(inner)
        return {"capture": ["capture", args]}

    def run(self, ctx: Context) -> Check:
        return check_aux_layers(ctx, ctx.facts, ctx.manifest)
