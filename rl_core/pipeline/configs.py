"""The job spec mapped onto each part's config: the one place that reads spec fields.

`build` makes the parts from these; nothing below the pipeline reads a `JobSpec`
(the environments' webhook settings excepted: they are the spec's own section).
Pure mapping, plus the few sizing rules that depend on several sections at once.
"""

from __future__ import annotations

import dataclasses
import os

from rl_core.agent.agent import AgentConfig
from rl_core.algorithms.grpo import GrpoConfig
from rl_core.algorithms.ppo import PpoConfig
from rl_core.models.buckets import next_bucket, quarter_bucket
from rl_core.models.config import ModelConfig
from rl_core.models.tokenizer import Tokenizer
from rl_core.pipeline.pipeline import PipelineConfig
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.jax_engine import EngineConfig
from rl_core.rollout.vllm_server import VllmServerConfig
from rl_core.spec import JobSpec
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import TrainerConfig

# Contexts up to this many tokens get one prefill row length (prompts packed up to
# it): padding a small model's prompts is far cheaper than compiling again as
# episodes grow (tens of seconds on a busy CPU).
SINGLE_BUCKET_CONTEXT = 256
# Train steps do bucket by length: their cost grows with it (8 passes of 64 rows at
# 128 tokens cost the tiny game twice what 64 tokens do). Quarter octaves (..., 96,
# 112, 128, 160, ...), not powers of two: a row of 97 tokens pads to 112, not 128, and
# one of 282 to 320, not 512 (bench/README.md, "P1 / the head at the trained
# positions"); a run's longest row moves little, so it meets one or two of them.
TRAIN_MIN_LENGTH = 32
TRAIN_LENGTH_BUCKET = quarter_bucket


# `rollout.prefix_reuse` unset: the prefix pool is on for models whose blocks cost at
# least this many FLOPs a token (about 10M matmul weights). SmolLM2-135M (212M a token)
# ran a multi-turn run's later steps in 0.90-0.92x the time with it; on builtin:tiny
# (0.19M) the pool's bookkeeping and extra programs outweighed the prefill it saved.
PREFIX_REUSE_FLOPS = 20_000_000


def engine_config(spec: JobSpec, tokenizer: Tokenizer, model: ModelConfig) -> EngineConfig:
    """The built-in engine's batch and prompt buckets for this run of ``model``."""
    r, ag = spec.rollout, spec.agent
    # One fixed row count for generation: as episodes finish, later turns
    # batch fewer rows, and padding them is cheaper than compiling again.
    # In flight at most: one batch in sync runs; in async ones `concurrency`, and no more
    # than the staleness bound lets start ahead of the trainer ((M + 1) batches).
    ahead = 1 if spec.staleness.mode == "sync" else spec.staleness.max_staleness + 1
    rows = next_bucket(min(r.concurrency, spec.batch_size * ahead), 1)
    single = ag.max_context <= SINGLE_BUCKET_CONTEXT
    length = next_bucket(ag.max_context, 1) if single else 32
    reuse = r.prefix_reuse
    if reuse is None:
        reuse = model.block_flops_per_token >= PREFIX_REUSE_FLOPS
    return EngineConfig(
        stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id),
        pad_id=tokenizer.pad_id,
        batch_buckets=(rows,) if rows <= 64 else (64, rows),
        min_prompt_bucket=length,
        max_packed_tokens=length if single else EngineConfig.max_packed_tokens,
        prefix_pool_rows=None if reuse else 0,
    )


