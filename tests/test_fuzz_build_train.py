"""Property-based tests (hypothesis) for build records and the training inputs (issue #15).

Every input ends in exit 0, 2 or 3 with no traceback, names the file it refused, and writes
nothing outside the cache it was given. SPECLOCK_CACHE is a tmp folder; no docker, no training.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclock.core.errors import BadInput

STACK = "cpu-vllm"
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
RUN = ("run-image", "--stack", STACK)
PUSH = ("push-image", "--stack", STACK, "--registry", "127.0.0.1:1")

json_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_value = st.recursive(
    json_scalar, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12
)
RECORD_KEYS = ["stack", "tag", "ref", "builder", "image_id", "selfcheck", "build_seconds", "labels", "layers", "candidate"]
# Records with the right keys and random values: the type checks, not just the parser.
near_record = st.fixed_dictionaries(
    {},
    optional={
        k: json_value
        | st.just(STACK)
        | st.just("buildah")
        | st.just("localhost/speclock-cpu-vllm:0123456789abcdef")
        | st.just("0123456789abcdef")
        | st.just({"verdict": "pass"})
        for k in RECORD_KEYS
    },
)


@pytest.fixture
def cache(tmp_path):
    root = tmp_path / "cache"
    (root / "images" / STACK).mkdir(parents=True)
    return root


def _check(cache: Path, argv: tuple[str, ...]) -> None:
    record = cache / "images" / STACK / "latest.buildah.json"
    before = snapshot(cache.parent)
    code, _out, err = run_cli(*argv, env={"SPECLOCK_CACHE": str(cache)})
    # A record can never pass: none of these is a whole record of a built image.
    assert_clean_refusal(code, err, allowed=(2, 3), names=str(record))
    assert_nothing_written(before, snapshot(cache.parent), except_under=(cache / "images" / STACK,))
    assert record.exists()  # refused, not deleted


@FUZZ
@given(data=st.binary(max_size=300), argv=st.sampled_from([RUN, PUSH]))
def test_record_of_random_bytes_is_refused(cache, data, argv):
    (cache / "images" / STACK / "latest.buildah.json").write_bytes(data)
    _check(cache, argv)


@FUZZ
@given(value=json_value, argv=st.sampled_from([RUN, PUSH]))
def test_record_of_random_json_is_refused(cache, value, argv):
    (cache / "images" / STACK / "latest.buildah.json").write_text(json.dumps(value))
    _check(cache, argv)


@FUZZ
@given(record=near_record, argv=st.sampled_from([RUN, PUSH]))
def test_record_with_random_field_values_is_refused(cache, record, argv):
    record.pop("image_id", None)  # a record without image_id is never whole, whatever else it holds
    (cache / "images" / STACK / "latest.buildah.json").write_text(json.dumps(record))
    _check(cache, argv)


@FUZZ
@given(tag=st.text(alphabet=string.printable + "é/\\", min_size=0, max_size=20))
def test_tag_option_is_confined_to_the_records_folder(cache, tag):
    before = snapshot(cache.parent)
    code, _out, err = run_cli(*PUSH, "--tag", tag, env={"SPECLOCK_CACHE": str(cache)})
    assert_clean_refusal(code, err, allowed=(2,), names="--tag" if ("/" in tag or ".." in tag or not tag) else None)
    assert_nothing_written(before, snapshot(cache.parent), except_under=(cache / "images" / STACK,))


# --- training numbers: argparse only (a valid value must not start training here) ---------------------


def _parse(argv: list[str]):
    from speclock.cli import build_parser

    return build_parser(["speclock.train.cli"]).parse_args(argv)


@FUZZ
@given(n=st.integers(min_value=-(10**6), max_value=10**6))
def test_prompts_count_is_checked_at_parse_time(tmp_path, n):
    argv = ["train", "prompts", "--out", str(tmp_path / "p.jsonl"), "-n", str(n)]
    if n < 1:
        code, _out, err = run_cli(*argv)
        assert code == 2
        assert_clean_refusal(code, err, names="--num-prompts")
    else:
        assert _parse(argv).num_prompts == n
    assert not (tmp_path / "p.jsonl").exists()


@FUZZ
@given(
    epochs=st.integers(min_value=-(10**6), max_value=10**6),
    option=st.sampled_from(["--epochs", "--ttt-steps", "--batch-tokens", "--num-prompts", "--gen-batch", "--nproc"]),
)
def test_pipeline_counts_are_checked_at_parse_time(tmp_path, epochs, option):
    argv = ["train", "all", "--work", str(tmp_path / "w"), option, str(epochs)]
    if epochs < 1:
        code, _out, err = run_cli(*argv)
        assert code == 2
        assert_clean_refusal(code, err, names=option)
    else:
        assert getattr(_parse(argv), option.lstrip("-").replace("-", "_")) == epochs
    assert not (tmp_path / "w").exists()


@FUZZ
@given(
    value=st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    option=st.sampled_from(["--lr", "--fit-time-budget", "--gen-time-budget"]),
)
def test_pipeline_rates_and_budgets_are_checked_at_parse_time(tmp_path, value, option):
    argv = ["train", "fit", "--work", str(tmp_path / "w"), f"{option}={value}"]
    try:
        number = float(value)
    except ValueError:
        number = None
    ok = (
        number is not None
        and number == number
        and abs(number) != float("inf")
        and (number > 0 if option == "--lr" else number >= 0)
    )
    if ok:
        assert getattr(_parse(argv), option.lstrip("-").replace("-", "_")) == number
    else:
        code, _out, err = run_cli(*argv)
        assert code == 2
        assert_clean_refusal(code, err, names=option)
    assert not (tmp_path / "w").exists()


# --- training readers: random lines in responses.jsonl ------------------------------------------------

line = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"") + b"\n") | json_value.map(
    lambda v: json.dumps(v).encode() + b"\n"
)
good = st.integers(0, 10**6).map(lambda i: json.dumps({"id": f"p{i}", "prompt_ids": [1], "response_ids": [2]}).encode() + b"\n")


@FUZZ
@given(lines=st.lists(good | line, max_size=6), tail=st.binary(max_size=20))
def test_responses_reader_refuses_or_cuts_cleanly(tmp_path, lines, tail):
    from speclock.train.data import read_done

    path = tmp_path / "responses.jsonl"
    data = b"".join(lines) + tail.replace(b"\n", b"")
    path.write_bytes(data)
    try:
        done = read_done(path)
    except BadInput as err:
        assert str(path) in str(err)
        assert path.read_bytes() == data  # a refusal cuts nothing
        return
    assert all(isinstance(k, str) and isinstance(r["prompt_ids"], list) for k, r in done.items())
    assert data.startswith(path.read_bytes())  # only a torn end is ever cut
