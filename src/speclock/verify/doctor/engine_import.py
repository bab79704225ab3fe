"""Doctor's engine-import check: the stack's engine imports in its Python, at the pinned version."""

from __future__ import annotations

from pathlib import Path

from speclock.verify.doctor.context import Check, Context, Question


def check_import(ctx: Context) -> Check:
    if not ctx.python:
        return Check("engine-import", "fail", ctx.python_note)
    a = ctx.engine_answers.get("import")
    if not a or not a["ok"]:
        return Check("engine-import", "fail", f"import {ctx.stack.engine['name']} failed: {(a or {}).get('error')}")
    r = a["result"]
    pinned = ctx.stack.engine["version"]
    if r["version"] != pinned:
        return Check(
            "engine-import", "fail", f"{ctx.stack.engine['name']} {r['version']} imports, but the stack pins {pinned}", r
        )
    return Check("engine-import", "pass", f"{ctx.stack.engine['name']} {r['version']} imports from {Path(r['file']).parent}", r)


class EngineImport:
    name = "engine-import"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {"import": ["import", [ctx.stack.engine["name"]]]}

    def run(self, ctx: Context) -> Check:
        return check_import(ctx)
