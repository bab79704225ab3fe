"""Errors that end a speclock command, each with its exit code (0 ok, 1 check failed, 2 bad input, 3 environment).

Raise them anywhere; `speclock.cli` turns them into one message and one exit code.
Messages are written for the user: what failed, where, and what to do next.
"""


class SpeclockError(Exception):
    """Base class: a message for the user and an exit code."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  what to do: {self.hint}"
        return self.message


class CheckFailed(SpeclockError):
    """A gate, a doctor check or a consistency check failed (exit 1)."""

    exit_code = 1


class BadInput(SpeclockError):
    """Usage error or an invalid stack, lock, report or prompt file (exit 2)."""

    exit_code = 2


class EnvironmentProblem(SpeclockError):
    """Something the machine lacks: a builder, an engine, a GPU, a reachable registry (exit 3)."""

    exit_code = 3
