"""Property-based tests of the lock reader through the CLI: `speclock lock --check` and `speclock fetch`.

Whatever the lock holds (random bytes, random JSON, a valid lock changed at a random key with
lock_sha256 recomputed or not, hostile filenames), the command exits 0/1 only where the lock is
still valid, 2 where it is not, 3 for a file the (local) index does not have; never a traceback, and
nothing is written outside the temporary cache. No network: URLs point at a local HTTP server.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import urllib.parse
from pathlib import Path

import pytest
from fetch_server import COMMITTED_BASE, WheelServer, make_stack, seal, wheel_entry
from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from speclock.build import wheelhouse
from speclock.core.errors import BadInput
from speclock.spec.lock import read_lock
from speclock.spec.pylock import write_lock_files
from speclock.spec.stack import load_stack

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
REPO = Path(__file__).resolve().parents[1]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
HOSTILE = [
    "../evil.whl",
    "../../evil.whl",
    "/abs/evil.whl",
    "..",
    ".",
    "a/b.whl",
    "x\x00y.whl",
    "",
    "demo_a-1.0-py3-none-any.whl/../../../evil.whl",
    "..\\evil.whl",
    ".part-evil.whl",
    "\nevil.whl",
    "C:\\evil.whl",
    "./demo_a-1.0-py3-none-any.whl",
]
filenames = st.sampled_from(HOSTILE) | st.text(max_size=40)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A stack copy whose index is a local server, a valid lock for it, and a place for caches."""
    server = WheelServer()
    root = tmp_path_factory.mktemp("fuzzlock")
    stack_file = make_stack(root, server)
    stack = load_stack(stack_file)
    entries = [wheel_entry(server, "demo-a"), wheel_entry(server, "demo-b", "2.0.post1")]
    doc = seal(
        {
            "schema": "speclock.lock/v1",
            "stack": stack.name,
            "stack_sha256": stack.source_sha256,
            "packages": entries[:1],
            "assets": entries[1:],
            "excluded": [],
            "base": COMMITTED_BASE,
            "source_date_epoch": COMMITTED_BASE["source_date_epoch"],
        }
    )
    (root / "locks").mkdir()
    lock = root / "locks" / "cpu-vllm.lock"
    write_lock_files(lock, doc)  # and its pylock, which the mutated locks below are checked against
    assert run_cli("lock", "--check", "--stack", str(stack_file), "--lock", str(lock))[0] == 0
    yield {"root": root, "stack_file": stack_file, "stack": stack, "doc": doc, "server": server}
    server.close()


def _valid(lock: Path, stack) -> bool:
    try:
        read_lock(lock, stack=stack)
        return True
    except BadInput:
        return False


def _names_another_stack(lock: Path, name: str) -> bool:
    return json.loads(lock.read_text()).get("stack") != name


def _run_both(world, data: bytes, *, valid_codes_check=(0, 1), valid_codes_fetch=(0, 1, 3)) -> tuple[bool, list, list]:
    """Write `data` as the lock, run lock --check and fetch; check the rule for each.

    Returns (valid, stderrs, exit codes)."""
    root = world["root"]
    lock = root / "locks" / "cpu-vllm.lock"
    cache = Path(tempfile.mkdtemp(dir=root, prefix="cache-"))
    lock.write_bytes(data)
    valid = _valid(lock, world["stack"])
    before = snapshot(root)
    errs, codes = [], []
    for argv, ok_codes in ((("lock", "--check"), valid_codes_check), (("fetch",), valid_codes_fetch)):
        code, _, err = run_cli(
            *argv, "--stack", str(world["stack_file"]), "--lock", str(lock), env={"SPECLOCK_CACHE": str(cache)}
        )
        if valid and argv == ("lock", "--check") and _names_another_stack(lock, world["stack"].name):
            # a well-formed lock of another stack: lock --check refuses the input (exit 2, naming the lock)
            assert_clean_refusal(code, err, allowed=(2,), names=str(lock))
        elif valid:
            assert_clean_refusal(code, err, allowed=ok_codes)
        else:
            assert_clean_refusal(code, err, allowed=(2,), names=str(lock))
        errs.append(err)
        codes.append(code)
        with contextlib.suppress(InvalidArgument):  # outside a hypothesis test (the plain example test) there are none
            event(f"{argv[0]} exit {code}")  # shown by --hypothesis-show-statistics
    assert_nothing_written(before, snapshot(root), except_under=(cache / "wheelhouse",))
    # Whatever the lock said, the only files in the cache are store entries <sha256>/<name> (or the quarantine),
    # and the store's record of verified entries (wheelhouse.STAMPS, written by fetch).
    for p in cache.rglob("*"):
        rel = p.relative_to(cache)
        assert rel.parts[0] == "wheelhouse", p
        if rel.parts[1:] == (wheelhouse.STAMPS,):
            continue
        if p.is_file():
            assert len(rel.parts) == 3 and len(rel.parts[1]) == 64 and not rel.parts[2].startswith(".part-"), p
    return valid, errs, codes


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes(world, data):
    valid, _, _ = _run_both(world, data)
    assert not valid


