"""Two processes that ensure the same engine env at once (two CI jobs, the suite's two workers): one installs, the
other waits and reuses it. Before the lock, the second saw the half-made env as an interrupted one and removed it
under the installer. uv is a stand-in here (a script on PATH that takes a second per install and counts them)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

FAKE_UV = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import os, sys, time
    from pathlib import Path
    args = sys.argv[1:]
    if args[0] == "venv":
        d = Path(args[-1])
        (d / "bin").mkdir(parents=True)
        os.symlink(sys.executable, d / "bin" / "python")
    elif args[:2] == ["pip", "install"]:
        py = Path(args[args.index("--python") + 1])
        with open(os.environ["FAKE_UV_COUNT"], "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        time.sleep(1.5)
        if not py.exists():
            sys.exit("the env was removed during the install")
        (py.parent.parent / "installed").write_text("yes")
    elif args[:2] == ["pip", "freeze"]:
        print("vllm==0.1.0")
    """
)


def test_two_processes_ensuring_one_env_install_it_once(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text(FAKE_UV)
    (bin_dir / "uv").chmod(0o755)
    count = tmp_path / "installs"
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        SPECLOCK_CACHE=str(tmp_path / "cache"),
        FAKE_UV_COUNT=str(count),
    )
    code = "import sys; from speclock.engines import envs; print(envs.ensure('vllm==0.1.0', log=lambda m: print(m, file=sys.stderr)))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0], results
    env_dir = tmp_path / "cache" / "envs" / "vllm-0.1.0"
    assert {r[0].strip() for r in results} == {str(env_dir / "bin" / "python")}
    assert len(count.read_text().split()) == 1, results  # installed once
    assert (env_dir / "installed").read_text() == "yes" and (env_dir / ".speclock-env.json").is_file()
    assert not any("incomplete" in r[1] for r in results), results


def test_env_list_shows_envs_not_their_locks(tmp_path):
    env = dict(os.environ, SPECLOCK_CACHE=str(tmp_path))
    (tmp_path / "envs" / "vllm-0.1.0").mkdir(parents=True)
    (tmp_path / "envs" / "vllm-0.1.0.lock").write_text("")
    proc = subprocess.run([sys.executable, "-m", "speclock.engines.envs", "list"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["vllm-0.1.0", "incomplete"], proc
