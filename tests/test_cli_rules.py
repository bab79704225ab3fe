"""The rules every `speclock` command keeps, checked across the whole CLI by introspection.

- Every numeric option is checked when parsed (a speclock.core.args type): -1, 0 where a count is asked,
  NaN, infinity and text are refused with exit 2 before any work starts.
- Every command's --help works.
- Every command that takes --stack refuses a stack that does not exist, or a name that leaves
  stacks/, with exit 2 and no traceback.
"""

from __future__ import annotations

import argparse

import pytest
from fuzz_support import assert_clean_refusal, run_cli

from speclock.cli import build_parser
from speclock.core import args as argtypes

CHECKED_TYPES = {
    getattr(argtypes, n) for n in ("positive_int", "non_negative_int", "positive_float", "non_negative_float", "probability")
}


def _commands(parser: argparse.ArgumentParser, prefix=()):
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, prefix + (name,))


def _numeric_options():
    for prefix, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.type in argtypes.TEXT_TYPES:  # a host name, checked by its own test (test_input_bounds.py)
                continue
            if action.type is not None and (
                action.type in (int, float)
                or action.type in CHECKED_TYPES
                or getattr(action.type, "__module__", "") == "speclock.core.args"
            ):
                yield " ".join(prefix), (action.option_strings or [action.dest])[-1], action


NUMERIC = list(_numeric_options())
COMMANDS = [p for p, _ in _commands(build_parser()) if p]


def test_the_cli_has_numeric_options_to_check():
    assert len(NUMERIC) > 20, NUMERIC  # the walk reaches the sub-sub-commands (train ...)


@pytest.mark.parametrize("command,option,action", NUMERIC, ids=[f"{c}:{o}" for c, o, _ in NUMERIC])
def test_every_numeric_option_is_checked_at_parse_time(command, option, action):
    assert action.type not in (int, float), (
        f"`speclock {command} {option}` uses plain {action.type.__name__}: use a speclock.core.args type so "
        "nonsense is refused when parsed"
    )
    for bad in ("-1", "nan", "inf", "-inf", "ten", ""):
        with pytest.raises((argparse.ArgumentTypeError, ValueError, TypeError)):
            action.type(bad)


@pytest.mark.parametrize("command", [" ".join(c) for c in COMMANDS])
def test_every_command_explains_itself(command):
    code, out, err = run_cli(*command.split(), "--help")
    assert code == 0, err
    assert "usage: speclock" in out


def test_a_bad_number_is_exit_2_through_the_real_cli():
    code, _out, err = run_cli("fetch", "--jobs", "0")
    assert code == 2 and "--jobs" in err, err
    code, _out, err = run_cli("train", "prompts", "-n", "-5")
    assert code == 2 and "--num-prompts" in err, err


STACK_COMMANDS = [
    " ".join(p)
    for p, parser in _commands(build_parser())
    if p
    and any("--stack" in a.option_strings for a in parser._actions)
    and not any(a.required for a in parser._actions if a.option_strings and "--stack" not in a.option_strings)
    and not any(
        a.nargs is None and not a.option_strings and a.dest != "help" and not isinstance(a, argparse._SubParsersAction)
        for a in parser._actions
    )
]


def test_stack_commands_found():
    assert {"lock", "fetch", "doctor"} <= set(STACK_COMMANDS), STACK_COMMANDS


@pytest.mark.parametrize("command", STACK_COMMANDS)
@pytest.mark.parametrize("stack", ["no-such-stack", "../../etc/passwd", "/nonexistent/x.toml"])
def test_every_stack_command_refuses_a_missing_or_escaping_stack(command, stack, tmp_path):
    code, _out, err = run_cli(*command.split(), "--stack", stack, env={"SPECLOCK_CACHE": str(tmp_path / "cache")})
    assert_clean_refusal(code, err, allowed=(2,))


def test_the_command_table_names_the_module_that_adds_each_command():
    """cli.COMMANDS lets a run import only its command's module: every command of every module is in it, under
    that module, and nothing else is (a command missing from it would still run, through the whole parser)."""
    import importlib

    from speclock import cli

    added = {}
    for module in cli.COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).add_commands(sub)
        added.update(dict.fromkeys(sub.choices, module))
    assert added == cli.COMMANDS


@pytest.mark.parametrize(
    "argv, modules",
    [
        (["build-image", "--stack", "x"], ["speclock.build.image"]),
        (["-v", "--root", "/r", "lock", "--stack", "x"], ["speclock.spec.cli"]),
        (["--root=/r", "fetch"], ["speclock.build.fetch"]),
        (["--help"], None),
        (["--version"], None),
        (["no-such-command"], None),
        ([], None),
    ],
)
def test_a_named_command_imports_only_its_module(argv, modules):
    from speclock.cli import _named_module

    assert _named_module(argv) == modules
