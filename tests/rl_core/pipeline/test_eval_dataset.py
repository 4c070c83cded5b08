"""Held-out evaluation of a ``dataset`` run: only eval rows, k samples each, pass@k right.

The real evaluator (built from a spec), agent and ``dataset`` environment over a JSONL
file, alone and inside a pipeline run; the engine answers each held-out question
correctly a set number of times out of every 4 asks, so the rewards, and with them
pass@1 and pass@k, are known in advance.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rl_core.agent.agent import Agent, AgentConfig
from rl_core.envs.dataset import DatasetEnv
from rl_core.errors import UnsupportedSpec
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline.build import build_evaluator
from rl_core.rollout.base import Completion, SamplingParams
from rl_core.spec import JobSpec, parse_spec

from .conftest import run_pipeline

EVAL_ROWS = {3: 0, 7: 1, 10: 4}  # held-out row -> how many of its 4 samples are right
_QUESTION = re.compile(r"Q(\d+)\?")


class AnsweringEngine:
    """Answers question ``Qi?`` with its row's answer for the first ``EVAL_ROWS[i]`` of every
    4 calls (0 for a training row), else wrongly; records the questions and seeds asked."""

    def __init__(self, tok: BuiltinTokenizer) -> None:
        self.tok = tok
        self.asked: Counter[int] = Counter()
        self.seeds: defaultdict[int, set[int]] = defaultdict(set)
        self.policy_version = 0

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Any = None,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        out = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            found = _QUESTION.search(self.tok.decode(prompt))
            assert found, self.tok.decode(prompt)
            row = int(found[1])
            self.asked[row] += 1
            self.seeds[row].add(seed)
            right = (self.asked[row] - 1) % 4 < EVAL_ROWS.get(row, 0)
            tokens = [*self.tok.encode(str(100 + row) if right else "0"), self.tok.end_of_turn_id]
            out.append(Completion(tokens, [-0.1] * len(tokens), "stop", self.policy_version))
        return out

    def update_weights(self, params: Any, version: int) -> None:
        self.policy_version = version


def dataset_spec(tmp_path: Path) -> JobSpec:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"q": f"Q{i}?", "a": str(100 + i), "part": "eval" * (i in EVAL_ROWS)}) + "\n"
            for i in range(12)
        )
    )
    config = {"path": str(rows), "prompt": "q", "answer": "a", "split": {"field": "part"}}
    return parse_spec(
        {
            "environment": {"name": "dataset", "config": config},
            "train": {
                "eval_interval": 2,
                "eval_episodes": 3,
                "eval_k": 4,
                "eval_temperature": 0.7,
            },
        }
    )


def test_evaluation_samples_k_answers_of_each_held_out_row(tmp_path: Path) -> None:
    spec = dataset_spec(tmp_path)
    tok = BuiltinTokenizer()
    engine = AnsweringEngine(tok)
    agent = Agent(
        engine=engine,  # type: ignore[arg-type]
        tokenizer=tok,
        config=AgentConfig(max_turns=1, max_new_tokens=8, max_context=256),
        sampling=SamplingParams(temperature=0.7),
    )
    evaluator = build_evaluator(spec, agent, DatasetEnv(), episode_prefix="run~a1-")
    assert evaluator is not None

    metrics = asyncio.run(evaluator.run(5))

    # Only held-out rows, each sampled k = 4 times, each sample with its own seed.
    assert engine.asked == {row: 4 for row in EVAL_ROWS}
    assert all(len(seeds) == 4 for seeds in engine.seeds.values())
    assert metrics["eval/episodes"] == 12.0 and metrics["eval/failed"] == 0.0
    # Rows 3, 7, 10 answered right 0, 1 and 4 times of 4.
    assert metrics["eval/pass@1"] == (0 + 1 / 4 + 4 / 4) / 3
    assert metrics["eval/pass@4"] == 2 / 3
    assert metrics["eval/reward_mean"] == 5 / 12


def test_a_pipeline_run_trains_on_train_rows_and_evaluates_on_held_out_ones(
    tmp_path: Path,
) -> None:
    spec = dataset_spec(tmp_path)
    env = DatasetEnv()
    engine = AnsweringEngine(BuiltinTokenizer())
    run = run_pipeline(
        steps=2,
        mode="sync",
        env=env,
        engine=engine,
        env_config=spec.environment.config,
        eval_interval=2,
        evaluator=lambda agent: build_evaluator(spec, agent, env, episode_prefix="r~a1-"),
    )
    # Evaluated before the first step and at the last: each held-out row 4 times a time.
    evaluated = {step: m for step, m in run.sink.steps if "eval/pass@1" in m}
    assert sorted(evaluated) == [0, 2]
    assert all(engine.asked[row] == 8 for row in EVAL_ROWS)
    trained_rows = set(engine.asked) - set(EVAL_ROWS)
    assert trained_rows and trained_rows <= set(range(12)) - set(EVAL_ROWS)
    for metrics in evaluated.values():
        assert metrics["eval/pass@1"] == 5 / 12 and metrics["eval/pass@4"] == 2 / 3
        assert metrics["eval/episodes"] == 12.0


def test_a_dataset_without_an_eval_split_is_not_evaluated_on_training_rows() -> None:
    spec = parse_spec(
        {
            "environment": {"name": "dataset", "config": {"path": "rows.jsonl", "prompt": "q"}},
            "train": {"eval_interval": 1},
        }
    )
    with pytest.raises(UnsupportedSpec, match="eval split"):
        build_evaluator(spec, None, DatasetEnv(), episode_prefix="")  # type: ignore[arg-type]
