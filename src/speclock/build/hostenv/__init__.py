"""`speclock host-env`: a stack's locked environment built as a venv on a host without containers.

command (the command, build_host_env, the record's reader and env_command: host-env's API for fetch, doctor and
selfcheck) -> venv (the image's plan, build.envplan, carried out step by step in a temp folder) and host (what
the host answers: its lock target, its glibc, the packages --use-host-packages takes from it).
"""
