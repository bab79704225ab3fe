"""smoke never writes a report it would refuse to gate, and never passes one: engine counters that
contradict each other are a failed check (exit 1, report kept for diagnosis, verdict fail), and a
prompt missing from one run counts as checked and mismatched."""

from __future__ import annotations

import json

import pytest
from fuzz_support import run_cli
from test_runtime_inputs_integrity import models_in, prompts_in, stub_smoke_host

import speclock.engines as engines
import speclock.verify.smoke.reference as smoke_reference
import speclock.verify.smoke.run as smoke_run
from speclock.core.errors import BadInput
from speclock.verify.report import load_report


class CountingEngine:
    """In-process engine double: fixed outputs, counters that jump by `after` during a run."""

    NAME = "fake"

    def __init__(self, after: engines.SpecCounters, drop_last_output: bool = False):
        self.after, self.drop = after, drop_last_output
        self.runs = 0

    def start(self, config):
        engine = self
        with_drafter = config.draft is not None

        class Session:
            calls = 0

            def generate(self, prompts, max_tokens):
                outs = [[7, 8, 9][:max_tokens] for _ in prompts]
                return outs[:-1] if (with_drafter and engine.drop) else outs

            def counters(self):
                Session.calls += 1
                return engine.after if (with_drafter and Session.calls > 1) else engines.SpecCounters()

            def captured_layers(self):
                return None

            def stop(self):
                pass

        return Session()


@pytest.fixture()
def smoke_inputs(tmp_path, monkeypatch):
    target, draft = models_in(tmp_path)
    prompts = prompts_in(tmp_path)
    stub_smoke_host(monkeypatch)
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))

    # The toy folders hold no weights to hash; the key's shape is all the report check needs.
    def key(inp, texts):
        return {
            "target_sha256": "a" * 64,
            "drafter_sha256": "b" * 64,
            "prompts_sha256": "c" * 64,
            "num_prompts": len(texts),
            "k": inp.k,
            "max_tokens": inp.max_tokens,
        }

    for module in (smoke_run, smoke_reference):  # looked up in both
        monkeypatch.setattr(module, "reference_key", key)

    def run(engine):
        monkeypatch.setattr(smoke_run, "get_engine", lambda name: engine)
        monkeypatch.setattr(engines, "get_engine", lambda name: engine)
        # the double lives in this process: run it here, not in an engine worker process (smoke/worker.py)
        monkeypatch.setattr(smoke_run, "_engine", lambda name, config, label: engines.running(engine, config))
        out = tmp_path / "out"
        code, _out, err = run_cli(
            "smoke",
            "--target",
            target,
            "--draft",
            draft,
            "--prompts",
            prompts,
            "--out",
            out,
            "--reference",
            "off",
            "--max-tokens",
            "3",
            "--speed-repeats",
            "0",
        )  # a double's timings are no speed
        return code, err, out / "report.json"

    return run


def test_engine_counters_that_contradict_each_other_fail_the_check_and_keep_the_report(smoke_inputs):
    # 5 acceptances at each position from 2 drafts: impossible, as the 15% case's wrappers could report.
    code, err, report_path = smoke_inputs(CountingEngine(engines.SpecCounters(2, 6, 1, (5, 5, 5))))
    assert code == 1, err
    assert "Traceback" not in err
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "fail"
    assert any("inconsistent measurements" in f and "accepted_per_position" in f for f in report["failures"]), report["failures"]
    with pytest.raises(BadInput, match="accepted_per_position"):  # and the gate will not take it
        load_report(report_path)


def test_consistent_counters_pass_the_same_path(smoke_inputs):
    code, err, report_path = smoke_inputs(CountingEngine(engines.SpecCounters(4, 12, 6, (3, 2, 1))))
    report = load_report(report_path)
    assert report["metrics"]["mean_acceptance_length"] == 2.5
    # exit 1 from one failure only: speed is not measured in this toy run and cpu-vllm asks for it
    assert code == 1, err
    assert len(report["failures"]) == 1 and report["failures"][0].startswith("speedup at batch 1"), report["failures"]


def test_a_prompt_missing_from_the_drafter_run_is_checked_and_mismatched(smoke_inputs):
    code, err, report_path = smoke_inputs(CountingEngine(engines.SpecCounters(4, 12, 6, (3, 2, 1)), drop_last_output=True))
    assert code == 1, err
    report = load_report(report_path)  # mismatches <= checked still holds, so the report is valid
    assert report["lossless"]["checked"] == report["prompts"]["count"]
    assert report["lossless"]["mismatches"] >= 1 and report["verdict"] == "fail"
