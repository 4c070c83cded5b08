"""The ``dataset`` environment on a procedural source, ``reasoning_gym:<task>``: the real
reasoning-gym package (pinned in the worker extra), no file, no download."""

from __future__ import annotations

from typing import Any

import pytest
import reasoning_gym
from pydantic import ValidationError

from rl_core.envs import build_environment
from rl_core.envs.base import Action
from rl_core.envs.dataset import DatasetEnv
from rl_core.envs.episodes import eval_episode_id, train_episode_id
from rl_core.errors import EnvironmentFailure
from rl_core.protocol.datasets import DatasetConfig
from rl_core.spec import EnvironmentSpec

pytestmark = pytest.mark.anyio

TASK_CONFIG = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config(**overrides: Any) -> dict[str, Any]:
    return {
        "dataset": "reasoning_gym:basic_arithmetic",
        "dataset_config": TASK_CONFIG,
        "seed": 11,
        "split": {"size": 20},
        **overrides,
    }


async def play(env: DatasetEnv, episode: str, cfg: dict[str, Any]) -> tuple[str, int]:
    reset = await env.reset(episode, 0, cfg)
    await env.close(episode)
    return reset.messages[-1]["content"], int(reset.info["row"])


async def test_same_seed_same_tasks_and_held_out_rows_are_a_fixed_range() -> None:
    first, again = DatasetEnv(), DatasetEnv()  # as two workers, or a run and its resume
    tasks = [await play(first, train_episode_id("r-", t, 0), config()) for t in range(12)]
    assert tasks == [await play(again, train_episode_id("r-", t, 0), config()) for t in range(12)]
    # Unbounded: training task t plays row 20 + t (rows 0..19 are held out), a fresh one.
    assert [row for _, row in tasks] == [21 + t for t in range(12)]
    # The rows are reasoning-gym's own items of (config, seed).
    items = reasoning_gym.create_dataset("basic_arithmetic", **TASK_CONFIG, seed=11, size=40)
    assert [question for question, _ in tasks] == [items[20 + t]["question"] for t in range(12)]
    held = [await play(first, eval_episode_id("r-", 0, i), config()) for i in range(25)]
    assert [row for _, row in held] == [1 + i % 20 for i in range(25)]
    other_seed = await play(DatasetEnv(), train_episode_id("r-", 0, 0), config(seed=12))
    assert other_seed[0] != tasks[0][0]


async def test_a_sized_source_cycles_epochs_in_a_seeded_order() -> None:
    env = DatasetEnv()
    cfg = config(size=30, split={"eval": 0.2}, epochs=2)  # 6 held out, 24 to train on
    rows = [(await play(env, train_episode_id("r-", t, 0), cfg))[1] for t in range(48)]
    assert sorted(rows[:24]) == sorted(rows[24:]) == list(range(7, 31))
    assert rows[:24] != rows[24:]  # each epoch its own order
    with pytest.raises(EnvironmentFailure, match="all 2 epochs of 24 rows"):
        await env.reset(train_episode_id("r-", 48, 0), 0, cfg)


async def test_the_tasks_own_scorer_is_the_reward_unless_a_verifier_is_named() -> None:
    env = DatasetEnv()
    cfg = config(system="Answer in <answer></answer> tags.")
    episode = train_episode_id("r-", 3, 0)
    reset = await env.reset(episode, 0, cfg)
    assert reset.messages[0] == {"role": "system", "content": "Answer in <answer></answer> tags."}
    answer = reset.info["answer"]
    right = await env.step(episode, 0, Action(content=f"So <answer>{answer}</answer>"))
    assert right.done and right.reward == 1.0
    for wrong_text in (f"<answer>{int(answer) + 1}</answer>", "no idea"):
        wrong_id = train_episode_id("r-", 3, 1)
        await env.reset(wrong_id, 0, cfg)
        wrong = await env.step(wrong_id, 0, Action(content=wrong_text))
        assert wrong.done and wrong.reward < 1.0
        await env.close(wrong_id)
    # A verifier named in the spec replaces the task's scorer.
    spec = EnvironmentSpec(name="dataset", reward="exact", config=cfg)
    scored = build_environment(spec)
    await scored.reset(episode, 0, spec.config)
    step = await scored.step(episode, 0, Action(content=f"<answer>{answer}</answer>"))
    assert step.info["reward_terms"] == {"exact": 0.0}  # exact reads no tags: the whole text


async def test_a_template_reads_the_question_and_a_bad_task_config_fails_the_build() -> None:
    env = DatasetEnv()
    reset = await env.reset("own-id", 5, config(prompt="Compute: {question}"))
    assert reset.messages[-1]["content"].startswith("Compute: ")
    spec = EnvironmentSpec(name="dataset", config=config(dataset_config={"max_terms": 2, "x": 1}))
    with pytest.raises(EnvironmentFailure, match=r"keys \['x'\]"):
        build_environment(spec)


def test_the_config_refuses_what_a_procedural_source_cannot_use() -> None:
    def refused(**overrides: Any) -> tuple[str, str]:
        with pytest.raises(ValidationError) as caught:
            DatasetConfig.model_validate(config(**overrides))
        error = caught.value.errors()[0]
        return str(error["loc"][0]), str(error["msg"])

    where, message = refused(dataset="reasoning_gym:basic_arithmetc")
    assert where == "dataset" and "did you mean basic_arithmetic or" in message
    assert "chain_sum" in message  # the list of tasks
    assert refused(split={"field": "split"})[0] == "split"
    assert refused(split={"eval": 0.1})[0] == "split"  # a share of an unbounded source
    assert refused(size=20, split={"size": 20})[0] == "split"  # nothing left to train on
    assert refused(path="/tmp/rows.jsonl")[0] == "path"
    assert refused(dataset_config={"seed": 3})[0] == "dataset_config"
    with pytest.raises(ValidationError, match="procedural source"):
        DatasetConfig.model_validate({"dataset": "ds_" + "0" * 32, "size": 10})
