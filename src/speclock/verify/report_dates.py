"""When smoke began to write the report keys that came after the schema's first day, and `predates` to ask it.

The keys and their types are the model, speclock.verify.report_types.SmokeReport; these dates say which of its
optional keys a report of a given age must have (speclock.verify.plausibility, speed, speed_load judge it)."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

# When smoke began to write a key (UTC, the time of the commit that added it): a report created before then lacks it
# because it could not have it, and is judged with a WARN saying what it cannot show; a newer report without it is
# refused naming the key (a missing key never switches a rule off). The keys smoke wrote from its first day
# (4290442, 2026-12-02T11:17:57Z) are required by the model.
GPU_ARCH_SINCE = "2026-12-02T12:29:52Z"  # 135bc69: gpu.arch, the arch smoke saw (null without a GPU)
PROFILE_SINCE = "2026-12-05T05:50:22Z"  # eb1d048: profile {name, temperature, seeds, num_prompts, max_tokens}
BATCH1_SINCE = "2026-12-06T18:49:01Z"  # 89a9f2f: batch-1 speed (throughput.batch1)
GPU_NAME_SINCE = BATCH1_SINCE  # 89a9f2f too: gpu.name, driver, cuda (torch's device name, in the engine's process)
LOADED_SINCE = "2026-12-07T12:30:00Z"  # speed under load (throughput.loaded)


def predates(report: Mapping[str, Any], since: str) -> bool:
    """The report was created before `since` (both ISO 8601 UTC, compared as instants); a report without a valid
    `created` is taken as new (held to every rule)."""
    try:
        created = _dt.datetime.fromisoformat(str(report.get("created") or "").replace("Z", "+00:00"))
        return created < _dt.datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        return False
