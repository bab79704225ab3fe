"""What a stack removes from its image ([prune]): the script the venv step runs right after the install.

Interface (used by the build context stager): prune_script(stack, lock) -> the text of a POSIX sh script,
staged as wheels/prune.sh and run in the venv stage's install step as `sh /wheels/prune.sh /opt/venv`, so
the pruned files never reach a layer. This first version prunes nothing."""

from __future__ import annotations

from typing import Any

from speclock.spec.stack import Stack


def prune_script(stack: Stack, lock: dict[str, Any]) -> str:
    """A sh script that removes the stack's declared [prune] paths from the venv given as $1."""
    return "#!/bin/sh\n# speclock prune: nothing declared\nset -eu\n"
