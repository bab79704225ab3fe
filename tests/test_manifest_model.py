"""The drafter manifest's typed model (#38 item 1): speclock.drafter.manifest_types.ManifestDoc, which every reader
(speclock.drafter.models.read_drafter_manifest: doctor, smoke, the reference decoder, train) validates against.
Errors name the file and the dotted key path (BadInput, exit 2, as the hand-written checks it replaces); a key the
model does not know is a WARN naming it; the rules (counts, layer indices, rates) still apply after the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.drafter.manifest_types import MANIFEST
from speclock.drafter.models import DRAFT_MANIFEST, read_drafter_manifest

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted(ROOT.glob(f"models/*/{DRAFT_MANIFEST}"))


def _folder(tmp_path: Path, change=None) -> Path:
    doc = json.loads(COMMITTED[0].read_text())
    if change:
        change(doc)
    (tmp_path / DRAFT_MANIFEST).write_text(json.dumps(doc))
    return tmp_path


def test_every_committed_manifest_validates_with_no_unknown_key(capsys):
    assert len(COMMITTED) >= 2, COMMITTED
    for path in COMMITTED:
        read_drafter_manifest(path.parent, required=True, strict_schema=True)
    assert "WARN" not in capsys.readouterr().err
    assert MANIFEST.unknown == "warn"


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda d: d["reference"][1]["metrics"]["accepted_per_position"].__setitem__(2, "7"),
            "reference[1].metrics.accepted_per_position[2] is string ('7'), where integer belongs",
        ),
        (lambda d: d["reference"][0]["key"].update(k=3.0), "reference[0].key.k is number (3.0), where integer belongs"),
        (lambda d: d["target"].update(hidden_size=[576]), "target.hidden_size is list ([576]), where integer or null belongs"),
        (lambda d: d["engine_layer_ids"].update(sglang="2,15"), "engine_layer_ids.sglang is string ('2,15')"),
    ],
)
def test_a_wrong_type_at_a_deep_key_path_is_exit_2_naming_the_file_and_the_path(tmp_path, change, says):
    folder = _folder(tmp_path, change)
    with pytest.raises(BadInput) as err:
        read_drafter_manifest(folder, required=True)
    assert err.value.exit_code == 2
    assert err.value.message.startswith(f"{folder / DRAFT_MANIFEST}: {says}"), err.value.message


def test_an_unknown_key_is_a_warn_naming_it(tmp_path, capsys):
    folder = _folder(tmp_path, lambda d: d["reference"][0]["run"].update(gpu="H100") or d.update(license="MIT"))
    read_drafter_manifest(folder, required=True)  # run is the recorder's own: any keys
    err = capsys.readouterr().err
    assert f"WARN: {folder / DRAFT_MANIFEST}: key 'license' is not in speclock.drafter/v1" in err
    assert "gpu" not in err


def test_a_null_reads_as_absent_and_the_rules_stay(tmp_path):
    folder = _folder(tmp_path, lambda d: d.update(target=None, engine_layer_ids=None, reference=None))
    assert read_drafter_manifest(folder)["target"] is None
    folder = _folder(tmp_path, lambda d: d["aux_layers_after"].__setitem__(0, -1))
    with pytest.raises(BadInput, match=r"aux_layers_after\[0\] is -1, where a layer index \(0 or more\) belongs"):
        read_drafter_manifest(folder)
