"""Per-step metrics by data source: names made safe and bounded, means per source."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_core.agent.ledger import Trajectory
from rl_core.envs.base import Action, Reset, Step
from rl_core.envs.dataset import DatasetEnv
from rl_core.pipeline.metrics import OTHER_SOURCE, SourceNames, source_metrics, source_name

from .conftest import ScriptEnv, run_pipeline


def test_a_source_becomes_one_segment_of_a_metric_name() -> None:
    assert source_name("openai/gsm8k") == "openai_gsm8k"
    assert source_name("math-500 (level 5)") == "math-500_level_5"
    assert source_name("plain.v2") == "plain.v2"
    assert source_name("///") == "_"
    assert source_name("x" * 1000) == "x" * 64


def test_sources_past_the_limit_share_one_name() -> None:
    names = SourceNames(limit=2)
    assert [names(s) for s in ("a", "b", "c", "a", "b/", "d")] == [
        "a",
        "b",
        OTHER_SOURCE,
        "a",
        "b",  # reads as "b": the same metric
        OTHER_SOURCE,
    ]


def test_source_metrics_average_each_source_and_skip_episodes_without_one() -> None:
    def traj(reward: float, source: Any) -> Trajectory:
        t = Trajectory(episode_id="e", reward=reward)
        if source is not None:
            t.info["data_source"] = source
        return t

    trajs = [traj(1.0, "a"), traj(0.0, "a"), traj(0.5, "b/c"), traj(9.0, None), traj(7.0, 3)]
    assert source_metrics(trajs, SourceNames()) == {
        "reward/mean/a": 0.5,
        "episode/trained/a": 2.0,
        "reward/mean/b_c": 0.5,
        "episode/trained/b_c": 1.0,
    }
    assert source_metrics([traj(1.0, None)], SourceNames()) == {}


class DatasetRows(ScriptEnv):
    """The real `dataset` environment with its config, under the pipeline's collector."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.inner = DatasetEnv()
        self.config = dict(config)

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        return await self.inner.reset(episode_id, seed, self.config)

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        return await self.inner.step(episode_id, step, action)

    async def close(self, episode_id: str) -> None:
        await self.inner.close(episode_id)


def test_a_dataset_of_two_sources_reports_each_sources_mean(tmp_path: Path) -> None:
    # The scripted model always answers "1": rows whose answer is "1" score 1, others 0.
    rows = [
        {"q": f"q{i}", "a": "1" if i % 4 in (0, 1, 2) else "2", "data_source": "gsm/easy"}
        if i % 2 == 0
        else {"q": f"q{i}", "a": "1" if i % 3 == 0 else "2", "data_source": "hard"}
        for i in range(60)
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = DatasetRows({"path": str(path), "prompt": "q", "answer": "a", "seed": 1})
    run = run_pipeline(mode="sync", steps=3, batch_groups=4, group_size=2, env=env)

    earned: set[float] = set()
    for (step, metrics), (_, batch) in zip(run.sink.steps, run.trained(), strict=True):
        # What each source earned, from the file: the rows the step's episodes played.
        expected: dict[str, list[float]] = {}
        for t in (t for g in batch for t in g.to_train):
            row = rows[int(t.info["row"]) - 1]
            name = source_name(row["data_source"])
            expected.setdefault(name, []).append(float(row["a"] == "1"))
            assert t.reward == float(row["a"] == "1")  # the scripted answer, scored
            earned.add(t.reward)
        assert set(expected) <= {"gsm_easy", "hard"}
        for name, rewards in expected.items():
            assert metrics[f"reward/mean/{name}"] == sum(rewards) / len(rewards), step
            assert metrics[f"episode/trained/{name}"] == len(rewards)
        reported = {k.split("/")[-1] for k in metrics if k.startswith("reward/mean/")}
        assert reported == set(expected)
    assert earned == {0.0, 1.0}
    # Both sources turn up over the run, each with its own mean.
    seen = {k for _, m in run.sink.steps for k in m if k.startswith("reward/mean/")}
    assert seen == {"reward/mean/gsm_easy", "reward/mean/hard"}
