"""Run a whole training job from its spec: the entry point of the worker and the CLI.

One step, top to bottom::

    collect   batch_groups x group_size episodes, concurrently (asyncio)
    score     group-relative advantages (GRPO)
    train     one optimiser update per mini-batch, in the device thread
    sync      push the new weights to the rollout engine (policy version = step)
    report    sink.on_step(step, metrics)

This is the synchronous baseline: every episode of a step is played by the
policy of the step before, so staleness is 0 whatever ``staleness.mode`` says.
The asynchronous pipeline (collection overlapping training) replaces the
collect/train alternation later; the metrics and the sink stay the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from rl_core.errors import UnsupportedSpec
from rl_core.spec import JobSpec

log = logging.getLogger(__name__)


class StepSink(Protocol):
    def on_step(self, step: int, metrics: Mapping[str, float]) -> None: ...


@dataclasses.dataclass(frozen=True)
class TrainResult:
    steps_completed: int
    stopped_early: bool
    final_metrics: dict[str, float]


class JsonlSink:
    """Appends one JSON object per step, ``{"step": n, <metric>: value, ...}``, to ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        line = json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}})
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


class MemorySink:
    """Keeps every step in memory: the sink of tests and notebooks."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, float]]] = []

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self.steps.append((step, dict(metrics)))


def train(
    spec: JobSpec,
    *,
    sink: StepSink,
    should_stop: Callable[[], bool] = lambda: False,
    start_step: int = 0,
) -> TrainResult:
    """Train ``spec`` for steps ``start_step + 1 .. spec.train.steps``, reporting each to ``sink``.

    ``should_stop`` is polled between steps (a cancel stops at a step
    boundary). ``start_step`` continues the step count of an earlier attempt;
    until checkpoints exist the weights restart from their initial values.
    Must be called from synchronous code (it runs its own event loop).
    """
    _check_supported(spec)
    # Imported here: importing rl_core.runner (the CLI does, for --help) must not start JAX.
    from rl_core.loop import TrainingLoop

    loop = TrainingLoop(spec)
    try:
        return asyncio.run(loop.run(sink=sink, should_stop=should_stop, start_step=start_step))
    finally:
        loop.close()


def _check_supported(spec: JobSpec) -> None:
    if spec.rollout.engine != "jax":
        raise UnsupportedSpec("rollout.engine", f"{spec.rollout.engine!r} is not supported yet")
    if spec.model.lora is not None:
        raise UnsupportedSpec("model.lora", "LoRA is not supported yet; remove model.lora")
    if spec.agent.chat_template != "model":
        raise UnsupportedSpec("agent.chat_template", "only the model's own template ('model')")
    if spec.algorithm.name != "grpo":
        raise UnsupportedSpec("algorithm.name", f"{spec.algorithm.name!r} is not supported yet")


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (same parts, same seed, on every machine)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


__all__ = ["JsonlSink", "MemorySink", "StepSink", "TrainResult", "derive_seed", "train"]
