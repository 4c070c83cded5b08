"""A naive stdlib server (listen backlog 5, HTTP/1.0) under 128 episodes in flight."""

from __future__ import annotations

from typing import Any

from rl_core.host.sinks import MemorySink
from rl_core.pipeline.runner import train

from .env_runs import naive_server, target, tiny_spec


def test_a_backlog_of_5_serves_128_episodes_in_flight_once_the_worker_adapts() -> None:
    """128 episodes open their connections at once; a stdlib `ThreadingHTTPServer` keeps 5
    waiting to be accepted and drops or stalls the rest. The worker lowers its limit on
    the requests in flight to the server and retries, the run completes, and no episode
    fails: the server is slow to accept, not broken."""
    stats: dict[str, Any] = {}
    sink = MemorySink()
    spec = tiny_spec("env_naive", environment={"webhook": {"timeout_s": 2.0}})
    with naive_server(stats) as url:
        hook = target("env_naive", url, concurrency=128, timeout_s=2.0)
        result = train(spec, sink=sink, webhooks={"env_naive": hook})
    assert result.steps_completed == 2
    metrics = [m for _, m in sink.steps]
    assert sum(m["env/limit_cuts"] for m in metrics) >= 1
    assert min(m["env/concurrency_limit_min"] for m in metrics) < 128
    assert sum(m["failures/total"] for m in metrics) == 0, metrics
    assert sum(m["episode/env_error"] for m in metrics) == 0
    # The tiny model rarely ends a turn within 4 tokens, so most episodes are a reset and
    # a close: 256 trained episodes at least, each reset once or more.
    assert stats["requests"]["/reset"] >= 2 * 128
