"""How many CPU threads speclock's own torch work (the reference decoder, the float32 tie judge) may use."""

from __future__ import annotations

import os


def cpu_threads() -> int:
    """OMP_NUM_THREADS when it is a positive whole number, else this machine's cores.

    torch reads OMP_NUM_THREADS at start, but a later `torch.set_num_threads(n)` overrides it: code that sizes its
    own threads must ask here, or a cap set on purpose is lost. (Two threads per process beside busy cores made a
    test process 3x slower on 2 cores: the OpenMP team waits for its descheduled thread at every op.)
    """
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return os.cpu_count() or 1
