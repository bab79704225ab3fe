"""Release versions and version ranges (`>=0.15.0, <0.18.0`), with no third-party dependency.

Covers what engine releases use: N(.N)*, pre-releases (a/b/rc), .postN, .devN and a +local part
(ignored for ordering, as PEP 440 does for ranges).
"""

from __future__ import annotations

import re

from speclock.core.errors import BadInput

_VERSION = re.compile(
    r"^v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|rc|alpha|beta|c)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?post[-_.]?(?P<post>\d*))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?"
    r"(?:\+(?P<local>[a-z0-9.]+))?$",
    re.I,
)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2}
_OPS = (">=", "<=", "==", "!=", ">", "<")


def version_key(text: str) -> tuple[tuple[int, ...], tuple[int, int], int, float]:
    """A sort key for a release version; raises ValueError for text that is not one."""
    m = _VERSION.match(text.strip())
    if not m:
        raise ValueError(f"not a version: {text!r}")
    release = [int(x) for x in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    # order: dev < pre < final < post
    if m["pre"]:
        pre = (_PRE[m["pre"].lower()], int(m["pre_n"] or 0))
    elif m["dev"] is not None and m["post"] is None:
        pre = (-1, 0)
    else:
        pre = (3, 0)
    post = int(m["post"] or 0) if m["post"] is not None else -1
    dev = int(m["dev"] or 0) if m["dev"] is not None else float("inf")
    return (tuple(release), pre, post, dev)


def parse_range(text: str, where: str = "version range") -> list[tuple[str, str]]:
    """`>=0.15.0, <0.18.0` -> [(">=", "0.15.0"), ("<", "0.18.0")]. Raises BadInput naming `where`."""
    clauses: list[tuple[str, str]] = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        op = next((o for o in _OPS if part.startswith(o)), None)
        if op is None:
            raise BadInput(
                f"{where}: clause {part!r} has no comparison operator",
                hint="write e.g. '>=0.15.0, <0.18.0' (operators: >=, <=, >, <, ==, !=)",
            )
        ver = part[len(op) :].strip()
        try:
            version_key(ver)
        except ValueError:
            raise BadInput(f"{where}: {ver!r} in {part!r} is not a version", hint="e.g. 0.17.1") from None
        clauses.append((op, ver))
    if not clauses:
        raise BadInput(f"{where}: empty version range", hint="e.g. '>=0.15.0, <0.18.0'")
    return clauses


def in_range(version: str, clauses: list[tuple[str, str]]) -> bool:
    have = version_key(version)
    for op, ver in clauses:
        want = version_key(ver)
        ok = {">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want, "==": have == want, "!=": have != want}[
            op
        ]
        if not ok:
            return False
    return True
