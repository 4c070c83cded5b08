"""The training loop behind `rl_core.runner.train`: builds the parts, then steps.

Device work (generation and train steps) runs in one dedicated thread, never
on the event loop, so the episodes in flight stay responsive while the device
computes; the engine and the trainer share that thread, which also keeps
their use of the device strictly one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import jax.numpy as jnp
import numpy as np

from rl_core.agent import END_STATES, Agent, AgentConfig, Trajectory
from rl_core.algorithms.grpo import GrpoConfig, group_advantages
from rl_core.envs import get_environment
from rl_core.errors import EnvironmentFailure, NoTrajectories
from rl_core.models.sources import load_model
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine, next_bucket
from rl_core.runner import StepSink, TrainResult, derive_seed
from rl_core.spec import JobSpec
from rl_core.trainer import TrainBatch, Trainer, TrainerConfig

log = logging.getLogger(__name__)


class TrainingLoop:
    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        a, r = spec.algorithm, spec.rollout
        self.env = get_environment(spec.environment.name)
        model, self.tokenizer = load_model(spec.model, seed=spec.train.seed)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl-device")
        # One fixed row count for generation: as episodes finish, later turns
        # batch fewer rows, and padding them is cheaper than compiling again.
        rows = next_bucket(min(r.concurrency, spec.batch_size, 512), 1)
        self.engine = JaxEngine(
            model,
            config=EngineConfig(
                stop_ids=(self.tokenizer.eos_id, self.tokenizer.end_of_turn_id),
                pad_id=self.tokenizer.pad_id,
                batch_buckets=(rows,) if rows <= 64 else (64, rows),
            ),
            executor=self.executor,
        )
        sampling = SamplingParams(
            temperature=r.sampling.temperature, top_p=r.sampling.top_p, top_k=r.sampling.top_k
        )
        ag = spec.agent
        self.agent = Agent(
            engine=self.engine,
            tokenizer=self.tokenizer,
            config=AgentConfig(
                max_turns=ag.max_turns,
                max_new_tokens=ag.max_new_tokens,
                max_context=ag.max_context,
                system_prompt=ag.system_prompt,
            ),
            sampling=sampling,
        )
        self.trainer = Trainer(
            model,
            TrainerConfig(
                learning_rate=a.learning_rate,
                lr_schedule=a.lr_schedule,
                warmup_steps=a.warmup_steps * a.mini_batches,
                total_steps=spec.train.steps * a.mini_batches,
                max_grad_norm=a.max_grad_norm,
                weight_decay=a.weight_decay,
                mini_batches=a.mini_batches,
                temperature=sampling.temperature if sampling.temperature > 0 else 1.0,
                grpo=GrpoConfig(
                    clip_eps=a.clip_eps,
                    clip_eps_high=a.clip_eps_high,
                    kl_coef=a.kl_coef,
                    entropy_coef=a.entropy_coef,
                    aggregation=a.loss_aggregation,
                    importance_correction=a.importance_correction,
                    importance_cap=a.importance_cap,
                    norm_tokens=ag.max_turns * ag.max_new_tokens,
                ),
            ),
        )

    def close(self) -> None:
        self.executor.shutdown(wait=True)

    async def run(
        self, *, sink: StepSink, should_stop: Callable[[], bool], start_step: int
    ) -> TrainResult:
        spec = self.spec
        done, stopped, final = 0, False, {}
        # The policy after step n is version n; a resumed run starts at its start_step.
        self.engine.update_weights(self.trainer.params(), version=start_step)
        async with self.engine.serving():
            for step in range(start_step + 1, spec.train.steps + 1):
                if should_stop():
                    stopped = True
                    break
                final = await self.step(step)
                # On the loop thread, but between steps: no episode waits on the sink.
                sink.on_step(step, final)
                done += 1
                log.info(
                    "step %d: reward %.3f loss %.4f (%.2fs)",
                    step,
                    final["reward/mean"],
                    final["loss"],
                    final["step_time_s"],
                )
        return TrainResult(steps_completed=done, stopped_early=stopped, final_metrics=final)

    async def step(self, step: int) -> dict[str, float]:
        started = time.perf_counter()
        groups = await self.collect(step)
        rollout_s = time.perf_counter() - started

        trajs = [t for group in groups for t in group]
        kept = [[t.end_state in ("done", "truncated") for t in group] for group in groups]
        if not any(any(row) for row in kept):
            errors = [t.error for t in trajs if t.error]
            if errors:
                raise EnvironmentFailure(f"every episode of step {step} failed; first: {errors[0]}")
            raise NoTrajectories(
                f"every episode of step {step} timed out; raise rollout.episode_timeout_s"
            )
        rewards = np.array([[t.reward for t in g] for g in groups], np.float32)
        advantages = np.asarray(
            group_advantages(
                jnp.asarray(rewards), jnp.asarray(kept), self.spec.algorithm.scale_rewards
            )
        )
        # Dropped episodes stay in the batch as all-zero rows: fixed shapes, no recompile.
        batch = TrainBatch.pack(
            [t.tokens if ok else [] for t, ok in zip(trajs, _flat(kept), strict=True)],
            [t.loss_mask if ok else [] for t, ok in zip(trajs, _flat(kept), strict=True)],
            [t.logprobs if ok else [] for t, ok in zip(trajs, _flat(kept), strict=True)],
            advantages.reshape(-1).tolist(),
            rows=self.spec.batch_size,
            pad_id=self.tokenizer.pad_id,
        )
        train_started = time.perf_counter()
        loop = asyncio.get_running_loop()
        metrics = await loop.run_in_executor(self.executor, self.trainer.train_step, batch)
        self.engine.update_weights(self.trainer.params(), version=step)
        train_s = time.perf_counter() - train_started

        used = [t for t, ok in zip(trajs, _flat(kept), strict=True) if ok]
        used_rewards = np.array([t.reward for t in used], np.float64)
        generated = sum(t.model_tokens for t in trajs)
        ends = Counter(t.end_state for t in trajs)
        metrics.update(
            {
                "reward/mean": float(used_rewards.mean()),
                "reward/max": float(used_rewards.max()),
                "reward/min": float(used_rewards.min()),
                "reward/std": float(used_rewards.std()),
                "episode/turns_mean": float(np.mean([t.turns for t in used])),
                "episode/length_mean": float(np.mean([len(t.tokens) for t in used])),
                "episode/model_tokens_mean": float(np.mean([t.model_tokens for t in used])),
                **{f"episode/{state}": float(ends.get(state, 0)) for state in END_STATES},
                "staleness/max": float(max(step - 1 - t.policy_version for t in used)),
                "policy_version": float(step),
                "tokens_per_s": generated / max(rollout_s, 1e-9),
                "time/rollout_s": rollout_s,
                "time/train_s": train_s,
                "step_time_s": time.perf_counter() - started,
            }
        )
        return metrics

    async def collect(self, step: int) -> list[list[Trajectory]]:
        """Play batch_groups x group_size episodes; a group shares one environment seed."""
        spec = self.spec
        seed = spec.train.seed
        limit = asyncio.Semaphore(spec.rollout.concurrency)

        async def episode(group: int, member: int) -> Trajectory:
            async with limit:
                return await self.agent.run_episode(
                    self.env,
                    episode_id=f"s{step}-g{group}-e{member}",
                    env_seed=derive_seed(seed, "env", step, group),
                    sample_seed=derive_seed(seed, "sample", step, group, member),
                    env_config=spec.environment.config,
                    timeout_s=spec.rollout.episode_timeout_s,
                )

        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    [tg.create_task(episode(g, k)) for k in range(spec.rollout.group_size)]
                    for g in range(spec.algorithm.batch_groups)
                ]
        except ExceptionGroup as group:
            # Episodes absorb environment failures; what escapes is a bug or a
            # broken engine. Raise the first cause itself so the run's error reads well.
            raise group.exceptions[0] from group
        return [[task.result() for task in row] for row in tasks]


def _flat(rows: list[list[bool]]) -> list[bool]:
    return [x for row in rows for x in row]
