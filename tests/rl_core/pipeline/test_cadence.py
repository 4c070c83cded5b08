"""When checkpoints are due: by steps, by seconds, and by the measured cost (the default)."""

from __future__ import annotations

import pytest

from rl_core.pipeline.cadence import (
    AUTO_CEILING_S,
    AUTO_FLOOR_S,
    CheckpointCadence,
    auto_interval_s,
)
from rl_core.pipeline.configs import pipeline_config
from rl_core.spec import parse_spec


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_auto_interval_keeps_checkpoints_to_two_percent_between_its_bounds() -> None:
    assert auto_interval_s(1.0) == pytest.approx(50.0)  # 1 s of 50 s: 2%
    assert auto_interval_s(0.05) == AUTO_FLOOR_S  # a cheap checkpoint: not more often
    assert auto_interval_s(60.0) == AUTO_CEILING_S  # a costly one: a preemption's bound


def test_by_default_the_first_step_is_checkpointed_then_at_the_cost_interval() -> None:
    clock = Clock()
    cadence = CheckpointCadence(auto=True, clock=clock)
    clock.now += 60.0  # the attempt's first step (of a run resumed at step 6): compiling
    assert cadence.due(7)  # a checkpoint now, to measure its cost
    cadence.saved(cost_s=0.05)  # cheap: the floor
    assert cadence.interval_s == AUTO_FLOOR_S
    clock.now += AUTO_FLOOR_S - 0.5
    assert not cadence.due(8)
    clock.now += 0.5
    assert cadence.due(9)
    cadence.saved(cost_s=2.0)  # 2 s a checkpoint: one every 100 s
    assert cadence.interval_s == pytest.approx(100.0)
    clock.now += 99.0
    assert not cadence.due(50)
    clock.now += 1.0
    assert cadence.due(51)


def test_a_spec_sets_seconds_or_steps_and_zero_steps_is_only_at_the_end() -> None:
    clock = Clock()
    seconds = CheckpointCadence(every_s=30.0, clock=clock)
    clock.now += 60.0  # the first step, compiling: not counted
    assert not seconds.due(1)
    clock.now += 29.9
    assert not seconds.due(2)
    clock.now += 0.1
    assert seconds.due(3)
    seconds.saved(cost_s=100.0)  # a fixed interval ignores the cost
    assert seconds.interval_s == 30.0

    steps = CheckpointCadence(every_steps=3, clock=clock)
    assert [s for s in range(1, 10) if steps.due(s)] == [3, 6, 9]
    assert steps.interval_s is None

    never = CheckpointCadence(clock=clock)
    clock.now += 1e6
    assert not any(never.due(s) for s in range(1, 100))


def _train(**train: object) -> dict[str, object]:
    spec = parse_spec({"environment": {"name": "guess_number"}, "train": train})
    config = pipeline_config(spec)
    return {
        "steps": config.checkpoint_interval,
        "seconds": config.checkpoint_every_s,
        "auto": config.checkpoint_auto,
    }


def test_the_spec_fields_map_to_the_cadence() -> None:
    assert _train() == {"steps": 0, "seconds": None, "auto": True}
    assert _train(checkpoint_interval=0) == {"steps": 0, "seconds": None, "auto": False}
    assert _train(checkpoint_interval=5) == {"steps": 5, "seconds": None, "auto": False}
    assert _train(checkpoint_every_s=60) == {"steps": 0, "seconds": 60.0, "auto": False}


def test_a_spec_with_both_intervals_is_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"checkpoint_interval .* or checkpoint_every_s"):
        parse_spec(
            {
                "environment": {"name": "guess_number"},
                "train": {"checkpoint_interval": 5, "checkpoint_every_s": 60},
            }
        )
