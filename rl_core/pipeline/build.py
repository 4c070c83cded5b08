"""Build a `Pipeline` from a job spec, with the real parts: model, JAX engine, trainer."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax

from rl_core.agent.agent import Agent, AgentConfig
from rl_core.envs import build_environment
from rl_core.host.control import RunControl
from rl_core.host.sinks import RunSink
from rl_core.host.telemetry import Profiler, SpanRecorder
from rl_core.models.buckets import next_bucket
from rl_core.pipeline.batch import build_batch
from rl_core.pipeline.collector import Collector
from rl_core.pipeline.device import DeviceThread
from rl_core.pipeline.evaluate import Evaluator
from rl_core.pipeline.pipeline import Pipeline, PipelineConfig
from rl_core.pipeline.queue import Admission, Group, GroupQueue
from rl_core.pretrained.sources import load_model
from rl_core.records import CheckpointRecord
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine
from rl_core.spec import JobSpec
from rl_core.training.trainer import Trainer, trainer_config_from_spec

log = logging.getLogger(__name__)

SINGLE_BUCKET_CONTEXT = 256
TRAIN_MIN_LENGTH = 32


class OrbaxCheckpointer:
    """`Checkpointer` over `rl_core.training.checkpointing`.

    Writes ``artifacts_dir/checkpoints/step-NNNNNNNN``.
    """

    def __init__(self, artifacts_dir: Path, trainer: Trainer) -> None:
        self.artifacts_dir, self.trainer = artifacts_dir, trainer

    def save(self, step: int, extra: Mapping[str, Any]) -> CheckpointRecord:
        from rl_core.training.checkpointing import checkpoint_dir, save_checkpoint

        return save_checkpoint(
            checkpoint_dir(self.artifacts_dir, step), step=step, trainer=self.trainer, extra=extra
        )


def snapshot(params: Any) -> Any:
    """A detached copy of the pytree's structure (arrays are immutable, so not of the arrays):
    later in-place updates of the trainer's variables never reach what the engine serves."""
    return jax.tree.map(lambda x: x, params)


def build_pipeline(
    spec: JobSpec,
    *,
    sink: RunSink,
    control: RunControl,
    artifacts_dir: Path | None,
    resume_from: str | None,
    episode_prefix: str,
    webhooks: Mapping[str, Any] | None,
    callbacks: Any,
    start_step: int = 0,
) -> tuple[Pipeline, Callable[[], None]]:
    """The pipeline and a ``close`` to call when it has run (it stops the device thread)."""
    a, r, ag = spec.algorithm, spec.rollout, spec.agent
    env = build_environment(spec.environment, webhooks=webhooks or {}, callbacks=callbacks)
    model, tokenizer = load_model(spec.model, seed=spec.train.seed)
    recorder = SpanRecorder()
    device = DeviceThread(recorder)
    # One fixed row count for generation: as episodes finish, later turns
    # batch fewer rows, and padding them is cheaper than compiling again.
    rows = next_bucket(min(r.concurrency, spec.batch_size * (spec.staleness.max_staleness + 1)), 1)
    # Short contexts get one prefill row length (prompts packed up to it): padding a small
    # model's prompts is far cheaper than compiling again as episodes grow (tens of
    # seconds on a busy CPU).
    single = ag.max_context <= SINGLE_BUCKET_CONTEXT
    length = next_bucket(ag.max_context, 1) if single else 32
    engine = JaxEngine(
        model,
        config=EngineConfig(
            stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id),
            pad_id=tokenizer.pad_id,
            batch_buckets=(rows,) if rows <= 64 else (64, rows),
            min_prompt_bucket=length,
            max_packed_tokens=length if single else EngineConfig.max_packed_tokens,
        ),
        executor=device,
    )
    sampling = SamplingParams(
        temperature=r.sampling.temperature, top_p=r.sampling.top_p, top_k=r.sampling.top_k
    )
    trainer = Trainer(model, trainer_config_from_spec(spec))
    position: Mapping[str, Any] | None = None
    if resume_from is not None:
        from rl_core.training.checkpointing import restore_checkpoint

        start_step, extra = restore_checkpoint(resume_from, trainer=trainer)
        position = extra.get("collector")
        log.info("resumed from %s at step %d", resume_from, start_step)
    agent_config = AgentConfig(
        max_turns=ag.max_turns,
        max_new_tokens=ag.max_new_tokens,
        max_context=ag.max_context,
        system_prompt=ag.system_prompt,
        tool_call_format=ag.tool_call_format,
        max_episode_tokens=ag.max_episode_tokens,
        max_episode_s=ag.max_episode_s,
        turn_timeout_s=ag.turn_timeout_s,
        env_timeout_s=ag.env_timeout_s,
    )
    agent = Agent(
        engine=engine,
        tokenizer=tokenizer,
        config=agent_config,
        sampling=sampling,
        recorder=recorder,
    )
    evaluator = None
    if spec.train.eval_interval:
        t = spec.train
        evaluator = Evaluator(
            agent=Agent(
                engine=engine,
                tokenizer=tokenizer,
                config=agent_config,
                sampling=dataclasses.replace(sampling, temperature=t.eval_temperature),
                recorder=recorder,
            ),
            env=env,
            env_config=spec.environment.config,
            episodes=t.eval_episodes,
            concurrency=r.concurrency,
            seed=t.seed,
            episode_timeout_s=r.episode_timeout_s,
            episode_prefix=episode_prefix,
        )

    def collector(admission: Admission, queue: GroupQueue) -> Collector:
        return Collector(
            agent=agent,
            env=env,
            admission=admission,
            queue=queue,
            group_size=r.group_size,
            concurrency=r.concurrency,
            seed=spec.train.seed,
            env_config=spec.environment.config,
            episode_timeout_s=r.episode_timeout_s,
            episode_prefix=episode_prefix,
            position=position,
        )

    def batch(groups: list[Group]) -> Any:
        return build_batch(
            groups,
            group_size=r.group_size,
            rows=spec.batch_size,
            pad_id=tokenizer.pad_id,
            scale_rewards=a.scale_rewards,
            # Train steps do bucket by length: their cost grows with it (8 passes of
            # 64 rows at 128 tokens cost the tiny game twice what 64 tokens do), and
            # a handful of power-of-two buckets compile once each.
            min_length=TRAIN_MIN_LENGTH,
        )

    pipeline = Pipeline(
        config=PipelineConfig(
            steps=spec.train.steps,
            batch_groups=a.batch_groups,
            group_size=r.group_size,
            mode=spec.staleness.mode,
            max_staleness=spec.staleness.max_staleness,
            stale_policy=spec.staleness.policy,
            checkpoint_interval=spec.train.checkpoint_interval,
            eval_interval=spec.train.eval_interval,
            trajectories_per_step=spec.train.trajectories_per_step,
        ),
        collector_factory=collector,
        engine=engine,
        trainer=trainer,
        build_batch=batch,
        snapshot=snapshot,
        tokenizer=tokenizer,
        device=device,
        recorder=recorder,
        sink=sink,
        control=control,
        profiler=Profiler(artifacts_dir / "profiles" if artifacts_dir else None),
        checkpointer=OrbaxCheckpointer(artifacts_dir, trainer) if artifacts_dir else None,
        evaluator=evaluator,
        start_step=start_step,
    )
    return pipeline, lambda: device.shutdown(wait=True)
