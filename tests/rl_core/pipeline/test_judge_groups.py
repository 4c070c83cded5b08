"""The ``judge`` verifier inside a run: the real collector, pipeline, agent and ``dataset``
environment, with a fake OpenAI-compatible judge on loopback. Each GRPO group is scored
in one call after its members end and before the trainer sees it; each held-out task's
samples are one call too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rl_core.envs import build_environment
from rl_core.envs.scored import Scored
from rl_core.envs.webhook import WebhookTarget
from rl_core.errors import EnvironmentFailure
from rl_core.pipeline.evaluate import Evaluator
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import EnvironmentSpec
from tests.rl_core.envs.judge_server import USAGE_TOKENS, FakeJudge
from tests.sdk.serving import serving

from .conftest import MemoryCheckpointer, run_pipeline

GROUP = 3


def _env(url: str, config: dict[str, Any], max_calls: int = 1000) -> Scored:
    target = WebhookTarget(
        id="env_judge",
        url=f"{url}/v1",
        secret="sk-0123456789abcdef",
        allowlist=Allowlist.parse("loopback", embedded=False),
    )
    spec = EnvironmentSpec.model_validate(
        {
            "name": "dataset",
            "config": config,
            "reward": "judge",
            "judge": {
                "endpoint": "env_judge",
                "model": "m",
                "rubric": "right and brief",
                "max_calls": max_calls,
                "max_tokens": 10**6,
            },
        }
    )
    env = build_environment(spec, webhooks={"env_judge": target})
    assert isinstance(env, Scored)
    return env


def _config(tmp_path: Path) -> dict[str, Any]:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"prompt": f"Q{i}?", "answer": str(i)}) + "\n" for i in range(4))
    )
    return {"path": str(rows), "split": {"size": 1}}


def test_each_group_is_judged_in_one_call_before_the_trainer_sees_it(tmp_path: Path) -> None:
    config = _config(tmp_path)
    server = FakeJudge()
    with serving(server.app) as url:
        env = _env(url, config)
        run = run_pipeline(
            env=env,
            env_config=config,
            steps=2,
            batch_groups=2,
            group_size=GROUP,
            mode="async",
            eval_interval=2,
            evaluator=lambda agent: Evaluator(
                agent=agent,
                env=env,
                env_config=config,
                episodes=2,
                concurrency=8,
                seed=0,
                episode_timeout_s=5.0,
                samples=GROUP,
                pass_threshold=0.3,
            ),
        )
    trained = [g for _, batch in run.trained() for g in batch]
    assert len(trained) == 4
    # Member k of every trained group has the judge's score for answer a<k+1>, (k+1)/10:
    # the group was scored whole (no first part sent ahead) before it was queued.
    for group in trained:
        assert group.part == "whole" and len(group.trajectories) == GROUP
        by_member = {t.member: t.reward for t in group.trajectories}
        assert by_member == pytest.approx({k: (k + 1) / 10 for k in range(GROUP)})
    # One call per group or held-out task, each with the group's answers and no others.
    answers = [r["messages"][1]["content"].count("# Answer a") for r in server.requests]
    assert answers and set(answers) == {GROUP}
    evaluations = [m for _, m in run.sink.steps if "eval/pass@1" in m]
    assert evaluations
    for metrics in evaluations:  # a task's samples scored 0.1, 0.2, 0.3; 0.3 passes
        assert metrics["eval/pass@1"] == pytest.approx(1 / 3)
        assert metrics["eval/reward_mean"] == pytest.approx(0.2)
    assert len(server.requests) >= len(trained) + 2 * len(evaluations)
    assert not any(k.startswith("env/verifier_failed") for _, m in run.sink.steps for k in m)


def test_an_answer_the_judge_left_unscored_is_a_counted_failure_not_a_zero(
    tmp_path: Path,
) -> None:
    """The judge omits each group's last answer: that member leaves its group and every
    step counts it by reason, in the step's end states and failures as the judge left it."""
    config = _config(tmp_path)
    with serving(FakeJudge(mode="missing_one").app) as url:
        run = run_pipeline(env=_env(url, config), env_config=config, steps=2, group_size=GROUP)
    for _, batch in run.trained():
        for group in batch:
            assert [t.member for t in group.to_train] == [0, 1]
            assert [t.end_reason for t in group.trajectories][-1] == "judge_malformed"

    def total(name: str) -> float:
        return sum(m.get(name, 0.0) for _, m in run.sink.steps)

    failed = total("failures/judge_malformed")
    assert failed >= 4 and failed == total("episode/env_error") == total("failures/total")
    assert total("env/verifier_failed/judge/malformed") == failed


def test_a_run_that_spends_its_judge_budget_stops_saying_so(tmp_path: Path) -> None:
    """Past the budget every group fails (judge_budget, no call made) and the run stops
    with that reason, as a run whose episodes all fail does: never trained on zeros."""
    config = _config(tmp_path)
    server = FakeJudge()
    with (
        serving(server.app) as url,
        pytest.raises(EnvironmentFailure, match=r"judge_budget.*budget of 2 calls is spent"),
    ):
        run_pipeline(env=_env(url, config, max_calls=2), env_config=config, steps=4)
    assert len(server.requests) == 2


def test_a_resumed_run_goes_on_counting_against_the_same_budget(tmp_path: Path) -> None:
    """The judge's spending is in the collector's checkpointed position; an attempt resumed
    from it starts where the budget was, not afresh."""
    config = _config(tmp_path)
    saver = MemoryCheckpointer()
    server = FakeJudge()
    with serving(server.app) as url:
        run_pipeline(
            env=_env(url, config, max_calls=50),
            env_config=config,
            steps=2,
            checkpointer=saver,
            checkpoint_interval=1,
        )
        saved = saver.saved[2]["collector"]
        assert 4 <= saved["judge"]["calls"] <= len(server.requests) <= 50
        # Calls count as they start, tokens as they end: some may be in flight.
        assert 0 < saved["judge"]["tokens"] <= USAGE_TOKENS * saved["judge"]["calls"]
        spent = {**saved, "judge": {"calls": 50, "tokens": 1000}}
        calls = len(server.requests)
        with pytest.raises(EnvironmentFailure, match="budget of 50 calls is spent"):
            run_pipeline(
                env=_env(url, config, max_calls=50),
                env_config=config,
                steps=4,
                position=spent,
                start_step=2,
            )
        assert len(server.requests) == calls  # the resumed attempt made none


def test_a_spec_field_typo_is_not_a_silent_judge() -> None:
    with pytest.raises(ValueError, match="max_call"):
        EnvironmentSpec.model_validate(
            {
                "name": "dataset",
                "reward": "judge",
                "judge": {
                    "endpoint": "env_judge",
                    "model": "m",
                    "rubric": "r",
                    "max_calls": 1,
                    "max_tokens": 1,
                    "max_call": 5,
                },
            }
        )
