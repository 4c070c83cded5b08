"""Shared parts of B1-B7: the real pipeline, a latency-only engine, a sleeping or real trainer.

Every benchmark here builds the project's own `Collector`, `Admission`,
`GroupQueue`, `Agent` and `Pipeline` on the simulated-latency environment
(`rl_core.envs.simulated`); only the model is stood in for: `DelayEngine`
answers each call after ``g`` seconds (the model-call latency of the
performance model in docs/benchmarks.md) and `SleepTrainer` takes ``T`` seconds per
step. B2 swaps in the real JAX trainer on the builtin tiny model.

Workarounds of the pipeline's public API (said in bench/README.md): spans
cannot be switched off, so `NullRecorder` is a `SpanRecorder` that records
nothing (B7's baseline); trained groups are seen through the ``build_batch``
hook, which the pipeline calls in the device thread just before the train step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rl_core.agent.agent import Agent, AgentConfig
from rl_core.envs.simulated import SimConfig, SimulatedLatency, plan_episode
from rl_core.host.control import RunControl
from rl_core.host.sinks import MemorySink
from rl_core.host.telemetry import Profiler, SpanRecorder, percentile
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline.collector import Collector, derive_seed
from rl_core.pipeline.device import DeviceThread
from rl_core.pipeline.pipeline import Pipeline, PipelineConfig
from rl_core.pipeline.queue import Admission, Group, GroupQueue
from rl_core.rollout.base import Completion, Grammar, SamplingParams, refuse_unserved

SEED = 0
# Simulated timeouts (adversarial-tail) are expected; one warning each would bury the tables.
logging.getLogger("rl_core.agent.agent").setLevel(logging.ERROR)
TOKENIZER = BuiltinTokenizer()
REPLY = [*TOKENIZER.encode("ok"), TOKENIZER.end_of_turn_id]


class DelayEngine:
    """A rollout engine that only takes time: every call answers "ok" after ``delay_s``.

    The test fake (`rl_core.rollout.fake.ScriptedEngine`) keeps every prompt it
    saw, which a benchmark of tens of thousands of calls cannot afford.
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.version = 0
        self.calls = 0

    @property
    def policy_version(self) -> int:
        return self.version

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        refuse_unserved("benchmark's", sampling, grammars, top_logprobs)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.calls += len(prompts)
        version = self.version
        return [Completion(list(REPLY), [-0.5] * len(REPLY), "stop", version) for _ in prompts]

    def update_weights(self, params: Any, version: int) -> None:
        self.version = version


