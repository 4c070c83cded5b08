"""The ``webhook`` verifier: a dataset episode scored by a registered endpoint over real
HTTP on loopback (sdk.envserver.ScorerServer, or a server that misbehaves on cue)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rl_core.envs import Action, build_environment
from rl_core.envs.scored import Scored
from rl_core.envs.webhook import WebhookTarget
from rl_core.errors import EnvironmentFailure, UnknownEnvironment
from rl_core.protocol import webhook as wire
from rl_core.protocol.addresses import Allowlist
from rl_core.protocol.signing import HEADER, verify
from rl_core.spec import EnvironmentSpec
from sdk.envserver import ScorerServer
from tests.sdk.serving import SECRET, serving

LOOPBACK = Allowlist.parse("loopback", embedded=False)
FAST = {"backoff_s": 0.01, "backoff_max_s": 0.05, "retries": 1, "timeout_s": 0.3}


def _dataset(tmp_path: Path) -> str:
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "Name a prime above 10.", "answer": 11, "data_source": "primes"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _env(url: str, tmp_path: Path, *, allowlist: Allowlist = LOOPBACK, **spec: Any) -> Scored:
    target = WebhookTarget(
        id="env_judge", url=url, secret=SECRET, timeout_s=5.0, allowlist=allowlist
    )
    env_spec = EnvironmentSpec.model_validate(
        {
            "name": "dataset",
            "config": {"path": _dataset(tmp_path), "shuffle": False},
            "reward": "webhook+length_penalty:0.01",
            "scorer": "env_judge",
            "webhook": FAST,
            **spec,
        }
    )
    env = build_environment(env_spec, webhooks={"env_judge": target})
    assert isinstance(env, Scored)
    return env


def test_the_endpoint_scores_the_episode_from_its_prompt_completion_and_answer(
    tmp_path: Path,
) -> None:
    seen: list[wire.ScoreRequest] = []

    def score(request: wire.ScoreRequest) -> float:
        seen.append(request)
        return 0.75 if str(request.answer) in request.completion else 0.0

    async def main(url: str) -> tuple[Any, dict[str, float]]:
        env = _env(url, tmp_path)
        config = {"path": _dataset(tmp_path), "shuffle": False}
        await env.reset("run_x~a1-g0-e0", 0, config)
        step = await env.step("run_x~a1-g0-e0", 1, Action(content="It is 11."))
        await env.close("run_x~a1-g0-e0")
        metrics = env.step_metrics()
        await env.aclose()
        return step, metrics

    with serving(ScorerServer(score, secret=SECRET).app) as url:
        step, metrics = asyncio.run(main(url))
    # The term's value is the endpoint's score, weighted and summed with the other terms.
    assert step.done and step.info["reward_terms"]["webhook"] == 0.75
    assert step.reward == pytest.approx(0.75 - 0.01 * len("It is 11."))
    (request,) = seen
    assert request.episode_id == "run_x~a1-g0-e0"
    assert request.prompt[-1].role == "user"
    assert request.prompt[-1].content == "Name a prime above 10."
    assert (request.completion, request.contents, request.answer) == (
        "It is 11.",
        ["It is 11."],
        11,
    )
    assert request.info["data_source"] == "primes" and request.info["row"] == 1
    assert metrics["env/scorer/faults/status_error"] == 0.0


def _misbehaving(answer: Any, *, status: int = 200, delay_s: float = 0.0) -> Starlette:
    """A scorer that checks the signature, then answers ``answer`` with ``status``."""

    async def handler(request: Request) -> Response:
        raw = await request.body()
        verify(SECRET, raw, request.headers.get(HEADER))  # a bad one would be a 500 here
        await asyncio.sleep(delay_s)
        if isinstance(answer, bytes):
            return Response(answer, status_code=status, media_type="application/json")
        return JSONResponse(answer, status_code=status)

    return Starlette(routes=[Route("/score", handler, methods=["POST"])])


@pytest.mark.parametrize(
    ("app", "reason", "fault"),
    [
        (_misbehaving({"score": "high"}), "bad_answer", None),
        (_misbehaving(b"not json"), "bad_answer", None),
        (_misbehaving({"nope": 1}), "bad_answer", None),
        (_misbehaving({"error": {"message": "no"}}, status=400), "rejected", "status_refused"),
        (_misbehaving({"error": {"message": "down"}}, status=500), "unavailable", "status_error"),
        (_misbehaving({"score": 1.0}, delay_s=0.6), "unavailable", "timeout"),
    ],
    ids=["string-score", "not-json", "no-score", "4xx", "5xx", "timeout"],
)
def test_a_failing_endpoint_fails_the_episode_counted_by_reason(
    tmp_path: Path, app: Starlette, reason: str, fault: str | None
) -> None:
    async def main(url: str) -> tuple[str, dict[str, float]]:
        env = _env(url, tmp_path)
        config = {"path": _dataset(tmp_path), "shuffle": False}
        await env.reset("e", 0, config)
        with pytest.raises(EnvironmentFailure) as failed:
            await env.step("e", 1, Action(content="11"))
        metrics = env.step_metrics()
        await env.aclose()
        return str(failed.value), metrics

    with serving(app) as url:
        message, metrics = asyncio.run(main(url))
    assert f"reward 'webhook' {reason}" in message
    assert metrics[f"env/verifier_failed/webhook/{reason}"] == 1.0
    if fault is not None:  # the request's own failures, as an environment's are counted
        assert metrics[f"env/scorer/faults/{fault}"] >= 1.0


def test_a_scorer_on_a_private_address_is_refused_where_only_public_ones_are_allowed(
    tmp_path: Path,
) -> None:
    """A deployed worker (RLAAS_ENV_URL_ALLOWLIST=public) connects to no loopback or
    private address, for a scorer as for an environment: nothing is sent."""
    hits: list[bytes] = []

    def score(request: wire.ScoreRequest) -> float:
        hits.append(request.completion.encode())
        return 1.0

    async def main(url: str) -> tuple[str, dict[str, float]]:
        env = _env(url, tmp_path, allowlist=Allowlist.parse("public", embedded=False))
        await env.reset("e", 0, {"path": _dataset(tmp_path), "shuffle": False})
        with pytest.raises(EnvironmentFailure) as failed:
            await env.step("e", 1, Action(content="11"))
        metrics = env.step_metrics()
        await env.aclose()
        return str(failed.value), metrics

    with serving(ScorerServer(score, secret=SECRET).app) as url:
        message, metrics = asyncio.run(main(url))
    assert "address_refused" in message and not hits
    assert metrics["env/verifier_failed/webhook/address_refused"] == 1.0


def test_the_spec_names_the_scorer_with_the_webhook_reward_and_only_then() -> None:
    with pytest.raises(ValidationError, match=r"environment\.scorer"):
        EnvironmentSpec(name="dataset", reward="webhook")
    with pytest.raises(ValidationError, match="read only by the 'webhook' reward"):
        EnvironmentSpec(name="dataset", reward="exact", scorer="env_abc")
    with pytest.raises(ValidationError, match="scorer"):
        EnvironmentSpec(name="dataset", reward="webhook", scorer="http://10.0.0.1/score")
    # A run given no URL for its scorer is refused as it is built, naming the field.
    spec = EnvironmentSpec(name="calculator", reward="webhook", scorer="env_abc")
    with pytest.raises(UnknownEnvironment, match=r"environment\.scorer"):
        build_environment(spec, webhooks={})
