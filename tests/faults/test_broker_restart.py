"""The broker is down at submit, or restarts and forgets its queue: every queued run is
delivered once it is back, and runs once.

Redis runs without persistence (``--save ''``), as in the deployment's compose file: a
restart empties the queue. The reaper sends a run again once it has sat in ``queued``
past ``RLAAS_REDISPATCH_AFTER_S`` (3 s here, conftest.py); a run sent twice still runs
once, because the lease decides who runs it.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.e2e.stack import REPO, Stack
from tests.faults.conftest import finished, services

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]


def _spec() -> dict[str, Any]:
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    spec["train"]["steps"] = 3
    return spec


def _finished(stack: Stack, run_id: str) -> dict[str, Any]:
    with stack.client() as client:
        run = finished(stack, client, run_id)
        events = client.get(f"/v1/runs/{run_id}/events").json()["items"]
    # Ran once: one claim, one start, no second attempt.
    assert [e["to_status"] for e in events] == ["queued", "starting", "running", "succeeded"]
    assert run["attempts"] == 1, run
    return run


def test_runs_submitted_while_the_broker_is_down_run_once_it_is_back(
    private_stack: tuple[Stack, str],
) -> None:
    stack, folder = private_stack
    stack.start_api()
    services("redis-stop", folder)
    with stack.client() as client:
        answer = client.post("/v1/runs", json={"spec": _spec()})
        # The run is durable before it is sent: accepted, queued, and not lost.
        assert answer.status_code == 201, answer.text
        run_id = answer.json()["id"]
        assert client.get(f"/v1/runs/{run_id}").json()["status"] == "queued"
    services("redis-start", folder)
    stack.start_worker()
    run = _finished(stack, run_id)
    assert run["status"] == "succeeded", stack.dump_logs()


def test_a_broker_restart_that_empties_its_queue_loses_no_run(
    private_stack: tuple[Stack, str],
) -> None:
    stack, folder = private_stack
    stack.start_api()
    with stack.client() as client:
        ids = [client.post("/v1/runs", json={"spec": _spec()}).json()["id"] for _ in range(2)]
    # Both were sent to the broker, and no worker has taken them yet: the restart empties
    # the queue with both messages in it.
    services("redis-stop", folder)
    services("redis-start", folder)
    stack.start_worker()
    for run_id in ids:
        run = _finished(stack, run_id)
        assert run["status"] == "succeeded", stack.dump_logs()
    assert "still queued; sending it to the broker again" in (stack.logs / "api.log").read_text()
