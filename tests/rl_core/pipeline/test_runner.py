"""`runner.train` end to end on the tiny model: metrics, files, profiles, exact resume, errors."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rl_core.artifacts import export_dir
from rl_core.errors import UnknownEnvironment, UnsupportedModelSource, UnsupportedSpec
from rl_core.host.control import RunControl
from rl_core.host.sinks import MemorySink
from rl_core.pipeline.runner import TrainResult, train, train_to_folder
from rl_core.spec import JobSpec, TensorboardSpec, parse_spec

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
    "mismatch/engine_kl",
    "mismatch/engine_max",
    "mismatch/lagged_token_frac",
    "episode/turns_mean",
    "episode/length_mean",
    "tokens_per_s",
    "trajectories_per_s",
    "step_time_s",
    "queue/depth",
    "staleness/mean",
    "staleness/bucket_0",
    "engine/busy_frac",
    "trainer/busy_frac",
    "time/train_step_s",
    *(f"episode/{s}" for s in ("done", "truncated", "timeout", "env_error", "cancelled")),
}


def small_spec(**patch: Any) -> JobSpec:
    data: dict[str, Any] = {
        "environment": {"name": "guess_number", "config": {"low": 1, "high": 4, "max_turns": 2}},
        "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 64},
        "rollout": {"group_size": 4, "concurrency": 8},
        "algorithm": {"batch_groups": 2, "learning_rate": 1e-3},
        "staleness": {"mode": "sync"},
        "train": {"steps": 2, "seed": 0},
    }
    for section, values in patch.items():
        data[section] = {**data.get(section, {}), **values}
    return parse_spec(data)


def test_an_async_runs_mismatch_separates_the_engines_gap_from_the_policys_lag(
    tmp_path: Path,
) -> None:
    """Async, with large steps: tokens sampled by the policy before the trainer's are
    off by the update, while the JAX engine on the trainer's own weights agrees with it
    to float32 rounding. ``mismatch_max`` mixes the two; the split names each."""
    sink = MemorySink()
    spec = small_spec(
        staleness={"mode": "async", "max_staleness": 1},
        algorithm={"learning_rate": 3e-2, "entropy_coef": 1.0},
        rollout={"group_size": 4, "concurrency": 16},
        train={"steps": 4},
    )
    train(spec, sink=sink, artifacts_dir=tmp_path / "run")
    nan = float("nan")
    for step, m in sink.steps:
        print(
            f"step {step}: engine max {m.get('mismatch/engine_max', nan):.1e}, lagged max "
            f"{m.get('mismatch/lagged_max', nan):.2f} on "
            f"{m['mismatch/lagged_token_frac']:.0%} of tokens; mismatch_max {m['mismatch_max']:.2f}"
        )
        # A split with no tokens is left out, never reported as 0.
        assert ("mismatch/engine_max" in m) == (m["mismatch/lagged_token_frac"] < 1)
        assert ("mismatch/lagged_max" in m) == (m["mismatch/lagged_token_frac"] > 0)
    engine = [m["mismatch/engine_max"] for _, m in sink.steps if "mismatch/engine_max" in m]
    lagged = [m["mismatch/lagged_max"] for _, m in sink.steps if "mismatch/lagged_max" in m]
    assert engine and lagged, "the run did not train both kinds of token: it shows nothing"
    assert max(engine) < 1e-3  # the JAX engine on the trainer's weights: float32 rounding
    assert min(lagged) > 100 * max(engine)  # an update's worth of policy change


def test_two_steps_report_every_metric_and_the_files(tmp_path: Path) -> None:
    sink = MemorySink()
    control = RunControl()
    control.request_profile(1)
    result = train(small_spec(), sink=sink, control=control, artifacts_dir=tmp_path / "a")
    assert isinstance(result, TrainResult)
    assert result.steps_completed == 2 and not result.stopped_early
    assert [step for step, _ in sink.steps] == [1, 2]
    for _, metrics in sink.steps:
        assert set(metrics) >= REQUIRED, REQUIRED - set(metrics)
        assert all(math.isfinite(v) for v in metrics.values())
        assert metrics["reward/min"] <= metrics["reward/mean"] <= metrics["reward/max"]
        assert metrics["mismatch_kl"] == pytest.approx(0.0, abs=0.05)
        assert metrics["learning_rate"] == pytest.approx(1e-3)
        assert metrics["staleness/max"] == 0.0  # sync mode
        # ... so every token was sampled with the trainer's weights: the mismatch is the
        # engine's alone, and there is no lagged figure to report.
        assert metrics["mismatch/lagged_token_frac"] == 0.0
        assert "mismatch/lagged_kl" not in metrics
        assert metrics["mismatch/engine_kl"] == pytest.approx(metrics["mismatch_kl"], abs=1e-7)
    assert result.final_metrics == sink.steps[-1][1]
    assert {s.name for s in sink.spans} >= {"rollout", "model_call", "train_step", "engine_batch"}
    assert sink.trajectories and sink.trajectories[0].segments
    # The default cadence: one after the first step (to time it), and the final one.
    assert [c.step for c in sink.checkpoints] == [1, 2]
    assert (export_dir(tmp_path / "a", 2, "hf") / "model.safetensors").is_file()
    assert not export_dir(tmp_path / "a", 2, "peft").exists()  # no LoRA, no adapter
    profiles = list((tmp_path / "a" / "profiles").rglob("*.xplane.pb"))
    assert profiles, "a requested profile writes an XProf trace under artifacts_dir/profiles"

    # Same spec, same seed, through the CLI's files: the same numbers; and mirrored to the
    # spec's tracker (docs/trackers.md), its counters among the step's metrics.
    out = tmp_path / "out"
    one_step = small_spec(train={"steps": 1})
    tracked = one_step.model_copy(update={"trackers": (TensorboardSpec(kind="tensorboard"),)})
    again = train_to_folder(tracked, out)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert again.steps_completed == 1 and [line["step"] for line in lines] == [1]
    assert lines[0]["tracker/tensorboard/errors"] == lines[0]["tracker/tensorboard/dropped"] == 0
    assert list((out / "trackers" / "tensorboard").glob("events.out.tfevents.*"))
    for name in ("reward/mean", "loss", "episode/length_mean"):
        assert lines[0][name] == pytest.approx(sink.steps[0][1][name], rel=1e-5), name
    timeline = json.loads((out / "timeline.json").read_text())
    assert {e["name"] for e in timeline["traceEvents"] if e["ph"] == "X"} >= {"train_step"}
    assert any(e["ph"] == "M" for e in timeline["traceEvents"])
    records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert records and records[0]["step"] == 1 and records[0]["segments"]
    assert (out / "checkpoints" / "step-00000001").is_dir()


class StopAfter(MemorySink):
    def __init__(self, control: RunControl, step: int) -> None:
        super().__init__()
        self.control, self.step = control, step

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        super().on_step(step, metrics)
        if step == self.step:
            self.control.request_stop()


def test_a_stopped_run_resumes_exactly_where_it_left_off(tmp_path: Path) -> None:
    spec = small_spec(train={"steps": 3, "checkpoint_interval": 0})  # only the stop's
    whole = MemorySink()
    train(spec, sink=whole)

    control = RunControl()
    first = StopAfter(control, 2)
    stopped = train(spec, sink=first, control=control, artifacts_dir=tmp_path)
    assert stopped.stopped_early and stopped.steps_completed == 2
    assert [c.step for c in first.checkpoints] == [2]  # the stop wrote a final checkpoint

    rest = MemorySink()
    resumed = train(spec, sink=rest, artifacts_dir=tmp_path, resume_from=first.checkpoints[0].uri)
    assert resumed.steps_completed == 1 and [s for s, _ in rest.steps] == [3]
    for name in ("reward/mean", "loss", "grad_norm", "episode/length_mean"):
        assert rest.steps[0][1][name] == pytest.approx(whole.steps[2][1][name], rel=1e-4), name
    ids = {t.episode_id for t in rest.trajectories if t.step == 3}  # not the cancelled ones
    assert ids == {t.episode_id for t in whole.trajectories if t.step == 3}


def test_unknown_environment_is_typed() -> None:
    with pytest.raises(UnknownEnvironment, match="'tic_tac_toe'"):
        train(small_spec(environment={"name": "tic_tac_toe"}), sink=MemorySink())


def test_unsupported_model_sources_are_typed() -> None:
    with pytest.raises(UnsupportedModelSource, match="unknown builtin preset 'huge'"):
        train(small_spec(model={"source": "builtin:huge"}), sink=MemorySink())


def test_unsupported_features_are_typed() -> None:
    spec = small_spec(agent={"chat_template": "{{ messages }}"})
    with pytest.raises(UnsupportedSpec, match=r"agent\.chat_template"):
        train(spec, sink=MemorySink())


def test_importing_the_runner_and_spec_loads_no_jax() -> None:
    code = (
        "import sys, rl_core, rl_core.spec, rl_core.pipeline.runner; sys.exit('jax' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_lora_run_goes_through_the_whole_pipeline(tmp_path: Path) -> None:
    sink = MemorySink()
    spec = small_spec(model={"lora": {"rank": 4, "alpha": 8.0}})
    result = train(spec, sink=sink, artifacts_dir=tmp_path)
    assert result.steps_completed == 2
    # The final checkpoint's downloads were made beside it, before it was reported
    # (tests/rl_core/training/test_exports.py loads them in transformers and PEFT). The
    # default cadence wrote one after step 1 too: its adapter stays, its merged model went.
    assert [c.step for c in sink.checkpoints] == [1, 2]
    assert export_dir(tmp_path, 1, "peft").is_dir() and not export_dir(tmp_path, 1, "hf").exists()
    assert {p.name for p in export_dir(tmp_path, 2, "peft").iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert {"config.json", "model.safetensors"} <= {
        p.name for p in export_dir(tmp_path, 2, "hf").iterdir()
    }
    assert [step for step, _ in sink.steps] == [1, 2]
    # (A step whose groups all tie has zero advantages, hence zero gradient: only finiteness here;
    # tests/rl_core/training/test_lora.py shows what the adapters learn.)
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for _, m in sink.steps)


def test_a_ppo_run_goes_through_the_whole_pipeline() -> None:
    sink = MemorySink()
    # A random model rarely wins the game, so the reward is the length penalty: every
    # episode that ends a turn scores (negatively). Turns of up to 32 tokens end often
    # enough; at 8 nearly all are cut off, unscored.
    spec = small_spec(
        algorithm={"name": "ppo"},
        environment={"reward": "length_penalty:0.1"},
        agent={"max_new_tokens": 32, "max_context": 128},
        train={"steps": 3},
    )
    result = train(spec, sink=sink)
    assert result.steps_completed == 3
    metrics = [m for _, m in sink.steps]
    assert all(math.isfinite(m["value_loss"]) and math.isfinite(m["loss"]) for m in metrics)
    # The rewards reached GAE: V = 0 (the head's start) against non-zero returns is a
    # non-zero value loss. (tests/rl_core/training/test_trainer.py shows the head fitting
    # its returns.)
    rewarded = [m for m in metrics if m["reward/min"] < 0]
    assert rewarded and all(m["value_loss"] > 0 for m in rewarded)


def test_evaluation_runs_before_the_first_step_and_at_its_interval() -> None:
    spec = small_spec(train={"steps": 3, "eval_interval": 2, "eval_episodes": 6})
    sink = MemorySink()
    train(spec, sink=sink)
    steps = dict(sink.steps)
    # Before training (step 0, on its own), at the interval, and after the last step.
    assert [s for s, m in sink.steps if "eval/reward_mean" in m] == [0, 2, 3]
    # ("eval/solved" joins them once an episode gets as far as a step the game judges.)
    held_out = {"eval/reward_mean", "eval/turns_mean", "eval/episodes", "eval/failed"}
    held_out.add("eval/pass@1")  # eval_k 1: pass@1 only
    assert held_out <= set(steps[0]) <= held_out | {"eval/solved"}
    assert steps[2]["eval/episodes"] + steps[2]["eval/failed"] == 6
    assert "eval/reward_mean" not in steps[1] and "reward/mean" in steps[2]


def test_evaluation_runs_on_a_webhook_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held-out episodes go through the same client as training ones: a tenant's server
    behind the SDK helper, over loopback HTTP, plays them under their own episode ids.
    The run closes the client's connections before its event loop ends."""
    from rl_core.envs.guess_number import GuessNumber
    from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
    from sdk.envserver import EnvServer
    from tests.sdk.serving import SECRET, serving

    class Recorded(GuessNumber):
        def __init__(self) -> None:
            super().__init__()
            self.ids: list[str] = []

        async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Any:
            self.ids.append(episode_id)
            return await super().reset(episode_id, seed, config)

    closed: list[bool] = []
    original_aclose = WebhookEnvironment.aclose

    async def aclose(self: WebhookEnvironment) -> None:
        closed.append(asyncio.get_running_loop().is_running())
        await original_aclose(self)

    monkeypatch.setattr(WebhookEnvironment, "aclose", aclose)
    game = Recorded()
    spec = small_spec(
        environment={"name": "env_game", "webhook": {"retries": 0}},
        train={"steps": 1, "eval_interval": 1, "eval_episodes": 4},
    )
    sink = MemorySink()
    with serving(EnvServer(game, secret=SECRET).app) as url:
        target = WebhookTarget(id="env_game", url=url, secret=SECRET, timeout_s=10.0)
        train(spec, sink=sink, webhooks={"env_game": target})
    evals = {s: m for s, m in sink.steps if "eval/reward_mean" in m}
    assert sorted(evals) == [0, 1]
    for metrics in evals.values():
        assert metrics["eval/episodes"] == 4 and metrics["eval/failed"] == 0
    held_out = sorted(i for i in game.ids if i.startswith("eval"))
    assert held_out == [f"eval{s}-e{i}" for s in (0, 1) for i in range(4)]
    assert closed == [True]
