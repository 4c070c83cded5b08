"""The ``judge`` verifier: a dataset group scored by an OpenAI-compatible judge over real
HTTP on loopback (a fake judge server: the external I/O boundary), in one call per group,
its failures counted by reason and never scored 0."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rl_core.agent.ledger import Trajectory
from rl_core.envs import Action, build_environment
from rl_core.envs.episodes import train_episode_id
from rl_core.envs.judge import scores_of
from rl_core.envs.scored import Scored
from rl_core.envs.webhook import WebhookTarget
from rl_core.pipeline.judging import judge_trajectories
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import EnvironmentSpec
from tests.rl_core.envs.judge_server import USAGE_TOKENS, FakeJudge
from tests.sdk.serving import serving

KEY = "sk-judge-key-0123456789"
LOOPBACK = Allowlist.parse("loopback", embedded=False)
RUBRIC = "The answer names a prime number above 10 and says why it is prime."


def _judge(**overrides: Any) -> dict[str, Any]:
    return {
        "endpoint": "env_judge",
        "model": "judge-model",
        "rubric": RUBRIC,
        "max_calls": 100,
        "max_tokens": 100_000,
        "timeout_s": 2.0,
        "retries": 0,
        **overrides,
    }


def _config(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "Name a prime above 10.", "answer": 11}) + "\n")
    return {"path": str(path), "shuffle": False}


def _env(
    url: str,
    tmp_path: Path,
    *,
    allowlist: Allowlist = LOOPBACK,
    reward: str = "judge+length_penalty:0.01",
    **judge: Any,
) -> Scored:
    target = WebhookTarget(id="env_judge", url=f"{url}/v1", secret=KEY, allowlist=allowlist)
    spec = EnvironmentSpec.model_validate(
        {"name": "dataset", "config": _config(tmp_path), "reward": reward, "judge": _judge(**judge)}
    )
    env = build_environment(spec, webhooks={"env_judge": target})
    assert isinstance(env, Scored)
    return env


async def _play_group(env: Scored, config: dict[str, Any], task: int, n: int) -> list[Trajectory]:
    """A group's episodes played to their end through the environment, as the agent does."""
    out = []
    for member in range(n):
        episode_id = train_episode_id("run_x~a1-", task, member)
        await env.reset(episode_id, 0, config)
        step = await env.step(episode_id, 1, Action(content=f"{11 + 2 * member} is prime."))
        await env.close(episode_id)
        traj = Trajectory(episode_id=episode_id, group=task, member=member)
        traj.reward, traj.turn_rewards = step.reward, [step.reward]
        traj.info.update(step.info)
        traj.end("done", "env_done")
        out.append(traj)
    return out


def _judged(
    server: FakeJudge, tmp_path: Path, groups: int = 1, n: int = 3, **kw: Any
) -> tuple[list[list[Trajectory]], dict[str, float], list[str | None]]:
    async def main(url: str) -> tuple[list[list[Trajectory]], dict[str, float], list[str | None]]:
        env = _env(url, tmp_path, **kw)
        played, errors = [], []
        for task in range(groups):
            group = await _play_group(env, _config(tmp_path), task, n)
            errors.append(await judge_trajectories(env, group))
            played.append(group)
        metrics = env.step_metrics()
        await env.aclose()
        return played, metrics, errors

    with serving(server.app) as url:
        return asyncio.run(main(url))


def test_a_group_is_scored_in_one_call_with_each_answers_own_score(tmp_path: Path) -> None:
    server = FakeJudge()
    (group,), metrics, _ = _judged(server, tmp_path, n=4)
    # One call for the four answers, with the key as a bearer token, the model, the
    # rubric, the task, the reference and every answer; the scores' JSON schema asked for.
    assert len(server.requests) == 1
    request, headers = server.requests[0], server.headers[0]
    assert headers["authorization"] == f"Bearer {KEY}"
    assert request["model"] == "judge-model"
    assert RUBRIC in request["messages"][0]["content"]
    user = request["messages"][1]["content"]
    assert "Name a prime above 10." in user and "Reference answer" in user
    assert all(f"# Answer a{i + 1}\n{11 + 2 * i} is prime." in user for i in range(4))
    assert request["response_format"]["type"] == "json_schema"
    # Answer a<i> was scored i/10 by the judge: each episode gets its own score, added
    # (weight 1) to the composed terms' sum on the last turn, and shown as a term.
    for i, traj in enumerate(group):
        judged = (i + 1) / 10
        length = -0.01 * len(f"{11 + 2 * i} is prime.")
        assert traj.kept and traj.reward == pytest.approx(judged + length)
        assert traj.turn_rewards == [pytest.approx(judged + length)]
        assert traj.info["reward_terms"]["judge"] == pytest.approx(judged)
        assert traj.info["reward_terms"]["length_penalty"] == pytest.approx(length)
    assert metrics["env/judge/calls"] == 1.0 and metrics["env/judge/answers"] == 4.0
    assert metrics["env/judge/tokens"] == USAGE_TOKENS
    assert not any(k.startswith("env/verifier_failed") for k in metrics)