def vllm_server_config(spec: JobSpec, max_seq_len: int) -> VllmServerConfig:
    """The vLLM server rlaas starts for a run with ``rollout.engine: vllm`` and no URL.

    Its context is the model's, as the JAX engine's cache; it decodes at most as many
    sequences together as episodes can be in flight (vLLM's own cap is 256 here).
    """
    return VllmServerConfig(
        max_model_len=max_seq_len,
        max_num_seqs=min(spec.rollout.concurrency, 256),
        seed=spec.train.seed,
        # vLLM on CPU shares the host with the JAX trainer. In async mode the trainer
        # trains while the server serves; given every core, vLLM's OpenMP threads spin at
        # each barrier while XLA's hold the cores (on 2 cores SmolLM2 decoded 30 tokens/s
        # beside a train step), so it gets half. In sync mode the two take turns: all.
        threads=None if spec.staleness.mode == "sync" else max(1, (os.cpu_count() or 2) // 2),
    )


def sampling_params(spec: JobSpec, *, evaluation: bool = False) -> SamplingParams:
    """The rollout sampler; held-out evaluation changes only the temperature."""
    s = spec.rollout.sampling
    params = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
    if evaluation:
        return dataclasses.replace(params, temperature=spec.train.eval_temperature)
    return params


def agent_config(spec: JobSpec) -> AgentConfig:
    ag = spec.agent
    return AgentConfig(
        max_turns=ag.max_turns,
        max_new_tokens=ag.max_new_tokens,
        max_context=ag.max_context,
        system_prompt=ag.system_prompt,
        tool_call_format=ag.tool_call_format,
        max_episode_tokens=ag.max_episode_tokens,
        max_episode_s=ag.max_episode_s,
        turn_timeout_s=ag.turn_timeout_s,
        env_timeout_s=ag.env_timeout_s,
        cut_turn=ag.cut_turn,
    )


def trainer_config(spec: JobSpec, *, norm_tokens: int | None = None) -> TrainerConfig:
    """The trainer settings a job spec asks for (schedules counted in optimiser updates)."""
    a, ag = spec.algorithm, spec.agent
    temperature = spec.rollout.sampling.temperature
    lora = spec.model.lora
    return TrainerConfig(
        learning_rate=a.learning_rate,
        lr_schedule=a.lr_schedule,
        warmup_steps=a.warmup_steps * a.mini_batches * a.epochs,
        total_steps=spec.train.steps * a.mini_batches * a.epochs,
        max_grad_norm=a.max_grad_norm,
        weight_decay=a.weight_decay,
        mini_batches=a.mini_batches,
        epochs=a.epochs,
        micro_batches=a.micro_batches,
        temperature=temperature if temperature > 0 else 1.0,
        grpo=GrpoConfig(
            clip_eps=a.clip_eps,
            clip_eps_high=a.clip_eps_high,
            kl_coef=a.kl_coef,
            kl_estimator=a.kl_estimator,
            entropy_coef=a.entropy_coef,
            entropy_floor=a.entropy_floor,
            aggregation=a.loss_aggregation,
            importance_correction=a.importance_correction,
            importance_cap=a.importance_cap,
            norm_tokens=norm_tokens or ag.max_turns * ag.max_new_tokens,
        ),
        ppo=None
        if a.name != "ppo"
        else PpoConfig(
            gamma=a.gae_gamma,
            gae_lambda=a.gae_lambda,
            value_coef=a.value_coef,
            value_clip=a.value_clip,
        ),
        lora=None
        if lora is None
        else LoraConfig(rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets)),
        seed=spec.train.seed,
        fit_compiled=spec.train.fit_compiled,
        remat=spec.train.remat,
    )


def pipeline_config(spec: JobSpec) -> PipelineConfig:
    a, t = spec.algorithm, spec.train
    return PipelineConfig(
        steps=t.steps,
        batch_groups=a.batch_groups,
        group_size=spec.rollout.group_size,
        mode=spec.staleness.mode,
        max_staleness=spec.staleness.max_staleness,
        concurrency=spec.rollout.concurrency,
        stale_policy=spec.staleness.policy,
        checkpoint_interval=t.checkpoint_interval or 0,
        checkpoint_every_s=t.checkpoint_every_s,
        # Neither set: by time, from the checkpoint's measured cost (0 steps is "only at
        # the end", which a spec asks for explicitly).
        checkpoint_auto=t.checkpoint_interval is None and t.checkpoint_every_s is None,
        eval_interval=t.eval_interval,
        trajectories_per_step=t.trajectories_per_step,
        drop_equal_groups=a.dynamic_sampling.enabled,
        max_dropped_equal=a.dynamic_sampling.cap(a.batch_groups),
        turn_credit=a.credit == "turn",
    )
