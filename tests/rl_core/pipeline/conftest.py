"""Pipeline tests: the real collector, queue, pipeline and agent, with a scripted engine,
scriptable environments and a recording trainer (no model: the point here is the pipeline)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from rl_core.agent.agent import Agent, AgentConfig
from rl_core.envs.base import Action, Reset, Step
from rl_core.host.control import RunControl
from rl_core.host.sinks import MemorySink
from rl_core.host.telemetry import Profiler, SpanRecorder
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline.batch import build_batch
from rl_core.pipeline.collector import Collector
from rl_core.pipeline.device import DeviceThread
from rl_core.pipeline.pipeline import Pipeline, PipelineConfig
from rl_core.pipeline.queue import Admission, Group, GroupQueue
from rl_core.pipeline.result import TrainResult
from rl_core.records import CheckpointRecord
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine

_ID = re.compile(r"g(\d+)-e(\d+)(?:-r(\d+))?$")


def parse_id(episode_id: str) -> tuple[int, int, int]:
    """(task index, member, attempt) of an episode id."""
    match = _ID.search(episode_id)
    assert match, episode_id
    return int(match[1]), int(match[2]), int(match[3] or 0)


UNTIL_LIMIT_S = 30.0  # a condition that never comes fails the test, not hangs it


@dataclasses.dataclass
class Behaviour:
    """What the environment does for one episode."""

    turns: int = 1  # steps until done
    delay_s: float = 0.0  # per step
    reward: float = 1.0
    fail: bool = False  # step raises (an infrastructure failure)
    # The step also waits until this holds (e.g. the trainer has made two updates): an
    # ordering on events, not on how long the host takes (at most `UNTIL_LIMIT_S`).
    until: Callable[[], bool] | None = None


class ScriptEnv:
    """An environment whose behaviour per episode comes from ``plan(task, member, attempt)``."""

    def __init__(self, plan: Callable[[int, int, int], Behaviour] | None = None) -> None:
        self.plan = plan or (lambda task, member, attempt: Behaviour())
        self.active: dict[str, Behaviour] = {}
        self.closed: list[str] = []
        self.resets: list[str] = []

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        self.active[episode_id] = self.plan(*parse_id(episode_id))
        self.resets.append(episode_id)
        return Reset(messages=[{"role": "user", "content": "go"}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        b = self.active[episode_id]
        if b.delay_s:
            await asyncio.sleep(b.delay_s)
        if b.until is not None:
            async with asyncio.timeout(UNTIL_LIMIT_S):
                while not b.until():  # noqa: ASYNC110 (set on the trainer's thread)
                    await asyncio.sleep(0.001)
        if b.fail:
            raise ConnectionError(f"{episode_id}: webhook down")
        done = step >= b.turns
        return Step(
            messages=[{"role": "user", "content": "again"}],
            reward=b.reward if done else 0.0,
            done=done,
        )

    async def close(self, episode_id: str) -> None:
        self.closed.append(episode_id)
        self.active.pop(episode_id, None)


class RecordingTrainer:
    """Stands in for the trainer: remembers every batch's groups; optionally slow."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.updates = 0
        self.batches: list[list[Group]] = []

    def train_step(self, groups: list[Group]) -> dict[str, float]:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.batches.append(groups)
        self.updates += 1
        return {
            "loss": 0.0,
            "kl": 0.0,
            "entropy": 1.0,
            "clip_frac": 0.0,
            "grad_norm": 0.0,
            "learning_rate": 1e-3,
            "mismatch_kl": 0.0,
        }

    def params(self) -> Any:
        return {"updates": self.updates}


class MemoryCheckpointer:
    def __init__(self) -> None:
        self.saved: dict[int, dict[str, Any]] = {}

    def save(self, step: int, extra: Mapping[str, Any]) -> CheckpointRecord:
        self.saved[step] = dict(extra)
        return CheckpointRecord(step=step, uri=f"memory://{step}", size_bytes=0)


@dataclasses.dataclass
class Run:
    pipeline: Pipeline
    result: TrainResult
    sink: MemorySink
    env: Any  # a ScriptEnv unless the test gave its own
    trainer: RecordingTrainer
    control: RunControl

    def trained(self) -> list[tuple[int, list[Group]]]:
        return [(i + 1 + self.pipeline.start_step, b) for i, b in enumerate(self.trainer.batches)]

    def metrics(self, name: str) -> list[float]:
        return [m[name] for _, m in self.sink.steps]