@FUZZ
@given(json_values)
def test_random_json_shapes(world, value):
    valid, _, _ = _run_both(world, json.dumps(value).encode())
    assert not valid


def _paths(doc, prefix=()):
    """Every (path, value) in a JSON document, so a mutation can pick any key or index."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


@FUZZ
@given(st.data(), st.booleans())
def test_valid_lock_mutated_at_a_random_key(world, data, recompute):
    doc = json.loads(json.dumps(world["doc"]))
    paths = [p for p, _ in _paths(doc) if p and p != ("lock_sha256",)]
    where = data.draw(st.sampled_from(paths), label="key")
    holder = doc
    for step in where[:-1]:
        holder = holder[step]
    action = data.draw(st.sampled_from(["replace", "delete", "filename"]), label="action")
    if action == "delete" and isinstance(holder, dict):
        holder.pop(where[-1])
    elif action == "filename":
        holder[where[-1]] = data.draw(filenames, label="value")
    else:
        holder[where[-1]] = data.draw(json_values, label="value")
    if recompute:
        seal(doc)  # what a crafted lock does: the deeper checks must refuse it
    changed = doc != world["doc"]
    valid, errs, codes = _run_both(world, json.dumps(doc).encode())
    if changed and not recompute:
        assert not valid  # an edit the hash was not recomputed for never passes


@FUZZ
@given(filenames, st.sampled_from(["packages", "assets"]), st.booleans())
def test_hostile_filenames(world, filename, key, url_follows):
    doc = json.loads(json.dumps(world["doc"]))
    entry = doc[key][0]
    entry["filename"] = filename
    if url_follows:  # the URL's last part decodes to the same name, so only the name check can refuse it
        entry["url"] = f"{world['server'].base}/files/{urllib.parse.quote(filename, safe='')}"
    seal(doc)
    valid, errs, codes = _run_both(world, json.dumps(doc).encode())
    if filename in HOSTILE or "/" in filename or "\\" in filename or "\x00" in filename or filename.startswith("."):
        assert not valid
        assert f"{key}[0]" in errs[0] and "filename" in errs[0], errs[0]


@FUZZ
@given(
    st.sampled_from(["packages", "assets"]),
    st.sampled_from(["sha256", "url-folder", "mirror-missing", "mirror-other-file", "version", "name-case"]),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    st.booleans(),
)
def test_plausible_crafted_lock(world, key, change, hexdigits, recompute):
    """Edits a person might make by hand, reaching fetch: exit 1 (hash refused), 3 (not on the index) or 2. lock --check
    exits 1 for any edit, since the pylock beside the lock was made from the lock before it (its lock-sha256), and
    names the package where the edit reaches the pylock's packages (a sha256 or a URL)."""
    doc = json.loads(json.dumps(world["doc"]))
    entry = doc[key][0]
    name = entry["filename"]
    if change == "sha256":
        entry["sha256"] = hexdigits
    elif change == "url-folder":
        entry["url"] = entry["url"].replace("/files/", "/other/")
    elif change == "mirror-missing":
        entry["mirror_url"] = f"file:///nonexistent/{name}"
    elif change == "mirror-other-file":
        entry["mirror_url"] = f"file:///etc/{name.replace('.whl', '')}.whl"
    elif change == "version":
        entry["version"] = entry["version"] + ".1"
    else:
        entry["name"] = entry["name"].upper().replace("-", "_")
    if recompute:
        seal(doc)
    valid, errs, codes = _run_both(world, json.dumps(doc).encode())
    assert valid == (recompute and change != "version"), errs
    if valid:  # lock --check: the pylock is the old lock's; fetch: what the edit means
        expected = {"sha256": 1, "url-folder": 3}.get(change, 0)
        changed = doc != world["doc"]
        assert codes == [1 if changed else 0, expected], errs
        if changed:
            assert "pylock.cpu-vllm.toml: tool.speclock.lock-sha256" in errs[0], errs[0]
        if change in ("sha256", "url-folder"):
            names = f"package {entry['name']} {entry['version']}" if key == "packages" else "tool.speclock.targets.image.assets"
            assert names in errs[0], errs[0]
        if expected == 1:
            assert "has sha256" in errs[1] and "refused" in errs[1]
        if expected == 3:
            assert "not found at" in errs[1]


def test_a_sealed_lock_of_another_stack_is_refused_by_lock_check(world):
    # the case the fuzz test found (key 'stack', a file name, hash recomputed): read_lock accepts the document, and
    # lock --check refuses it as another stack's lock, exit 2 naming the file (not "out of date", exit 1)
    doc = json.loads(json.dumps(world["doc"]))
    doc["stack"] = "0"
    seal(doc)
    valid, errs, codes = _run_both(world, json.dumps(doc).encode())
    assert valid and codes[0] == 2 and "this is the lock of stack '0'" in errs[0]
