"""Python package names and wheel file names: the one place that normalises them."""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[-_.]+")


def normalize(name: str) -> str:
    """PEP 503 project name: case-insensitive, a run of '-', '_', '.' is one '-' ('Foo_Bar' -> 'foo-bar')."""
    return _SEPARATORS.sub("-", name).lower()


def wheel_escape(name: str) -> str:
    """The name as a wheel file name writes it (PEP 427 / binary distribution format): 'foo-bar' -> 'foo_bar'."""
    return _SEPARATORS.sub("_", name).lower()


def wheel_name_parts(filename: str) -> tuple[str, str] | None:
    """(distribution, version) as written in NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl, or None if not that shape."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        return None
    return parts[0], parts[1]
