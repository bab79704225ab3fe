"""Weights checked before any engine starts (issue #40 item 4): a drafter whose safetensors header is not JSON, claims
a 10 TB tensor, is cut short or does not fit its config is exit 2 naming the file, in well under a second, for
smoke, serve and doctor alike; the committed drafters and the converted target pass."""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.drafter.models import read_model_config, require_runnable_model
from speclock.drafter.weights_check import check_model_weights, check_safetensors

ROOT = Path(__file__).resolve().parents[1]
DRAFT = ROOT / "models" / "smollm2-135m-eagle3"


def _copy_draft(tmp_path: Path) -> Path:
    out = tmp_path / "draft"
    shutil.copytree(DRAFT, out, symlinks=False)
    return out


def _rewrite_header(path: Path, edit) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * ((8 - len(blob) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n :])


def test_the_committed_drafters_and_the_target_pass_in_well_under_a_second():
    from smoke_faults import converted_target

    t0 = time.perf_counter()
    for folder, what in (
        (DRAFT, "draft"),
        (ROOT / "models" / "smollm2-135m-eagle3-sglang", "draft"),
        (converted_target(), "target"),
    ):
        assert check_model_weights(folder, read_model_config(folder), what=what) > 10
    assert time.perf_counter() - t0 < 1.0


def test_a_header_that_is_not_json_is_refused(tmp_path):
    draft = _copy_draft(tmp_path)
    f = draft / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(raw[:8] + b"{not json" + raw[17:])
    with pytest.raises(BadInput, match=r"model.safetensors is not a safetensors file \(bad header"):
        require_runnable_model(draft, what="draft", tokenizer=False)


def test_a_tensor_claiming_10_tb_is_refused_naming_it(tmp_path):
    draft = _copy_draft(tmp_path)

    def huge(h):
        h["norm.weight"]["shape"] = [10**12, 5]
        h["norm.weight"]["data_offsets"] = [0, 10**13]

    _rewrite_header(draft / "model.safetensors", huge)
    with pytest.raises(BadInput, match=r"tensor 'norm.weight' ends at byte \d+, past the end of the file") as err:
        require_runnable_model(draft, what="draft", tokenizer=False)
    assert err.value.exit_code == 2


def test_a_byte_range_that_does_not_match_dtype_and_shape_is_refused(tmp_path):
    draft = _copy_draft(tmp_path)
    _rewrite_header(draft / "model.safetensors", lambda h: h["norm.weight"].update(dtype="F32"))
    with pytest.raises(BadInput, match=r"tensor 'norm.weight' \(F32 \[576\]\) should take 2304 bytes"):
        check_safetensors(draft / "model.safetensors")


def test_a_truncated_file_is_refused(tmp_path):
    draft = _copy_draft(tmp_path)
    f = draft / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(BadInput, match="past the end of the file"):
        check_safetensors(f)


def test_weights_of_another_model_than_the_config_are_refused(tmp_path):
    draft = _copy_draft(tmp_path)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["hidden_size"] = 1024
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BadInput, match=r"tensor '(fc|lm_head|norm).weight' has shape .* where .*config.json gives"):
        require_runnable_model(draft, what="draft", tokenizer=False)


def test_doctor_fails_its_weights_check_on_a_damaged_drafter(tmp_path):
    from smoke_faults import converted_target

    from speclock.verify.doctor.context import DoctorOptions, build_context
    from speclock.verify.doctor.weights import Weights

    draft = _copy_draft(tmp_path)
    ctx = build_context(DoctorOptions(stack="cpu-vllm", target=str(converted_target()), draft=str(draft)))
    assert Weights().run(ctx).status == "pass"
    _rewrite_header(draft / "model.safetensors", lambda h: h["fc.weight"].update(shape=[576, 1]))
    check = Weights().run(ctx)
    assert check.status == "fail" and "fc.weight" in check.reason


def test_serve_refuses_a_damaged_drafter_before_starting_anything(tmp_path):
    from fuzz_support import run_cli
    from smoke_faults import converted_target

    draft = _copy_draft(tmp_path)
    f = draft / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    code, _, err = run_cli("serve", "--stack", "cpu-vllm", "--target", converted_target(), "--draft", draft, "--print-command")
    assert code == 2 and "model.safetensors" in err and "past the end of the file" in err, err