def test_a_run_past_its_budget_fails_the_episodes_as_judge_budget(tmp_path: Path) -> None:
    """Two calls' worth of budget, three groups: the third is failed by reason, with no
    call made; so is a group after the token budget is spent."""
    server = FakeJudge()
    played, metrics, errors = _judged(server, tmp_path, groups=3, n=2, max_calls=2)
    assert len(server.requests) == 2
    assert all(t.kept for group in played[:2] for t in group)
    for traj in played[2]:
        assert (traj.end_state, traj.end_reason) == ("env_error", "judge_budget")
        assert "budget of 2 calls is spent" in (traj.error or "")
        assert "judge" not in traj.info["reward_terms"]  # not judged, not scored 0
    assert errors[:2] == [None, None] and "judge_budget" in (errors[2] or "")
    assert metrics["env/verifier_failed/judge/budget"] == 2.0

    server = FakeJudge()
    played, metrics, _ = _judged(server, tmp_path, groups=2, n=2, max_tokens=USAGE_TOKENS)
    assert len(server.requests) == 1  # the first call used all 100 tokens
    assert [t.end_reason for t in played[1]] == ["judge_budget"] * 2
    assert "100 tokens is spent" in (played[1][0].error or "")


def test_a_reply_without_scores_fails_its_answers_as_judge_malformed(tmp_path: Path) -> None:
    (group,), metrics, errors = _judged(FakeJudge(mode="prose"), tmp_path)
    assert [t.end_reason for t in group] == ["judge_malformed"] * 3
    assert not any(t.kept for t in group)
    assert "no JSON object of scores" in (group[0].error or "")
    assert metrics["env/verifier_failed/judge/malformed"] == 3.0
    assert "judge_malformed" in (errors[0] or "")
    # A reply that misses one answer fails that answer only; the others keep their scores.
    (group,), metrics, _ = _judged(FakeJudge(mode="missing_one"), tmp_path)
    assert [t.kept for t in group] == [True, True, False]
    assert group[2].end_reason == "judge_malformed" and "a3" in (group[2].error or "")
    assert group[1].info["reward_terms"]["judge"] == pytest.approx(0.2)
    assert metrics["env/verifier_failed/judge/malformed"] == 1.0


def test_a_judge_past_its_timeout_fails_the_group_as_judge_timeout(tmp_path: Path) -> None:
    server = FakeJudge(mode="slow", delay_s=1.0)
    (group,), metrics, _ = _judged(server, tmp_path, timeout_s=0.2)
    assert [t.end_reason for t in group] == ["judge_timeout"] * 3
    assert "no answer in 0.2 s" in (group[0].error or "")
    assert metrics["env/verifier_failed/judge/timeout"] == 3.0


def test_a_server_without_structured_output_is_asked_again_without_it(tmp_path: Path) -> None:
    """A 400 to ``response_format`` (servers without json_schema): asked again without it,
    and the scores read from the JSON in prose and a code fence; the next group is asked
    without it at once. Each request counts in the budget."""
    server = FakeJudge(mode="no_schema")
    played, metrics, _ = _judged(server, tmp_path, groups=2)
    assert ["response_format" in r for r in server.requests] == [True, False, False]
    assert [t.info["reward_terms"]["judge"] for t in played[1]] == pytest.approx([0.1, 0.2, 0.3])
    assert metrics["env/judge/calls"] == 3.0


def test_a_judge_on_a_loopback_address_is_refused_where_webhooks_are(tmp_path: Path) -> None:
    """A deployed worker (RLAAS_ENV_URL_ALLOWLIST=public) connects to no loopback or
    private address, for a judge as for a webhook environment: nothing is sent."""
    server = FakeJudge()
    public = Allowlist.parse("public", embedded=False)
    (group,), metrics, _ = _judged(server, tmp_path, allowlist=public)
    assert not server.requests
    assert [t.end_reason for t in group] == ["judge_address_refused"] * 3
    assert "refused to connect" in (group[0].error or "")
    assert metrics["env/verifier_failed/judge/address_refused"] == 3.0


def test_the_scores_are_read_from_what_judges_write() -> None:
    listed = '{"scores": [{"id": "a2", "score": 0.5}, {"id": "1", "score": 1}]}'
    assert scores_of(listed, 2) == [1.0, 0.5]
    assert scores_of('Sure!\n```json\n{"scores": {"a1": 0.25, "a2": 0}}\n```', 2) == [0.25, 0.0]
    assert scores_of('{"scores": [0.1, 0.9]}', 2) == [0.1, 0.9]
    # Out of range, not a number, an unknown id: that answer has no score.
    assert scores_of('{"scores": {"a1": 1.5, "a2": "high", "a7": 1}}', 2) == [None, None]
    assert scores_of('{"note": "no scores"} and {broken', 2) is None
    assert scores_of("I cannot judge this.", 2) is None


def test_the_spec_names_the_judge_with_the_judge_reward_and_a_budget() -> None:
    with pytest.raises(ValidationError, match=r"environment\.judge"):
        EnvironmentSpec(name="dataset", reward="judge")
    with pytest.raises(ValidationError, match="read only by the 'judge' reward"):
        EnvironmentSpec.model_validate({"name": "dataset", "reward": "exact", "judge": _judge()})
    with pytest.raises(ValidationError) as bad:
        EnvironmentSpec.model_validate(
            {"name": "dataset", "reward": "judge", "judge": _judge(max_calls=0)}
        )
    assert bad.value.errors()[0]["loc"] == ("judge", "max_calls")
    with pytest.raises(ValidationError, match="clients report each episode's reward"):
        EnvironmentSpec.model_validate({"name": "sessions", "reward": "judge", "judge": _judge()})
    with pytest.raises(ValidationError, match="endpoint"):
        EnvironmentSpec.model_validate(
            {"name": "dataset", "reward": "judge", "judge": _judge(endpoint="http://10.0.0.1/v1")}
        )
