"""The environment of the tools speclock runs (pip, uv): HOME and the caches under speclock's cache.

A tool run by speclock must write nothing into the user's home (#40): pip runs `rustc --version` for its user
agent, and where rustc is rustup's proxy that writes `~/.rustup/settings.toml`; pip and uv keep caches under
~/.cache. The tools get a home of their own in speclock's cache; what they read from the user's home stays
readable: the config folder (pip.conf, uv.toml), a legacy ~/.pip/pip.conf, ~/.netrc, and an installed rustup or
cargo (its toolchains), each only where the user has one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from speclock.core.layout import cache_dir, cache_subdir


def tool_home() -> Path:
    """The home folder tools get: `tool-home` in speclock's cache."""
    return cache_subdir("tool-home", what="tools' home folder")


def tool_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this environment) for a tool: HOME, XDG_CACHE_HOME, XDG_DATA_HOME, XDG_STATE_HOME and, where
    the user has none, RUSTUP_HOME and CARGO_HOME under speclock's cache; a variable the user set wins."""
    env = dict(os.environ if base is None else base)
    user_home = Path(env.get("HOME") or os.path.expanduser("~"))
    home = tool_home()
    env.setdefault("SPECLOCK_CACHE", str(cache_dir()))  # a speclock child finds the same cache under the new HOME
    env.setdefault("XDG_CONFIG_HOME", str(user_home / ".config"))  # read, not written: pip.conf, uv.toml
    for var, sub in (("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local/share"), ("XDG_STATE_HOME", ".local/state")):
        env.setdefault(var, str(home / sub))
    for var, sub in (("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo")):
        if var not in env:  # an installed toolchain stays usable; otherwise rustup's proxy writes into ours
            env[var] = str(user_home / sub) if (user_home / sub).is_dir() else str(home / sub)
    if "PIP_CONFIG_FILE" not in env and (user_home / ".pip" / "pip.conf").is_file():
        env["PIP_CONFIG_FILE"] = str(user_home / ".pip" / "pip.conf")
    if "NETRC" not in env and (user_home / ".netrc").is_file():
        env["NETRC"] = str(user_home / ".netrc")
    env["HOME"] = str(home)
    return env
