"""A sessions run through the whole product: an openai agent trains the tiny model via the API.

Tenant key → POST /v1/runs (environment ``sessions``) → a Celery worker claims it and
serves its gateway → the client opens sessions at the API (`SessionGateway.for_run`),
plays them with the official ``openai`` client through the API's proxy, ends them with
rewards → the run trains its steps and succeeds.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sdk.sessions import SessionGateway
from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]

SPEC = {
    "model": {"source": "builtin:tiny"},
    "environment": {"name": "sessions"},
    "agent": {"max_new_tokens": 8, "max_context": 96},
    "rollout": {"group_size": 2, "concurrency": 4},
    "algorithm": {"batch_groups": 2},
    "staleness": {"mode": "async", "max_staleness": 1},
    "train": {"steps": 2, "seed": 0},
}


def play(gateway: SessionGateway, task: int) -> None:
    with gateway.open(group=f"task-{task}", wait_s=60) as session:
        client = session.openai(max_retries=0)
        messages = [{"role": "user", "content": str(task % 8 + 1)}]
        for _ in range(2):
            answer = client.chat.completions.create(model="policy", messages=messages)
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
            messages.append({"role": "user", "content": "again"})
        session.end(reward=float(task % 2))


def test_an_openai_agent_trains_a_sessions_run_through_the_api(stack: Stack) -> None:
    stack.start_api()
    stack.start_worker()
    with stack.client() as client:
        created = client.post("/v1/runs", json={"spec": SPEC})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        gateway = SessionGateway.for_run(stack.api_url, stack.api_key, run_id)

        def status() -> str:
            return str(client.get(f"/v1/runs/{run_id}").json()["status"])

        done = threading.Event()
        played: list[int] = []
        failed: list[str] = []  # near the end the gateway closes under open sessions

        def agents() -> None:
            with ThreadPoolExecutor(4) as pool:
                task = 0
                while not done.is_set() and status() in ("queued", "starting", "running"):
                    futures = [pool.submit(play, gateway, task + k // 2) for k in range(4)]
                    for future in futures:
                        try:
                            future.result()
                            played.append(1)
                        except Exception as exc:
                            failed.append(f"{type(exc).__name__}: {exc}")
                    task += 2

        worker = threading.Thread(target=agents)
        worker.start()
        try:
            final = wait_until(
                lambda: status() if status() in ("succeeded", "failed", "cancelled") else None,
                300,
                f"run {run_id} to finish",
                stack,
            )
        finally:
            done.set()
            worker.join(60)
        run = client.get(f"/v1/runs/{run_id}").json()
        assert final == "succeeded", f"{run}\n{stack.dump_logs()}"
        assert run["current_step"] == 2 and len(played) >= 4, failed
        opened = client.get(f"/v1/runs/{run_id}/metrics", params={"name": "sessions/opened"})
        assert sum(p["value"] for p in opened.json()["points"]) >= 4
        page = client.get(f"/v1/runs/{run_id}/trajectories", params={"limit": 50}).json()
        played_back = [t for t in page["items"] if t["end_state"] == "done"]
        assert played_back and all(t["turns"] == 2 for t in played_back)
