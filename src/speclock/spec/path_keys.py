"""Every path-valued key of a stack file, where its value must live, and the one check that holds it there.

spec.validate runs `check_path_keys` over PATH_KEYS for every stack it reads (`speclock stack check` and every
command that reads a stack). tests/test_stack_paths.py holds the table against spec.schema, so a key that names
a path cannot be added without a row here.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput
from speclock.core.layout import IMAGE, REPO_ROOT, in_image
from speclock.core.oserrors import os_error
from speclock.spec.schema import SCHEMA

# Where a value lives:
REPO = "repo"  # a file or folder of the repository (the checkout the stack belongs to)
PATCHES = "patches"  # a file under patches/<engine>/ (the image's copy inside an image)
PACKAGE = "package"  # a member of a wheel the stack pins (PathKey.package): read at build, so lexical only
SITE_PACKAGES = "site-packages"  # a glob inside the image's site-packages: validate._check_prune holds its rules


@dataclass(frozen=True)
class PathKey:
    key: str  # dotted, as in spec.schema
    lives: str  # REPO, PATCHES, PACKAGE or SITE_PACKAGES
    kind: str  # "folder", "file" or "glob": what must stand there when something does
    must_exist: bool  # at check time
    package: str = ""  # for PACKAGE: the key of the wheel that holds it
    absolute_ok: bool = False  # an absolute value names a folder on the serving host, mounted at run time


PATH_KEYS: tuple[PathKey, ...] = (
    # Model folders need not exist at check time: vllm-kimi's (1T parameters) are made on the build host, not in git.
    PathKey("draft.path", REPO, "folder", must_exist=False),
    PathKey("target.path", REPO, "folder", must_exist=False, absolute_ok=True),
    PathKey("patches.series", PATCHES, "file", must_exist=True),
    PathKey("target.gguf", PACKAGE, "file", must_exist=False, package="target.package"),
    PathKey("smoke.prompts_file", PACKAGE, "file", must_exist=False, package="smoke.prompts_package"),
    PathKey("prune.paths", SITE_PACKAGES, "glob", must_exist=False),
)

Bad = Callable[[str, str, str], BadInput]


def patches_root() -> Path:
    """Where patches/<engine>/ folders are: the image's copy inside an image, else the repository's."""
    if os.environ.get("SPECLOCK_PATCHES_DIR"):  # tests and out-of-tree series
        return Path(os.environ["SPECLOCK_PATCHES_DIR"])
    if in_image() and IMAGE.patches_dir.is_dir():
        return IMAGE.patches_dir
    return REPO_ROOT / "patches"


def lexical_problem(value: str, where: str) -> str | None:
    """Why `value` is not a relative path inside `where` on its face (before any file is looked at), or None."""
    if not value:
        return f"is empty, where a path inside {where} belongs"
    if "\x00" in value or "\\" in value:
        return "has a NUL or a backslash"
    if value.startswith("/"):
        return f"is absolute, where a path inside {where} belongs"
    odd = [part for part in value.split("/") if part in ("", ".", "..")]
    if odd:
        return f"is not a path inside {where} (it has the part {odd[0]!r})"
    return None


# s: validate's sections (section -> key -> value, types checked); given: the file's own, as parsed (dict[str, Any]: TOML)
def check_path_keys(s: dict[str, dict[str, Any]], given: dict[str, dict[str, Any]], repo_root: Path, bad: Bad) -> None:
    """Refuse any path-valued key that is empty, absolute, climbs out with '..', or (for files of the repository)
    resolves through symbolic links to outside its folder, loops, or is missing where it must exist.

    `s`: the validated sections with defaults; `given`: the sections as written (an empty default is no path,
    an empty string written down is a mistake)."""
    for pk in PATH_KEYS:
        if pk.lives == SITE_PACKAGES:
            continue  # globs: validate._check_prune refuses '', absolute, '.' and '..' parts in its own terms
        sec, name = pk.key.rsplit(".", 1)
        value = s[sec][name]
        written = name in given.get(sec, {})
        for item in value if isinstance(value, list) else [value]:
            shown = f"entry {item!r}" if isinstance(value, list) else repr(item)
            if not item and not written:
                continue  # not set: the rules across keys say whether it must be
            root, where = _home(pk, s, repo_root)
            if pk.absolute_ok and isinstance(item, str) and item.startswith("/"):
                # mounted at run time (`stack new` writes such stacks): not on this machine's disk, so lexical only
                root, where, item = None, "the serving host's file system", item[1:] or "/"
            problem = lexical_problem(item, where)
            if problem:
                optional = not SCHEMA[sec][name][1]
                raise bad(pk.key, f"{shown} {problem}", f"a path inside {where}" + (", or leave the key out" if optional else ""))
            if pk.lives == PACKAGE and not _value(s, pk.package):
                raise bad(pk.key, f"{shown} is set, but {pk.package} is empty", f"set {pk.package} or remove {pk.key}")
            if root is not None:
                _check_on_disk(pk, item, shown, root, bad)


def _home(pk: PathKey, s: dict[str, dict[str, Any]], repo_root: Path) -> tuple[Path | None, str]:
    """The folder a key's value must stay inside (None: not on this machine) and how to name it to a person."""
    if pk.lives == REPO:
        return repo_root, f"the repository {repo_root}"
    if pk.lives == PATCHES:
        base = patches_root() / s["engine"]["name"]
        return base, str(base)
    wheel = _value(s, pk.package)
    return None, f"the wheel of {pk.package}" + (f" ({wheel})" if wheel else "")


def _value(s: dict[str, dict[str, Any]], dotted: str) -> Any:
    sec, name = dotted.rsplit(".", 1)
    return s[sec][name]


def _check_on_disk(pk: PathKey, rel: str, shown: str, root: Path, bad: Bad) -> None:
    target = root / rel
    try:
        os.stat(target)
        exists = True
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise bad(
                pk.key, f"{shown}: {_loop_in(root, rel)} is a symbolic link loop", f"a {pk.kind} inside {root}; replace the link"
            ) from None
        if err.errno != errno.ENOENT:
            problem = os_error(err, target)
            if not isinstance(problem, BadInput):
                raise problem from None  # permission, disk: the machine's problem, not the stack's
            raise bad(pk.key, f"{shown}: {problem.message}", f"a {pk.kind} inside {root}") from None
        exists = False
    real, root_real = Path(os.path.realpath(target)), Path(os.path.realpath(root))
    if real != root_real and root_real not in real.parents:
        raise bad(
            pk.key,
            f"{shown} resolves outside {root} (to {real})",
            f"a {pk.kind} inside {root}; remove the symbolic link that leads out",
        )
    if not exists:
        if pk.must_exist:
            raise bad(pk.key, f"{shown}: {target} does not exist", f"a {pk.kind} inside {root}")
        return
    if (pk.kind == "folder") != target.is_dir():
        raise bad(pk.key, f"{shown}: {target} is not a {pk.kind}", f"a {pk.kind} inside {root}")


def _loop_in(root: Path, rel: str) -> Path:
    """The first link on the way from `root` to `rel` that never ends."""
    here = root
    for part in rel.split("/"):
        here = here / part
        if os.path.islink(here):
            try:
                os.stat(here)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    return here
    return root / rel
