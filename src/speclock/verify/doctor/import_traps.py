"""Doctor's import-traps check: known ways an engine fails at start on a GPU host, each avoided by a stack
setting. A table of data, one entry per trap, checked against the stack's engine.env and the packages in
the engine's Python (the trap springs only on the GPU path, so a CPU machine's import cannot show it)."""

from __future__ import annotations

from dataclasses import dataclass

from speclock.core.names import normalize
from speclock.core.versions import in_range, parse_range
from speclock.verify.doctor.context import Check, Context, Question


@dataclass(frozen=True)
class ImportTrap:
    engine: str  # engine family (stack engine.name)
    versions: str  # engine versions that have it, e.g. ">=0.26.0"
    missing: str  # the distribution whose absence springs it
    gpu_only: bool  # only on the CUDA path (a CPU stack never reaches it)
    env: tuple[tuple[str, str], ...]  # the engine.env setting that avoids it
    what: str  # where in the engine, and why


TRAPS: tuple[ImportTrap, ...] = (
    # Read in the wheels: vllm/v1/sample/ops/topk_topp_sampler.py, TopKTopPSampler.__init__ on CUDA calls
    # flashinfer_sampler_supported(), which imports vllm.v1.attention.backends.flashinfer (a top-level
    # `from flashinfer import ...`) unless VLLM_USE_FLASHINFER_SAMPLER is "0" (envs.py: default True) in
    # 0.26.0 and 0.33.0; in 0.17.1 the sampler was opt-in (default None). Measured on an H200 with 0.26.0.
    ImportTrap(
        "vllm",
        ">=0.26.0",
        "flashinfer-python",
        True,
        (("VLLM_USE_FLASHINFER_SAMPLER", "0"),),
        "vLLM's sampler (TopKTopPSampler, topk_topp_sampler.py) imports flashinfer at engine start "
        "unless VLLM_USE_FLASHINFER_SAMPLER=0",
    ),
)


def _toml_env(env: tuple[tuple[str, str], ...]) -> str:
    return "engine.env = { " + ", ".join(f'{k} = "{v}"' for k, v in env) + " }"


def springs(trap: ImportTrap, ctx: Context, installed: set[str]) -> bool:
    """Whether this stack meets the trap: its engine and version, GPU path, the package absent, the setting not made."""
    engine = ctx.stack.engine
    if trap.engine != engine["name"] or (trap.gpu_only and not ctx.stack.is_gpu):
        return False
    try:
        if not in_range(engine["version"], parse_range(trap.versions, "import trap")):
            return False
    except ValueError:  # a version the table cannot order: the trap may apply
        pass
    if normalize(trap.missing) in installed:
        return False
    env = ctx.stack.engine_env
    return any(env.get(k) != v for k, v in trap.env)


def check_import_traps(ctx: Context, traps: tuple[ImportTrap, ...] = TRAPS) -> Check:
    engine = ctx.stack.engine
    mine = [t for t in traps if t.engine == engine["name"]]
    if not mine:
        return Check("import-traps", "pass", f"no known import trap for {engine['name']}")
    a = ctx.engine_answers.get("dists")
    if not a or not a["ok"]:
        return Check(
            "import-traps", "fail", f"could not list the engine Python's packages: {(a or {}).get('error', ctx.python_note)}"
        )
    installed = {normalize(k) for k in a["result"]}
    sprung = [t for t in mine if springs(t, ctx, installed)]
    if sprung:
        parts = [
            f"{engine['package']} {engine['version']}: {t.what}, and {t.missing} is not installed; set "
            f"{_toml_env(t.env)} in stacks/{ctx.stack.name}.toml (or lock {t.missing})"
            for t in sprung
        ]
        return Check("import-traps", "fail", "; ".join(parts), {"traps": [t.what for t in sprung]})
    return Check(
        "import-traps",
        "pass",
        f"{len(mine)} known import trap(s) of {engine['name']} checked: none applies "
        "(version, GPU path, package installed or engine.env set)",
    )


class ImportTraps:
    name = "import-traps"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, Question]:
        return {"dists": ["dists", []]}

    def run(self, ctx: Context) -> Check:
        return check_import_traps(ctx)
