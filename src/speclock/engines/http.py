"""The HTTP helpers of the engine adapters that attach to a running server (vLLM, SGLang): one request, and
requests sent concurrently with a bound."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from speclock.core.errors import EnvironmentProblem

T = TypeVar("T")
R = TypeVar("R")


# body: a JSON request for an engine's server, in the server's own open-ended API
def http(url: str, body: dict[str, Any] | None = None, timeout: float = 600, *, server: str = "server") -> bytes:
    """GET `url` (POST `body` as JSON when given) and return the response body.

    An unreachable or failing server is an EnvironmentProblem naming `server` and the URL.
    """
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data_in: bytes = resp.read()  # urlopen is typed Any
            return data_in
    except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
        raise EnvironmentProblem(f"{server} {url}: {err}", hint="check that the server runs and the URL is right") from None


def map_bounded(fn: Callable[[T], R], items: Sequence[T], concurrency: int) -> list[R]:
    """[fn(item) for item in items], with up to `concurrency` calls in flight at once; results in the items' order.

    Once a call fails no further item is started; the error of the earliest failed item is raised after the
    calls in flight return. The worker threads are daemons: Ctrl-C leaves at once, not after the requests in
    flight (a server finishes or drops them itself).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    if concurrency == 1 or len(items) <= 1:
        return [fn(item) for item in items]
    results: list[Any] = [None] * len(items)
    errors: list[tuple[int, BaseException]] = []
    todo = iter(enumerate(items))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if errors:
                    return
                nxt = next(todo, None)
            if nxt is None:
                return
            i, item = nxt
            try:
                results[i] = fn(item)
            except BaseException as err:
                with lock:
                    errors.append((i, err))
                return

    threads = [
        threading.Thread(target=worker, name=f"speclock-request-{n}", daemon=True) for n in range(min(concurrency, len(items)))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    return results
