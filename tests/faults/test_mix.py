"""The tiny model trained against a server that injects a mix of faults, and an outage."""

from __future__ import annotations

from typing import Any

import pytest

import rl_core.pipeline.build
from rl_core.host.sinks import MemorySink
from rl_core.pipeline.queue import Group
from rl_core.pipeline.runner import train
from tests.sdk.serving import serving

from .env_runs import SECRET, target, tiny_spec
from .faulty_env import FaultPlan, FaultyEnv

TIMEOUT_S = 1.0
BREAKER_FAILURES = 3
# Answers of 500 in a row: twice what opens the breaker, so that one success landing in
# the middle (an answer sent just before) cannot keep it closed; and short, since each
# probe that fails costs every call waiting on the breaker one of its attempts.
OUTAGE = 2 * BREAKER_FAILURES
RATES = {
    "timeout": 0.10,
    "status_5xx": 0.10,
    "malformed": 0.05,
    "hang": 0.02,
    "oversized": 0.01,
    "slow_drip": 0.02,
    "redirect": 0.02,
}


def test_a_mix_of_faults_is_counted_by_reason_and_no_failed_episode_is_trained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per request: 10 % timeouts, 10 % 5xx, 5 % malformed JSON, 2 % hangs, 1 % answers of
    9 MiB, 2 % slow drips, 2 % redirects (and one of each early on); a run of 20
    stragglers; then an outage of 6 answers of 500 in a row. The run trains its 4
    steps; the worker counts each fault under its reason, exactly where the server's
    answer reached it; every episode that got a fault no retry mends (malformed,
    oversized, redirect) failed, and no failed episode reached a batch; the breaker
    opened in the outage and closed after it."""
    trained: list[Any] = []
    real_build_batch = rl_core.pipeline.build.build_batch

    def spy(groups: list[Group], **kwargs: Any) -> Any:
        trained.extend(t for g in groups for t in g.to_train)
        return real_build_batch(groups, **kwargs)

    monkeypatch.setattr(rl_core.pipeline.build, "build_batch", spy)
    plan = FaultPlan(RATES, seed=5, forced_at=20, straggler_at=60, outage_at=150, outage_len=OUTAGE)
    server = FaultyEnv(plan, secret=SECRET, client_timeout_s=TIMEOUT_S)
    spec = tiny_spec(
        "env_faulty",
        environment={
            "webhook": {
                "timeout_s": TIMEOUT_S,
                "retries": 5,
                "backoff_s": 0.05,
                "backoff_max_s": 0.2,
                "breaker_failures": BREAKER_FAILURES,
                "breaker_cooldown_s": 0.3,
                # About 8 % of the episodes get a fault no retry mends.
                "failure_budget": 0.3,
            }
        },
        rollout={"group_size": 8, "concurrency": 64},
        algorithm={"batch_groups": 8},
        train={"steps": 4},
    )
    sink = MemorySink()
    with serving(server) as url:
        hook = target("env_faulty", url, concurrency=64, timeout_s=TIMEOUT_S)
        result = train(spec, sink=sink, webhooks={"env_faulty": hook})

    assert result.steps_completed == 4
    injected = server.injected
    assert all(injected[f] > 0 for f in RATES), injected
    assert injected["straggler"] == 20 and injected["outage"] == OUTAGE
    metrics = [m for _, m in sink.steps]

    def total(name: str) -> float:
        return sum(m[name] for m in metrics)

    # Each fault the worker met is counted under its own reason, and only there: never
    # more than the server answered (requests still in flight when the run ended, and
    # those after the last step's report, are not in the step metrics).
    answered = {
        # with any 5xx the game's own server answered (it happened once, under load)
        "status_error": injected["status_5xx"] + injected["outage"] + server.unplanned_5xx,
        "protocol": injected["malformed"],
        "too_large": injected["oversized"],
        "redirect": injected["redirect"],
    }
    for reason, most in answered.items():
        assert 1 <= total(f"env/faults/{reason}") <= most, (reason, most)
    # No answer in time: injected timeouts, hangs and drips (and any request the loaded
    # machine was too slow for, so no upper bound here).
    assert total("env/faults/timeout") >= 1
    assert total("env/limit_cuts") >= 1 and total("env/overloads_absorbed") >= 1
    # The outage opened the breaker; a probe after it closed it. (Whether a call came
    # while it was open, and failed at once as `circuit_open`, is up to the scheduler.)
    assert total("env/breaker_opened") >= 1 and total("env/breaker_closed") >= 1

    # Failed episodes: counted, and never trained on.
    assert trained and all(t.kept and t.end_state != "env_error" for t in trained)
    trained_ids = {t.episode_id for t in trained}
    assert not trained_ids & server.doomed
    failed = total("failures/env_reset") + total("failures/env_step")
    assert failed >= 1 and total("episode/env_error") >= 1
