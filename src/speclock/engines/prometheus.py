"""A server's Prometheus `/metrics` page, read with prometheus_client's own parser (no regexes).

The server adapters (vLLM, SGLang) read their counters here. Counters are cumulative since the server
started, so every value must be a finite, whole count >= 0; anything else (a malformed page, `NaN`, a
fraction) is a server that does not speak the format the adapter was written for, reported with the
URL and the sample. prometheus_client is in every engine lock (vLLM and SGLang depend on it), so it is
importable wherever speclock talks to an engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from speclock.core.errors import EnvironmentProblem


@dataclass(frozen=True)
class CounterSample:
    name: str  # without the `_total` suffix
    labels: dict[str, str]
    value: int


def _label_text(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""


def counter_samples(body: bytes | str, prefix: str, *, server: str, url: str) -> list[CounterSample]:
    """Every counter sample (`<name>_total`) whose name starts with `prefix`, with its labels and count.

    `_created` timestamps, histogram `_bucket`/`_sum`/`_count` and gauges are not counters and are skipped,
    whether or not the page carries `# TYPE` lines. A page that does not parse, or a counter that is not a
    finite whole number >= 0, is an EnvironmentProblem naming the server, the URL and the sample.
    """
    try:
        # optional (prometheus_client, in every engine's environment): imported only where it is used
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as err:
        raise EnvironmentProblem(
            f"prometheus_client is not importable here ({err}): it reads {server} {url}",
            hint="run speclock in the engine's environment (every engine lock has "
            "prometheus_client), or `pip install prometheus_client`",
        ) from None
    try:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError, KeyError) as err:  # what the parser raises on a malformed page
        raise EnvironmentProblem(
            f"{server} {url} is not Prometheus text: {err}",
            hint="check that the URL is the engine's own server (its /metrics page)",
        ) from None
    out = []
    for family in families:
        for s in family.samples:
            if not s.name.startswith(prefix) or not s.name.endswith("_total"):
                continue
            value = s.value
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or value != int(value):
                raise EnvironmentProblem(
                    f"{server} {url}: counter {s.name}{_label_text(s.labels)} is {value!r}, not a whole count >= 0",
                    hint="the server's metrics are not what this engine adapter reads; "
                    "check the engine version against the stack's",
                )
            out.append(CounterSample(s.name[: -len("_total")], dict(s.labels), int(value)))
    return out
