"""The one HTTP helper of the engine adapters that attach to a running server (vLLM, SGLang)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from speclock.core.errors import EnvironmentProblem


def http(url: str, body: dict | None = None, timeout: float = 600, *, server: str = "server") -> bytes:
    """GET `url` (POST `body` as JSON when given) and return the response body.

    An unreachable or failing server is an EnvironmentProblem naming `server` and the URL.
    """
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
        raise EnvironmentProblem(f"{server} {url}: {err}", hint="check that the server runs and the URL is right") from None
