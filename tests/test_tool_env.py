"""Tools speclock runs (pip, uv) get HOME and caches under speclock's cache: nothing is written into the user's home
(#40 item 9: pip's `rustc --version` made rustup's proxy write ~/.rustup/settings.toml)."""

from __future__ import annotations

import os

FAKE_RUSTC = """#!/bin/sh
# what rustup's proxy does on `rustc --version` (pip runs it for its user agent): it writes its settings
mkdir -p "${RUSTUP_HOME:-$HOME/.rustup}" && echo 'version = "12"' > "${RUSTUP_HOME:-$HOME/.rustup}/settings.toml"
echo "rustc 1.80.0 (000000000 2024-07-21)"
"""


def test_the_resolver_writes_nothing_into_the_users_home(tmp_path, monkeypatch):
    from tinywheels import make_wheel

    from speclock.spec.pip_resolver import pip_report
    from speclock.spec.stack import load_stack

    home, wheels, bin_dir = tmp_path / "home", tmp_path / "wheels", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    make_wheel(wheels, "tiny-dep", "1.0")
    (bin_dir / "rustc").write_text(FAKE_RUSTC)
    (bin_dir / "rustc").chmod(0o755)
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "RUSTUP_HOME", "CARGO_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no network: the wheel comes from a local folder
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    stack = load_stack("cpu-vllm")
    found = pip_report(["tiny-dep"], stack, no_deps=True, extra_index=None, python="3.11", platforms=["linux_x86_64"])
    assert [i["metadata"]["name"] for i in found] == ["tiny-dep"]
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == []
    # the tool's writes went to speclock's cache
    assert (tmp_path / "cache" / "tool-home" / ".rustup" / "settings.toml").is_file()


def test_tools_keep_the_users_config_and_toolchain_readable(tmp_path, monkeypatch):
    from speclock.core.toolenv import tool_env

    home = tmp_path / "home"
    (home / ".rustup").mkdir(parents=True)
    (home / ".pip").mkdir()
    (home / ".pip" / "pip.conf").write_text("[global]\n")
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    env = tool_env({"HOME": str(home), "PATH": "/usr/bin", "CARGO_HOME": "/opt/cargo"})
    assert env["HOME"] == str(tmp_path / "cache" / "tool-home")
    assert env["XDG_CACHE_HOME"].startswith(env["HOME"])
    assert env["XDG_CONFIG_HOME"] == str(home / ".config")  # pip.conf, uv.toml: read where the user keeps them
    assert env["PIP_CONFIG_FILE"] == str(home / ".pip" / "pip.conf")
    assert env["RUSTUP_HOME"] == str(home / ".rustup")  # an installed toolchain stays usable
    assert env["CARGO_HOME"] == "/opt/cargo"  # set by the user: kept
    assert env["SPECLOCK_CACHE"] == str(tmp_path / "cache")


def test_host_env_pip_runs_with_speclocks_home_and_still_no_pip_config(tmp_path, monkeypatch):
    from speclock.build.hostenv.host import clean_env

    home = tmp_path / "home"
    (home / ".pip").mkdir(parents=True)
    (home / ".pip" / "pip.conf").write_text("[global]\nfind-links = /elsewhere\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    env = clean_env()
    assert env["HOME"] == str(tmp_path / "cache" / "tool-home")
    assert env["PIP_CONFIG_FILE"] == os.devnull  # the lock decides, not this machine's pip config
