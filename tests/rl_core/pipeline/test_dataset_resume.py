"""The dataset environment under the real collector: a run stopped at a checkpoint and
resumed from it trains every row of the epoch's prefix once, none twice, none skipped;
a file's rows, and a procedural source's (reasoning-gym, generated)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rl_core.agent.agent import AgentConfig
from rl_core.envs.base import Reset
from rl_core.envs.dataset import DatasetEnv
from rl_core.envs.episodes import train_episode_id
from rl_core.host.control import RunControl

from .conftest import (
    Behaviour,
    MemoryCheckpointer,
    RecordingTrainer,
    ScriptEnv,
    parse_id,
    run_pipeline,
)

ROWS = 200
# No episode may fail here: a failed group is dropped and its row skipped by design
# (counted), which this test would read as a skip. The defaults (5 s) were once too short
# for a reasoning-gym row on CI's 2 loaded cores.
TIMEOUT_S = 120.0
AGENT = AgentConfig(max_turns=8, max_new_tokens=4, max_context=256, env_timeout_s=TIMEOUT_S)


class DatasetScript(ScriptEnv):
    """`ScriptEnv`'s scripted play, on the rows the dataset environment picks per task."""

    def __init__(self, config: dict[str, Any], plan: Any = None) -> None:
        super().__init__(plan)
        self.inner = DatasetEnv()
        # As a run's build does (rl_core.envs.build_environment): a procedural source is
        # made before the first episode, so reasoning-gym's import (seconds on a loaded
        # machine) is not inside an episode's 5 s timeout.
        self.inner.prepare(config)
        self.config = config
        self.rows: dict[int, int] = {}

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        row = int((await self.inner.reset(episode_id, seed, self.config)).info["row"])
        await self.inner.close(episode_id)
        task = parse_id(episode_id)[0]
        assert self.rows.setdefault(task, row) == row  # a group's members share its row
        return await super().reset(episode_id, seed, config)


@pytest.mark.parametrize("source", ["file", "procedural"])
def test_a_resumed_run_trains_each_row_once_and_skips_none(tmp_path: Path, source: str) -> None:
    if source == "file":
        path = tmp_path / "rows.jsonl"
        lines = (json.dumps({"q": f"q{i}", "a": str(i)}) + "\n" for i in range(ROWS))
        path.write_text("".join(lines))
        config: dict[str, Any] = {"path": str(path), "prompt": "q", "answer": "a", "seed": 3}
    else:
        config = {"dataset": "reasoning_gym:gcd", "split": {"size": 5}, "seed": 3}
    control = RunControl()

    def plan(task: int, member: int, attempt: int) -> Behaviour:
        if task >= 9:
            control.request_stop()
        return Behaviour(delay_s=0.005 * (task % 3))

    saver = MemoryCheckpointer()
    first_env = DatasetScript(config, plan)
    first = run_pipeline(
        steps=20,
        env=first_env,
        control=control,
        checkpointer=saver,
        checkpoint_interval=2,
        trainer=RecordingTrainer(delay_s=0.01),
        agent=AGENT,
        episode_timeout_s=TIMEOUT_S,
        # A group gone stale is played again, not dropped: with "drop" a slow machine
        # drops one by design (counted), and its row is then skipped on purpose.
        policy="requeue",
    )
    step = max(saver.saved)
    position = saver.saved[step]["collector"]
    second_env = DatasetScript(config)
    # Long enough to train every task the first left owed: the replayed tasks start first,
    # but new ones start beside them (64 episodes in flight) and may finish first.
    second = run_pipeline(
        steps=step + max(4, int(position["next_index"])),
        env=second_env,
        start_step=step,
        position=position,
        policy="requeue",
        agent=AGENT,
        episode_timeout_s=TIMEOUT_S,
    )

    # A group split around its stragglers trains as two parts (first, rest): one row.
    before = [
        first_env.rows[g.task.index]
        for _, batch in first.trained()
        for g in batch
        if g.part != "first"
    ]
    after = [
        second_env.rows[g.task.index]
        for _, batch in second.trained()
        for g in batch
        if g.part != "first"
    ]
    trained = before + after
    for run in (first, second):
        assert not any(run.metrics("groups/dropped_failed")), "a group failed: see TIMEOUT_S"
    assert len(trained) == len(set(trained))  # no row trained twice
    tasks = {g.task.index for run in (first, second) for _, b in run.trained() for g in b}
    assert set(range(position["next_index"])) <= tasks  # and no task, so no row, skipped
    # Whichever attempt played a task, it got the same row: the epoch's seeded order.
    played = {**first_env.rows, **second_env.rows}
    assert asyncio.run(rows_of(config, sorted(played))) == [played[t] for t in sorted(played)]


async def rows_of(config: dict[str, Any], tasks: list[int]) -> list[int]:
    """The row a fresh environment gives each task."""
    script = DatasetScript(config)
    resets = [
        await script.inner.reset(train_episode_id("x-", t, 0), 0, script.config) for t in tasks
    ]
    return [int(r.info["row"]) for r in resets]
