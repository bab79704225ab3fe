"""`speclock nix-check` (speclock.build.nixcheck.run_all): the offline flake checks as one command."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from speclock.build import nixcheck
from speclock.core.errors import EnvironmentProblem

pytestmark = pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (apt-get install -y nix-bin)")


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    nixcheck.add_commands(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_nix_check_reports_what_it_checked_as_json(capsys):
    assert _run(["nix-check", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "flake.nix" in result["parsed"]
    assert result["wheels_compared"] and all(n > 0 for n in result["wheels_compared"].values())
    assert "stacks-have-locks" in result["checks"] and result["flake_check_with_double"] == "ok"


def test_nix_check_without_nix_is_an_environment_problem(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no nix on it
    with pytest.raises(EnvironmentProblem) as err:
        nixcheck.require_nix()
    assert err.value.exit_code == 3 and "nix-bin" in (err.value.hint or "")