class SleepTrainer:
    """The trainer as the performance model sees it: ``T`` seconds of device time per step."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.updates = 0

    def train_step(self, batch: Any) -> dict[str, float]:
        if self.step_s:
            time.sleep(self.step_s)
        self.updates += 1
        return {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0, "mismatch_kl": 0.0}

    def params(self) -> Any:
        return {"updates": self.updates}


class NullRecorder(SpanRecorder):
    """Stage metrics off: spans are neither timed nor kept (B7's baseline)."""

    def add(self, name: str, **kwargs: Any) -> None:
        return None

    @contextlib.contextmanager
    def span(self, name: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        yield {}


def make_agent(
    engine: Any, recorder: SpanRecorder, *, max_turns: int = 128, max_context: int = 8192
) -> Agent:
    return Agent(
        engine=engine,
        tokenizer=TOKENIZER,
        config=AgentConfig(
            max_turns=max_turns,
            max_new_tokens=8,
            max_context=max_context,
            tool_call_format="none",
            env_timeout_s=120.0,
        ),
        sampling=SamplingParams(),
        recorder=recorder,
    )


# --- the performance model's inputs, from the environment's own plans ----------


@dataclasses.dataclass(frozen=True)
class PlanStats:
    """Episode latency W = env latency + K model calls of ``g``, over the tasks a run plays."""

    latencies: tuple[float, ...]  # W per task index 0..n-1
    model_frac: float  # share of W in model calls

    @property
    def mean(self) -> float:
        return statistics.fmean(self.latencies)

    @property
    def cv(self) -> float:
        return statistics.pstdev(self.latencies) / self.mean

    def mean_max(self, n: int) -> float:
        """E[max W] over consecutive batches of ``n`` tasks (what a synchronous step waits for)."""
        chunks = [self.latencies[i : i + n] for i in range(0, len(self.latencies) - n + 1, n)]
        return statistics.fmean(max(c) for c in chunks)


def plan_stats(
    env: Mapping[str, Any], model_delay_s: float, tasks: int, seed: int = SEED
) -> PlanStats:
    cfg = SimConfig(**env)
    ws, model = [], 0.0
    for i in range(tasks):
        plan = plan_episode(cfg, derive_seed(seed, "env", i))
        timeout_s = cfg.timeout_s * cfg.resolved().time_scale
        env_s = sum(
            timeout_s if t else lat for lat, t in zip(plan.latencies_s, plan.timeouts, strict=True)
        )
        ws.append(env_s + plan.turns * model_delay_s)
        model += plan.turns * model_delay_s
    return PlanStats(tuple(ws), model / sum(ws))


# --- one pipeline run -----------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class PipeSpec:
    env: Mapping[str, Any]
    group_size: int
    batch_groups: int
    concurrency: int
    mode: str = "async"
    max_staleness: int = 1
    steps: int = 10
    cap_s: float = 60.0
    model_delay_s: float = 0.0
    max_turns: int = 128
    max_context: int = 8192
    metrics: bool = True
    seed: int = SEED


@dataclasses.dataclass
class Trained:
    step: int
    at_s: float  # since the run started
    groups: list[Group]


@dataclasses.dataclass
class PipeRun:
    spec: PipeSpec
    wall_s: float
    steps: list[dict[str, float]]
    spans: list[Any]
    trained: list[Trained]
    partial_groups: int  # groups handed to the trainer with an episode still running, or a
    #   whole group with one missing (a split group's parts hold fewer members by design)
    # (episodes in flight, trajectories queued, the trainer's state), sampled every 10 ms
    load: list[tuple[int, int, str]]
    stopped_early: bool

    @property
    def steps_per_s(self) -> float:
        return len(self.steps) / self.wall_s

    def metric(self, name: str) -> list[float]:
        return [m[name] for m in self.steps]

    def staleness(self) -> list[int]:
        return [t.step - 1 - g.version for t in self.trained for g in t.groups]


PipelineFactory = Callable[..., Pipeline]


def run_pipeline(
    spec: PipeSpec,
    *,
    trainer: Any,
    make_batch: Callable[[list[Group]], Any] = lambda groups: groups,
    snapshot: Callable[[Any], Any] = lambda params: params,
    pipeline_cls: PipelineFactory = Pipeline,
) -> PipeRun:
    recorder: SpanRecorder = SpanRecorder() if spec.metrics else NullRecorder()
    device = DeviceThread(recorder)
    engine = DelayEngine(spec.model_delay_s)
    agent = make_agent(engine, recorder, max_turns=spec.max_turns, max_context=spec.max_context)
    env = SimulatedLatency()
    sink, control = MemorySink(), RunControl()
    trained: list[Trained] = []
    partial = [0]
    started = [0.0]

    def collector(admission: Admission, queue: GroupQueue) -> Collector:
        return Collector(
            agent=agent,
            env=env,
            admission=admission,
            queue=queue,
            group_size=spec.group_size,
            concurrency=spec.concurrency,
            seed=spec.seed,
            env_config=dict(spec.env),
            episode_timeout_s=None,
        )

    def batch(groups: list[Group]) -> Any:
        # Runs in the device thread right before the train step: the moment a group is "trained".
        now = time.monotonic()
        for g in groups:
            ended = all(t.finished is not None and t.finished <= now for t in g.trajectories)
            # A first part (a group split around its stragglers) holds fewer members by
            # design (docs/lifecycle.md, staleness); a whole group must hold them all.
            whole = g.part != "whole" or len(g.trajectories) == spec.group_size
            if not whole or not ended:
                partial[0] += 1
        trained.append(Trained(len(trained) + 1, time.perf_counter() - started[0], list(groups)))
        return make_batch(groups)

    pipeline = pipeline_cls(
        config=PipelineConfig(
            steps=spec.steps,
            batch_groups=spec.batch_groups,
            group_size=spec.group_size,
            mode=spec.mode,
            max_staleness=spec.max_staleness,
            concurrency=spec.concurrency,  # admission by episode counts against C (async)
            trajectories_per_step=0,
        ),
        collector_factory=collector,
        engine=engine,
        trainer=trainer,
        build_batch=batch,
        snapshot=snapshot,
        tokenizer=TOKENIZER,
        device=device,
        recorder=recorder,
        sink=sink,
        control=control,
        profiler=Profiler(None),
    )
    load: list[tuple[int, int, str]] = []

    async def sample() -> None:
        while True:
            queued = pipeline.queue.depth * spec.group_size
            load.append((len(pipeline.collector.inflight), queued, pipeline.trainer_state))
            await asyncio.sleep(0.01)

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        loop.call_later(spec.cap_s, control.request_stop)  # the wall-clock cap: stop, keep figures
        started[0] = time.perf_counter()
        sampler = asyncio.create_task(sample())
        try:
            result = await pipeline.run()
        finally:
            sampler.cancel()
        return result.stopped_early

    t0 = time.perf_counter()
    try:
        stopped = asyncio.run(main())
    finally:
        device.shutdown()
    wall = time.perf_counter() - t0
    return PipeRun(
        spec, wall, [m for _, m in sink.steps], list(sink.spans), trained, partial[0], load, stopped
    )


# --- printing -------------------------------------------------------------------


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(header), *[[fmt(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells[1:]]
    return "\n".join(lines)


def verdict(name: str, ok: bool, detail: str) -> str:
    return f"  [{'PASS' if ok else 'MISS'}] {name}: {detail}"


def p(values: Sequence[float], q: float) -> float:
    return percentile(list(values), q)


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


__all__ = [
    "DelayEngine",
    "NullRecorder",
    "PipeRun",
    "PipeSpec",
    "PlanStats",
    "SleepTrainer",
    "Trained",
    "fmt",
    "make_agent",
    "p",
    "plan_stats",
    "ratio",
    "run_pipeline",
    "table",
    "verdict",
]
