"""Runs that share a process (`Colocation`): two LoRA runs of one base hold one copy of
it (the same arrays), take turns on the device, and each trains exactly as it does alone
(sync runs: every step's loss, reward and engine mismatch equal); the base is freed when
the last one ends. A run that trains every weight loads its own base."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from rl_core.host.sinks import MemorySink
from rl_core.pipeline.colocation import Colocation
from rl_core.pipeline.runner import start_local_hosts, train
from rl_core.pretrained.shared_bases import base_key
from rl_core.spec import JobSpec
from tests.rl_core.pipeline.test_runner import small_spec

# The trainer's figures, within float32 rounding: alone, the engine samples with the
# adapters merged into the base; shared, beside it (unmerged), which rounds differently.
COMPARED = ("loss", "entropy", "grad_norm", "clip_frac")


def lora_spec(learning_rate: float, **patch: Any) -> JobSpec:
    return small_spec(
        model={"lora": {"rank": 4}},
        algorithm={"learning_rate": learning_rate, "entropy_coef": 1.0},
        train={"steps": 4},
        **patch,
    )


class WatchingSink(MemorySink):
    """Records, at each step, how many runs hold the run's base in the colocation."""

    def __init__(self, colocation: Colocation, spec: JobSpec) -> None:
        super().__init__()
        self.colocation, self.key = colocation, base_key(spec.model, seed=spec.train.seed)
        self.holders: list[int] = []

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self.holders.append(self.colocation.bases.holders().get(self.key, 0))
        super().on_step(step, metrics)


def train_together(colocation: Colocation, specs: dict[str, JobSpec]) -> dict[str, WatchingSink]:
    """Trains ``specs`` at once in ``colocation``, a thread each (as a worker hosts them);
    their sinks. Both held the one base while they trained (the second joined the first's
    lease), and it was dropped when the last one ended."""
    sinks = {name: WatchingSink(colocation, spec) for name, spec in specs.items()}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            train(
                specs[name],
                sink=sinks[name],
                colocation=colocation,
                episode_prefix=name,
                trainer_hosts=start_local_hosts,  # for a run with resources.hosts > 1
            )
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(name,)) for name in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert max(h for sink in sinks.values() for h in sink.holders) == 2
    assert colocation.bases.holders() == {}
    return sinks


def assert_trains_as_alone(shared: MemorySink, alone: MemorySink) -> None:
    assert [s for s, _ in shared.steps] == [s for s, _ in alone.steps] == [1, 2, 3, 4]
    for (step, got), (_, want) in zip(shared.steps, alone.steps, strict=True):
        assert got["reward/mean"] == want["reward/mean"], step  # the same episodes
        for name in COMPARED:
            assert got[name] == pytest.approx(want[name], rel=1e-4, abs=1e-6), (step, name)
    # The adapters moved the policy (the figures compared change from step to step, far
    # more than the tolerance), and the engine sampled with them, as the trainer scores.
    losses = [m["loss"] for _, m in shared.steps]
    assert max(losses) - min(losses) > 1e-3
    assert max(m["mismatch/engine_max"] for _, m in shared.steps) < 1e-4


def test_two_lora_runs_share_one_base_and_each_trains_as_it_does_alone() -> None:
    colocation = Colocation()
    specs = {"a": lora_spec(0.3), "b": lora_spec(0.01, rollout={"group_size": 2})}
    sinks = train_together(colocation, specs)
    # Both took turns on the one device share, and left it.
    assert colocation.device.used() == {}
    alone = MemorySink()
    train(specs["a"], sink=alone, episode_prefix="a")
    assert_trains_as_alone(sinks["a"], alone)


def test_a_run_that_trains_every_weight_loads_its_own_base() -> None:
    colocation = Colocation()
    spec = small_spec(train={"steps": 1})  # no model.lora
    sink = WatchingSink(colocation, spec)
    train(spec, sink=sink, colocation=colocation, episode_prefix="full")
    assert sink.holders == [0]  # never in the shared bases


def test_a_two_process_lora_run_shares_the_base_and_trains_as_it_does_alone() -> None:
    """``resources.hosts: 2`` beside a one-process run: the worker's engine samples with
    the adapters the two trainer processes send, in a slot beside the shared base."""
    # A moderate rate: two processes sum the gradient in another order, and at 0.3 Adam
    # turns that rounding (in near-zero gradient entries) into whole steps (tried: grad
    # norms 2 % apart by step 4 with or without a shared base; at 0.01, 1e-6 apart).
    specs = {
        "two": lora_spec(0.01, resources={"hosts": 2}),
        "one": lora_spec(0.3, rollout={"group_size": 2}),
    }
    sinks = train_together(Colocation(), specs)
    alone = MemorySink()
    train(lora_spec(0.01), sink=alone, episode_prefix="two")  # one process, its own base
    assert_trains_as_alone(sinks["two"], alone)
