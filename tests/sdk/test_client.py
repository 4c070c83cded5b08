"""sdk.client against the real control plane: uvicorn on loopback, real PostgreSQL.

Runs are fed through /internal as a worker feeds them (tests/web/live.py); the
live stream's resume is tested by cutting the client's connection for real
(tests/web/proxy.py), with the server still up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rl_core.envs.guess_number import GuessNumber
from rl_core.records import InflightSnapshot
from sdk.client import Client
from sdk.envserver import EnvServer
from sdk.errors import (
    BadRequest,
    Conflict,
    NotFound,
    RateLimited,
    Unauthorized,
    Unprocessable,
    Unreachable,
)
from sdk.models import MetricsStep, StatusChange
from sdk.sse import SseEvent, parse_events
from tests.sdk.serving import free_port, serving
from tests.web.live import LiveApi, live_api, migrated_database
from tests.web.proxy import cutting_proxy

SPEC: dict[str, Any] = {"environment": {"name": "guess_number"}, "train": {"steps": 5}}
SECRET = "sdk-test-secret-0123456789"


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    # Loopback webhooks allowed: the environment under test runs on this machine.
    with live_api(migrated_database(postgres_url), env_url_allowlist="loopback") as running:
        yield running


@pytest.fixture
def client(live: LiveApi) -> Iterator[Client]:
    with Client(live.url, live.tenant()) as c:
        yield c


def running_run(live: LiveApi, client: Client, steps: int = 5) -> tuple[str, Any]:
    run = client.create_run({**SPEC, "train": {"steps": steps}}, name="sdk-test")
    worker = live.worker(run.id)
    worker.start()
    return run.id, worker


def test_runs_create_get_list_cancel_and_events(client: Client) -> None:
    key = uuid.uuid4().hex
    first = client.create_run(SPEC, name="first", idempotency_key=key)
    again = client.create_run(SPEC, name="first", idempotency_key=key)
    assert again.id == first.id and first.status == "queued" and first.total_steps == 5
    assert client.get_run(first.id).name == "first"
    other = client.create_run(SPEC)
    assert [r.id for r in client.list_runs()] == [other.id, first.id]  # newest first
    assert [r.id for r in client.iter_runs(page_size=1)] == [other.id, first.id]
    assert client.cancel(first.id).status == "cancelled"
    assert [r.id for r in client.list_runs(status="cancelled")] == [first.id]
    events = client.events(first.id)
    assert [(e.from_status, e.to_status) for e in events][-1] == ("queued", "cancelled")
    assert all(e.id is not None for e in events)
    assert client.events(first.id, after=events[-1].id) == []
    assert client.events(first.id, after=events[0].id) == events[1:]


def test_errors_carry_the_apis_code_field_and_message(live: LiveApi, client: Client) -> None:
    with pytest.raises(NotFound) as missing:
        client.get_run("run_0123")
    assert missing.value.status == 404 and missing.value.code == "not_found"

    with pytest.raises(Unprocessable) as bad:
        client.create_run({"environment": {"name": "guess_number"}, "train": {"steps": -1}})
    assert bad.value.field == "spec.train.steps" and bad.value.problems

    run = client.create_run(SPEC)
    client.cancel(run.id)
    with pytest.raises(Conflict) as twice:
        client.cancel(run.id)
    assert twice.value.field == "status" and "cancelled" in twice.value.message

    with pytest.raises(BadRequest) as status:
        client.list_runs(status="sleeping")
    assert status.value.field == "status"

    with Client(live.url, "rlaas_not-a-key") as stranger, pytest.raises(Unauthorized):
        stranger.list_runs()
    # Another tenant's run is not there at all.
    with Client(live.url, live.tenant()) as other, pytest.raises(NotFound):
        other.get_run(run.id)

    with Client(f"http://127.0.0.1:{free_port()}", "k") as nobody, pytest.raises(Unreachable):
        nobody.list_runs()


def test_results_read_back_as_typed_records(live: LiveApi, client: Client) -> None:
    run_id, worker = running_run(live, client)
    for step in (1, 2):
        worker.step(step, {"reward/mean": 0.5 * step, "loss": 1.0 / step})
    t0 = 1_700_000_000_000_000
    worker.spans(
        [
            {"name": "train_step", "start_us": t0, "dur_us": 900, "track": "trainer", "step": 1},
            {
                "name": "model_call",
                "start_us": t0 + 5,
                "dur_us": 300,
                "track": "episode/e1",
                "step": 0,
                "args": {"tokens": 12},
            },
        ]
    )
    segments = [{"text": "user: guess\n", "trained": False}, {"text": "7", "trained": True}]
    worker.trajectories(
        [
            {
                "episode_id": f"{run_id}~s{s}-g0-e0",
                "step": s,
                "policy_version": s - 1,
                "group": 0,
                "reward": 1.0,
                "turns": 1,
                "end_state": "done",
                "end_reason": None,
                "model_tokens": 1,
                "total_tokens": 9,
                "duration_s": 0.2,
                "segments": segments,
                "sampling": {"temperature": 1.0},
                "info": {"answer": 7},
            }
            for s in (1, 1, 2)
        ]
    )
    worker.post("artifacts", kind="checkpoint", step=2, uri="file:///ckpt/2", size_bytes=123)
    worker.heartbeat(
        {
            "step": 2,
            "trainer": "training",
            "trainer_since_s": 0.5,
            "queue_depth": 3,
            "episodes": [{"episode_id": "e9", "stage": "env_step", "since_s": 1.5, "turn": 2}],
        }
    )

    assert [(p.step, p.value) for p in client.metrics(run_id, name="loss")] == [(1, 1.0), (2, 0.5)]
    timeline = client.timeline(run_id)
    assert {(s.name, s.track, s.dur_us) for s in timeline.spans} == {
        ("train_step", "trainer", 900),
        ("model_call", "episode/e1", 300),
    }
    assert not timeline.truncated and timeline.raw["displayTimeUnit"] == "ms"
    assert client.timeline(run_id, limit=1).truncated

    page = client.trajectories(run_id, limit=2)
    assert len(page.items) == 2 and page.next_cursor
    assert page.items[0].record.segments[1].trained and page.items[0].trained_text == "7"
    assert [t.record.step for t in client.iter_trajectories(run_id, page_size=1)] == [1, 1, 2]
    assert [t.record.info for t in client.trajectories(run_id, step=2).items] == [{"answer": 7}]

    [checkpoint] = client.checkpoints(run_id)
    assert (checkpoint.step, checkpoint.uri, checkpoint.size_bytes) == (2, "file:///ckpt/2", 123)
    inflight = client.inflight(run_id)
    assert isinstance(inflight.snapshot, InflightSnapshot) and inflight.reported_at
    assert inflight.snapshot.episodes[0].stage == "env_step"

    assert client.request_profile(run_id, 3) == 3
    assert worker.heartbeat()["profile_steps"] == 3


def test_iter_metrics_is_live_and_resumes_after_a_cut_connection(
    live: LiveApi, client: Client
) -> None:
    run_id, worker = running_run(live, client)
    for step in (1, 2, 3):
        worker.step(step, {"reward/mean": float(step)})
    seen: list[Any] = []
    with cutting_proxy(live.url) as proxy, Client(proxy.url, _key(client)) as through:
        events = through.stream(run_id, reconnect_delay_s=0.05)
        for event in events:
            seen.append(event)
            if isinstance(event, MetricsStep) and event.step == 3:
                break
        proxy.cut()  # mid-stream, the server still up
        for step in (4, 5):
            worker.step(step, {"reward/mean": float(step)})
        worker.finish("succeeded")
        seen.extend(events)  # the same iterator: it reconnects by itself
        heads = [r.decode("latin-1").lower() for r in proxy.requests if b"/stream" in r]
    steps = [e.step for e in seen if isinstance(e, MetricsStep)]
    assert steps == [1, 2, 3, 4, 5]  # none lost, none twice
    statuses = [e.status for e in seen if isinstance(e, StatusChange)]
    assert statuses[0] == "running" and statuses[-1] == "succeeded", statuses
    assert len(heads) >= 2 and "last-event-id: 3" in heads[1], heads

    # A finished run: everything after a given step, then the end.
    later = list(client.iter_metrics(run_id, after_step=3))
    assert [(m.step, m.metrics["reward/mean"]) for m in later] == [(4, 4.0), (5, 5.0)]


def test_a_stream_that_cannot_be_had_raises_unreachable(client: Client) -> None:
    run = client.create_run(SPEC)
    nothing_there = f"http://127.0.0.1:{free_port()}"
    with Client(nothing_there, _key(client)) as lost, pytest.raises(Unreachable) as err:
        list(lost.iter_metrics(run.id, max_reconnects=2, reconnect_delay_s=0.01))
    assert "failed 3 times in a row" in str(err.value) and nothing_there in str(err.value)


def test_environments_register_list_check_delete(client: Client) -> None:
    with pytest.raises(Unprocessable) as short:
        client.register_environment("game", "http://127.0.0.1:9/env", "too-short")
    assert short.value.field == "secret"

    with serving(EnvServer(GuessNumber(), secret=SECRET).app) as url:
        env = client.register_environment("game", url, SECRET, timeout_s=5, max_concurrency=4)
        assert env.id.startswith("env_") and env.max_concurrency == 4
        assert [e.id for e in client.list_environments()] == [env.id]
        assert client.get_environment(env.id).url == url
        check = client.check_environment(env.id)
        assert check.ok and check.error is None
        assert [c.path for c in check.calls] == ["/reset", "/close"]

    down = client.check_environment(env.id)  # the server is gone now
    assert not down.ok and down.error
    client.delete_environment(env.id)
    with pytest.raises(NotFound):
        client.get_environment(env.id)


def _key(client: Client) -> str:
    return str(client._http.headers["Authorization"]).removeprefix("Bearer ")


def test_waiting_for_a_run(live: LiveApi, client: Client) -> None:
    run_id, worker = running_run(live, client)
    with pytest.raises(TimeoutError, match="still running"):
        client.wait(run_id, timeout_s=0.2, interval_s=0.05)
    worker.finish("failed", error="the environment refused every episode")
    # Returns with the ended run (not the TimeoutError it raises when the time is up).
    done = client.wait(run_id, timeout_s=10, interval_s=0.05)
    assert done.status == "failed" and "refused" in (done.error or "")


def test_the_sse_parser_follows_the_spec() -> None:
    lines = [
        "retry: 2000",
        "",
        "id: 7",
        "event: metrics",
        'data: {"step":',
        "data:7}",
        "",
        ": keep-alive",
        "",
        "data:no space",
        "",
        "id: 8",
        "data: cut off",
    ]
    assert list(parse_events(lines)) == [
        SseEvent(event="metrics", data='{"step":\n7}', id="7"),
        SseEvent(event="message", data="no space", id=None),
    ]


def test_over_the_rate_is_rate_limited_with_retry_after(postgres_url: str) -> None:
    database = migrated_database(postgres_url)
    with live_api(database, quota_requests_per_minute=2) as tight:
        key = tight.tenant()
        with Client(tight.url, key) as c:
            c.list_runs()
            c.list_runs()
            with pytest.raises(RateLimited) as over:
                c.list_runs()
    assert over.value.status == 429 and over.value.retry_after_s and over.value.retry_after_s >= 1
    assert over.value.details["quota"]["name"] == "requests_per_minute"


def test_keys_rotate_through_the_client_and_the_cli(live: LiveApi) -> None:
    """Create a second key, move to it, revoke the first: the CLI as a user types it."""
    old = live.tenant()
    env = {**os.environ, "RLAAS_API_URL": live.url, "RLAAS_API_KEY": old}
    rlaas = [sys.executable, "-m", "sdk.cli"]

    def run(*args: str, key: str = old) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*rlaas, "keys", *args],
            env={**env, "RLAAS_API_KEY": key},
            capture_output=True,
            text=True,
            timeout=60,
        )

    created = run("create")
    assert created.returncode == 0, created.stderr
    new = created.stdout.strip()
    assert new.startswith("rlaas_") and new != old
    with Client(live.url, new) as client:
        keys = client.list_keys()
        assert len(keys) == 2 and all(k.key is None for k in keys)
        first = next(k for k in keys if old.startswith(f"rlaas_{k.prefix}_"))
    listed = run("list", key=new)
    assert f"{first.id}  rlaas_{first.prefix}_…  active" in listed.stdout
    revoked = run("revoke", first.id, key=new)
    assert revoked.returncode == 0 and f"{first.id}  revoked" in revoked.stdout
    with Client(live.url, old) as stale, pytest.raises(Unauthorized):
        stale.list_runs()
    last = run("revoke", next(k.id for k in keys if k.id != first.id), key=new)
    assert last.returncode != 0 and "last active key" in last.stderr