def run_pipeline(
    *,
    steps: int = 4,
    batch_groups: int = 2,
    group_size: int = 3,
    mode: str = "async",
    max_staleness: int = 1,
    policy: str = "drop",
    env: Any = None,
    trainer: RecordingTrainer | None = None,
    control: RunControl | None = None,
    engine_delay_s: float = 0.0,
    episode_timeout_s: float | None = 5.0,
    agent: AgentConfig | None = None,
    checkpointer: MemoryCheckpointer | None = None,
    checkpoint_interval: int = 0,
    position: Mapping[str, Any] | None = None,
    start_step: int = 0,
    concurrency: int = 64,
    timeout_s: float = 30.0,
    drop_equal_groups: bool = False,
    max_dropped_equal: int = 0,
    trajectories_per_step: int = 2,
    engine: Any = None,
    env_config: Mapping[str, Any] | None = None,
    eval_interval: int = 0,
    evaluator: Callable[[Agent], Any] | None = None,
) -> Run:
    tok = BuiltinTokenizer()
    env = env or ScriptEnv()
    trainer = trainer or RecordingTrainer()
    control = control or RunControl()
    sink = MemorySink()
    engine = engine or ScriptedEngine(
        [[*tok.encode("1"), tok.end_of_turn_id]],
        stop_ids=(tok.eos_id, tok.end_of_turn_id),
        delay_s=engine_delay_s,
    )
    engine.version = start_step
    recorder = SpanRecorder()
    device = DeviceThread(recorder)
    agent_obj = Agent(
        engine=engine,
        tokenizer=tok,
        config=agent
        or AgentConfig(max_turns=8, max_new_tokens=4, max_context=256, env_timeout_s=5.0),
        sampling=SamplingParams(),
        recorder=recorder,
    )

    def collector(admission: Admission, queue: GroupQueue) -> Collector:
        return Collector(
            agent=agent_obj,
            env=env,
            admission=admission,
            queue=queue,
            group_size=group_size,
            concurrency=concurrency,
            seed=0,
            env_config=env_config or {},
            episode_timeout_s=episode_timeout_s,
            position=position,
        )

    def batch(groups: list[Group]) -> list[Group]:
        # The real packing runs too (it must accept every group the pipeline passes on).
        build_batch(
            groups,
            group_size=group_size,
            rows=batch_groups * group_size,
            pad_id=0,
            scale_rewards=True,
        )
        return groups

    pipeline = Pipeline(
        config=PipelineConfig(
            steps=steps,
            batch_groups=batch_groups,
            group_size=group_size,
            mode=mode,
            max_staleness=max_staleness,
            concurrency=concurrency,
            stale_policy=policy,
            checkpoint_interval=checkpoint_interval,
            trajectories_per_step=trajectories_per_step,
            drop_equal_groups=drop_equal_groups,
            max_dropped_equal=max_dropped_equal,
            eval_interval=eval_interval,
        ),
        collector_factory=collector,
        engine=engine,
        trainer=trainer,
        build_batch=batch,
        snapshot=lambda p: p,
        tokenizer=tok,
        device=device,
        recorder=recorder,
        sink=sink,
        control=control,
        profiler=Profiler(None),
        checkpointer=checkpointer,
        start_step=start_step,
        evaluator=evaluator(agent_obj) if evaluator else None,
    )

    async def main() -> TrainResult:
        async with asyncio.timeout(timeout_s):
            return await pipeline.run()

    try:
        result = asyncio.run(main())
    finally:
        device.shutdown()
    return Run(pipeline, result, sink, env, trainer, control)


def seeded_delays(seed: int, high_s: float) -> Callable[[int, int, int], Behaviour]:
    def plan(task: int, member: int, attempt: int) -> Behaviour:
        rng = random.Random(f"{seed}-{task}-{member}-{attempt}")
        return Behaviour(
            turns=rng.randint(1, 3), delay_s=rng.uniform(0, high_s), reward=rng.random()
        )

    return plan


@pytest.fixture
def tok() -> BuiltinTokenizer:
    return BuiltinTokenizer()
