"""`runner.train` end to end on the tiny model, and its typed errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rl_core.errors import UnknownEnvironment, UnsupportedModelSource, UnsupportedSpec
from rl_core.runner import JsonlSink, MemorySink, TrainResult, train
from rl_core.spec import JobSpec, parse_spec

REQUIRED = {
    "reward/mean",
    "reward/max",
    "reward/min",
    "loss",
    "grad_norm",
    "learning_rate",
    "entropy",
    "clip_frac",
    "mismatch_kl",
    "episode/turns_mean",
    "episode/length_mean",
    "tokens_per_s",
    "step_time_s",
    "episode/done",
    "episode/truncated",
    "episode/timeout",
    "episode/env_error",
}


def small_spec(**patch: Any) -> JobSpec:
    data: dict[str, Any] = {
        "environment": {"name": "guess_number", "config": {"low": 1, "high": 4, "max_turns": 2}},
        "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 64},
        "rollout": {"group_size": 4, "concurrency": 8},
        "algorithm": {"batch_groups": 2, "learning_rate": 1e-3},
        "train": {"steps": 2, "seed": 0},
    }
    for section, values in patch.items():
        data[section] = {**data.get(section, {}), **values}
    return parse_spec(data)


def test_two_steps_report_every_metric(tmp_path: Path) -> None:
    sink = MemorySink()
    result = train(small_spec(), sink=sink)
    assert isinstance(result, TrainResult)
    assert result.steps_completed == 2 and not result.stopped_early
    assert [step for step, _ in sink.steps] == [1, 2]
    for _, metrics in sink.steps:
        assert set(metrics) >= REQUIRED, REQUIRED - set(metrics)
        assert all(math.isfinite(v) for v in metrics.values())
        ends = sum(metrics[f"episode/{s}"] for s in ("done", "truncated", "timeout", "env_error"))
        assert ends == 8  # batch_groups x group_size
        assert metrics["reward/min"] <= metrics["reward/mean"] <= metrics["reward/max"]
        assert metrics["mismatch_kl"] == pytest.approx(0.0, abs=1e-4)  # temperature 1, no top-p
        assert metrics["learning_rate"] == pytest.approx(1e-3)
    assert result.final_metrics == sink.steps[-1][1]

    # Same spec, same seed: the same episodes and the same numbers.
    path = tmp_path / "m.jsonl"
    again = train(small_spec(train={"steps": 1}), sink=JsonlSink(path))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert again.steps_completed == 1 and [line["step"] for line in lines] == [1]
    for name in ("reward/mean", "loss", "episode/length_mean"):
        assert lines[0][name] == pytest.approx(sink.steps[0][1][name], rel=1e-5), name


def test_start_step_continues_the_count() -> None:
    sink = MemorySink()
    result = train(small_spec(train={"steps": 3}), sink=sink, start_step=2)
    assert result.steps_completed == 1 and [step for step, _ in sink.steps] == [3]
    assert sink.steps[0][1]["policy_version"] == 3


def test_should_stop_is_checked_between_steps() -> None:
    sink = MemorySink()
    calls = iter([False, True])
    result = train(small_spec(train={"steps": 5}), sink=sink, should_stop=lambda: next(calls))
    assert result.stopped_early and result.steps_completed == 1
    assert [step for step, _ in sink.steps] == [1]


def test_unknown_environment_is_typed() -> None:
    with pytest.raises(UnknownEnvironment, match="'tic_tac_toe'"):
        train(small_spec(environment={"name": "tic_tac_toe"}), sink=MemorySink())


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("gguf:/models/x.gguf", "model source kind 'gguf' is not supported yet"),
        ("hf:/models/qwen", "model source kind 'hf' is not supported yet"),
        ("builtin:huge", "unknown builtin preset 'huge'"),
    ],
)
def test_unsupported_model_sources_are_typed(source: str, message: str) -> None:
    with pytest.raises(UnsupportedModelSource, match=message):
        train(small_spec(model={"source": source}), sink=MemorySink())


def test_unsupported_features_are_typed() -> None:
    spec = small_spec(rollout={"engine": "vllm", "vllm_url": "http://127.0.0.1:9"})
    with pytest.raises(UnsupportedSpec, match=r"rollout\.engine"):
        train(spec, sink=MemorySink())


def test_importing_the_runner_and_spec_loads_no_jax() -> None:
    code = "import sys, rl_core, rl_core.spec, rl_core.runner; sys.exit('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
