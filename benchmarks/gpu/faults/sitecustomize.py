"""A slow-drafter fault for the GPU drills, loaded by Python at start-up in every process of an engine (this folder on
PYTHONPATH; the engines' worker processes inherit it): with SPECLOCK_FAULT=slow:MS each drafted step of SGLang's
EAGLE worker (EagleDraftWorker.draft, sglang/srt/speculative/eagle_worker_v2.py, read in 0.5.15) sleeps MS
milliseconds, so the drafted engine is slower than plain at batch 1 and the gate must FAIL naming
smoke.thresholds.min_speedup. Plain engines never draft, so they never reach it. vLLM's drill is its eager drafter
(benchmarks/gpu/run.py, vllm-fault-eager); this is SGLang's.
"""

import os
import time

_MODULE = "sglang.srt.speculative.eagle_worker_v2"


def _patch(module) -> None:
    cls = getattr(module, "EagleDraftWorker", None)
    if cls is None or getattr(cls.draft, "_speclock_fault", False):
        return
    delay = int(os.environ["SPECLOCK_FAULT"].split(":", 1)[1]) / 1000
    original = cls.draft

    def draft(self, *args, **kwargs):
        time.sleep(delay)
        return original(self, *args, **kwargs)

    draft._speclock_fault = True
    cls.draft = draft


if os.environ.get("SPECLOCK_FAULT", "").startswith("slow:"):
    from speclock.core.import_hooks import after_import

    after_import(_MODULE, _patch)
