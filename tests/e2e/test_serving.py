"""A trained checkpoint answers chat completions through the API, at once.

Tenant key → POST /v1/runs (2 steps, a checkpoint each) → the run succeeds → the official
``openai`` client, its base URL the run's, asks ``model="latest"``: the API sends a serve
order, answers 503 + Retry-After while a Celery worker (``--serve``) restores the
checkpoint into a JAX engine, then proxies the call to it. The answer is what the
restored policy samples with the same seed in the test's process (tokens and logprobs),
and not what the untrained model does; another tenant and an unknown step get 404s; the
server deregisters once idle.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

import httpx
import psycopg
import pytest
from openai import OpenAI

from rl_core.pipeline import configs
from rl_core.pretrained.sources import load_model
from rl_core.protocol.chat_completions import parse_request
from rl_core.rollout.jax_engine import JaxEngine
from rl_core.sessions.session import ChatSession
from rl_core.spec import parse_spec
from tests.e2e.stack import REPO, Stack, rlaas, wait_until
from worker.serving import Served, load_policy, session_config

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]

IDLE_S = 3  # the worker's server stops this long after its last call
# tiny-game-short's run, 2 steps: groups of 8 guessers, so that some groups' rewards
# differ and the steps move the weights (groups of 2 all scored 0 trained nothing).
SPEC = {
    "model": {"source": "builtin:tiny"},
    "environment": {"name": "guess_number", "config": {"low": 1, "high": 8, "max_turns": 4}},
    "agent": {"max_turns": 4, "max_new_tokens": 16, "max_context": 256},
    "rollout": {"group_size": 8, "concurrency": 32, "sampling": {"temperature": 1.0}},
    "algorithm": {"batch_groups": 4, "learning_rate": 0.003},
    "train": {"steps": 2, "seed": 0, "checkpoint_interval": 1},
}
ASK = {
    "messages": [{"role": "user", "content": "guess"}],
    # Sampled with a seed, logprobs asked: the tokens and their logprobs are the weights'
    # fingerprint (the tiny model's greedy text is all <unk> before and after 2 steps).
    "temperature": 1.0,
    "seed": 7,
    "logprobs": True,
    "max_tokens": 8,
}


def sampled_here(uri: str | None, step: int) -> list[tuple[str, float]]:
    """The answer's tokens and logprobs from the checkpoint at ``uri`` restored here, in the
    test's process, or from the untrained model (``uri`` None)."""
    spec = parse_spec(SPEC)
    if uri is None:
        model, tokenizer = load_model(spec.model, seed=spec.train.seed)
        engine = JaxEngine(model, config=configs.engine_config(spec, tokenizer, model.config))
        served = Served(engine, tokenizer, session_config(spec), name="base")
    else:
        served = load_policy(spec, uri, step)

    async def answer() -> list[tuple[str, float]]:
        session = ChatSession(
            "here", engine=served.engine, tokenizer=served.tokenizer, config=served.config
        )
        completion = await session.complete(parse_request({"model": "here", **ASK}))
        logprobs = completion.choices[0].logprobs
        assert logprobs is not None and logprobs.content
        return [(t.token, t.logprob) for t in logprobs.content]

    return asyncio.run(answer())


def same(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> bool:
    return [t for t, _ in a] == [t for t, _ in b] and all(
        abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a, b, strict=True)
    )


def test_a_finished_runs_checkpoint_answers_the_openai_client(stack: Stack) -> None:
    stack.env["RLAAS_SERVE_IDLE_S"] = str(IDLE_S)
    stack.start_api()
    stack.start_worker()  # with --serve
    other = subprocess.run(
        [*rlaas(), "tenants", "create", "other"],
        env=stack.env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert other.returncode == 0, other.stderr
    other_key = other.stdout.strip().splitlines()[-1]
    with stack.client() as client:
        created = client.post("/v1/runs", json={"spec": SPEC})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]

        def finished() -> dict[str, object] | None:
            run = client.get(f"/v1/runs/{run_id}").json()
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        t0 = time.monotonic()
        run = wait_until(finished, 180, f"run {run_id} to finish", stack)
        trained_s = time.monotonic() - t0
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        checkpoints = client.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]
        newest = max(checkpoints, key=lambda c: c["step"])
        assert newest["step"] == 2

        url = f"/v1/runs/{run_id}/chat/completions"
        unknown = client.post(url, json={"model": "step-99", **ASK})
        assert unknown.status_code == 404, unknown.text
        assert "step-1, step-2" in unknown.text and "latest" in unknown.text
        theirs = httpx.post(
            f"{stack.api_url}{url}",
            json={"model": "latest", **ASK},
            headers={"Authorization": f"Bearer {other_key}"},
        )
        assert theirs.status_code == 404, theirs.text

        openai = OpenAI(
            base_url=f"{stack.api_url}/v1/runs/{run_id}", api_key=stack.api_key, max_retries=30
        )
        started = time.monotonic()
        answer = openai.chat.completions.create(model="latest", **ASK)  # type: ignore[call-overload]
        loaded_s = time.monotonic() - started
        assert answer.model == "step-2"  # the step the worker loaded
        assert answer.choices[0].logprobs is not None
        served = [(t.token, t.logprob) for t in answer.choices[0].logprobs.content or []]
        assert len(served) == answer.usage.completion_tokens == 8, answer
        t0 = time.monotonic()
        assert same(served, sampled_here(newest["uri"], 2)), (served, stack.dump_logs())
        assert not same(served, sampled_here(None, 0)), "the answer is the untrained model's"
        here_s = time.monotonic() - t0

        # Streamed, from the server already loaded, the step named by its number.
        chunks = list(openai.chat.completions.create(model="2", stream=True, **ASK))  # type: ignore[call-overload]
        assert {c.model for c in chunks} == {"step-2"}
        assert chunks[-1].choices[0].finish_reason == "length"

        # Idle for IDLE_S: the worker stops its server and deregisters it.
        conninfo = stack.env["RLAAS_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")

        def deregistered() -> bool:
            with psycopg.connect(conninfo) as conn:
                row = conn.execute("SELECT count(*) FROM checkpoint_servers").fetchone()
            return row is not None and row[0] == 0

        wait_until(deregistered, IDLE_S + 30, "the idle server to deregister", stack)
    print(f"trained {trained_s:.1f} s, first call {loaded_s:.1f} s, here {here_s:.1f} s")
