"""``reasoning_gym``: a reasoning-gym dataset as an environment, scored by its own
``score_answer``; configs refused with the field named; a tiny run trains on one.

The real package (reasoning-gym 0.1.x, pinned in the worker extra), never a stand-in.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import reasoning_gym

from rl_core.envs import Action, build_environment, get_environment
from rl_core.envs.reasoning_gym import ReasoningGym
from rl_core.errors import EnvironmentFailure
from rl_core.protocol.ecosystem import REASONING_GYM_DATASETS, ConfigProblem, parse_config
from rl_core.spec import EnvironmentSpec
from tests.rl_core.pipeline.conftest import run_pipeline

# Two one-digit terms: short questions, for the tiny model's short context.
ARITHMETIC = {
    "dataset": "basic_arithmetic",
    "dataset_config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "size": 50,
    "seed": 3,
}


def test_the_dataset_names_are_reasoning_gyms_own() -> None:
    # The control plane checks names against this list without importing the package;
    # a new reasoning-gym release with other datasets fails here until the list follows.
    assert set(REASONING_GYM_DATASETS) == set(reasoning_gym.factory.DATASETS)


def test_a_right_answer_scores_1_and_a_wrong_one_less() -> None:
    async def main() -> None:
        env = get_environment("reasoning_gym")
        assert isinstance(env, ReasoningGym)
        reset = await env.reset("a", 7, ARITHMETIC)
        expected = reasoning_gym.create_dataset(
            "basic_arithmetic", **ARITHMETIC["dataset_config"], seed=3, size=50
        )[7]
        assert reset.messages == [{"role": "user", "content": expected["question"]}]
        assert reset.info == {"dataset": "basic_arithmetic", "index": 7}
        right = await env.step("a", 1, Action(content=f"<answer>{expected['answer']}</answer>"))
        assert right.reward == 1.0 and right.done
        assert right.info["answer"] == expected["answer"] == right.info["expected"]

        await env.reset("b", 7, ARITHMETIC)
        wrong = await env.step("b", 1, Action(content=str(int(expected["answer"]) + 1)))
        assert wrong.reward < 1.0 and wrong.done
        # The whole text is the answer when it has no tags.
        await env.reset("c", 7, ARITHMETIC)
        bare = await env.step("c", 1, Action(content=f"  {expected['answer']}\n"))
        assert bare.reward == 1.0
        for episode in "abc":
            await env.close(episode)

    asyncio.run(main())


def test_the_reset_seed_picks_the_task_and_attempts_make_it_multi_turn() -> None:
    async def main() -> None:
        env = ReasoningGym()
        config = {**ARITHMETIC, "attempts": 2}
        first = await env.reset("x", 57, config)  # 57 % 50 == 7
        again = await env.reset("y", 7, config)
        assert first.messages == again.messages and first.info["index"] == 7
        retry = await env.step("x", 1, Action(content="no idea"))
        assert not retry.done and retry.reward == 0.0
        assert "not right" in retry.messages[0]["content"]
        assert await env.step("x", 1, Action(content="other")) == retry  # a retried step
        last = await env.step("x", 2, Action(content="still no idea"))
        assert last.done and last.reward == last.info["score"] < 1.0
        with pytest.raises(EnvironmentFailure, match="already over"):
            await env.step("x", 3, Action(content="1"))

    asyncio.run(main())


def test_the_system_prompt_is_reasoning_gyms_by_name() -> None:
    async def main() -> None:
        reset = await ReasoningGym().reset("s", 0, {**ARITHMETIC, "system_prompt": "default"})
        assert reset.messages[0] == {
            "role": "system",
            "content": reasoning_gym.utils.SYSTEM_PROMPTS["default"],
        }

    asyncio.run(main())


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({"dataset": "chess"}, "dataset", "known datasets are: ab, acre"),
        ({}, "dataset", "Field required"),
        ({"dataset": "gcd", "size": 0}, "size", "greater than or equal to 1"),
        ({"dataset": "gcd", "dataset_config": {"seed": 1}}, "dataset_config", "config.seed"),
        ({"dataset": "gcd", "level": 3}, "level", "Extra inputs"),
    ],
)
def test_bad_configs_name_the_field(config: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(ConfigProblem, match=says) as caught:
        parse_config("reasoning_gym", config)
    assert caught.value.field == field


def test_a_bad_dataset_config_fails_as_the_environment_is_built() -> None:
    bad_key = {"dataset": "basic_arithmetic", "dataset_config": {"terms": 2}}
    with pytest.raises(EnvironmentFailure, match=r"\['terms'\].*its keys are \[.*'max_terms'"):
        build_environment(EnvironmentSpec(name="reasoning_gym", config=bad_key))
    bad_value = {"dataset": "basic_arithmetic", "dataset_config": {"min_terms": 0}}
    with pytest.raises(EnvironmentFailure, match=r"refused environment\.config\.dataset_config"):
        build_environment(EnvironmentSpec(name="reasoning_gym", config=bad_value))


class Configured:
    """The environment with the run's ``environment.config`` (the harness's collector
    passes none, as a spec with no config would)."""

    def __init__(self, env: Any, config: dict[str, Any]) -> None:
        self.env, self.config = env, config

    async def reset(self, episode_id: str, seed: int, config: Any) -> Any:
        return await self.env.reset(episode_id, seed, self.config)

    async def step(self, episode_id: str, step: int, action: Action) -> Any:
        return await self.env.step(episode_id, step, action)

    async def close(self, episode_id: str) -> None:
        await self.env.close(episode_id)

    async def aclose(self) -> None:
        aclose = getattr(self.env, "aclose", None)
        if aclose is not None:
            await aclose()


def test_a_tiny_run_trains_on_reasoning_gyms_rewards() -> None:
    # The real collector, agent, queue and pipeline; the engine answers "1" every turn.
    env = build_environment(EnvironmentSpec(name="reasoning_gym", config=ARITHMETIC))
    run = run_pipeline(steps=2, batch_groups=2, group_size=3, env=Configured(env, ARITHMETIC))
    assert run.result.steps_completed == 2 and len(run.trainer.batches) == 2
    dataset = reasoning_gym.create_dataset(
        "basic_arithmetic", **ARITHMETIC["dataset_config"], seed=3, size=50
    )
    trained = [t for batch in run.trainer.batches for g in batch for t in g.trajectories]
    assert len(trained) == 2 * 2 * 3
    for traj in trained:
        assert traj.end_state == "done" and traj.info["answer"] == "1"
        # The reward is reasoning-gym's own score of the answer, for the seed's task.
        assert traj.reward == dataset.score_answer("1", dataset[traj.info["index"]])
    # A group's members play one task: the group's environment seed picks it.
    for group in (g for batch in run.trainer.batches for g in batch):
        assert len({t.info["index"] for t in group.trajectories}) == 1
