"""The trainer: the one stateful object. Holds the policy and its optimiser; takes steps.

A batch is padded to fixed shapes before it reaches the jitted step: a fixed
number of rows (the run's batch size) and a length rounded up to a power of
two, so a run compiles one step per length bucket and never per batch.

Logprobs are recomputed here for every token (the sampler's are only used as
the behaviour policy of the importance weight), and the gap between the two
is reported as ``mismatch_kl``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rl_core.algorithms.grpo import GrpoConfig, policy_loss, token_logprobs
from rl_core.models import Model
from rl_core.rollout.jax_engine import next_bucket


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    learning_rate: float = 1e-4
    lr_schedule: str = "constant"  # constant | cosine
    warmup_steps: int = 0
    total_steps: int = 1  # optimiser updates in the run, for the cosine schedule
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    mini_batches: int = 1
    # Logprobs are taken at the sampling temperature, so at temperature t the
    # trainer's policy is the one the sampler drew from (before top-k/top-p).
    temperature: float = 1.0
    min_length_bucket: int = 32
    grpo: GrpoConfig = dataclasses.field(default_factory=GrpoConfig)

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (greedy sampling trains at 1.0)")


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """Host arrays, already padded. Row i is one trajectory; zero mask rows are padding."""

    tokens: np.ndarray  # [B, T] int32
    loss_mask: np.ndarray  # [B, T] float32
    logprobs: np.ndarray  # [B, T] float32, sampler's, aligned with tokens
    advantages: np.ndarray  # [B] float32

    @classmethod
    def pack(
        cls,
        tokens: Sequence[Sequence[int]],
        loss_mask: Sequence[Sequence[int]],
        logprobs: Sequence[Sequence[float]],
        advantages: Sequence[float],
        *,
        rows: int,
        min_length: int = 32,
        pad_id: int = 0,
    ) -> TrainBatch:
        if len(tokens) > rows:
            raise ValueError(f"{len(tokens)} trajectories do not fit in {rows} rows")
        length = next_bucket(max((len(t) for t in tokens), default=1), min_length)
        tok = np.full((rows, length), pad_id, np.int32)
        mask = np.zeros((rows, length), np.float32)
        lp = np.zeros((rows, length), np.float32)
        adv = np.zeros((rows,), np.float32)
        for i, (t, m, p) in enumerate(zip(tokens, loss_mask, logprobs, strict=True)):
            tok[i, : len(t)], mask[i, : len(m)], lp[i, : len(p)] = t, m, p
            adv[i] = advantages[i]
        return cls(tok, mask, lp, adv)


def learning_rate_schedule(config: TrainerConfig) -> optax.Schedule:
    """Linear warm-up to the peak, then constant or cosine decay to 10% of it."""
    peak, warmup = config.learning_rate, config.warmup_steps
    decay_steps = max(config.total_steps - warmup, 1)

    def schedule(count: jax.Array) -> jax.Array:
        step = jnp.asarray(count, jnp.float32)
        ramp = jnp.minimum(1.0, (step + 1.0) / (warmup + 1.0))
        progress = jnp.clip((step - warmup) / decay_steps, 0.0, 1.0)
        cosine = 0.1 + 0.9 * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        decay = cosine if config.lr_schedule == "cosine" else jnp.ones_like(cosine)
        return peak * ramp * decay

    return schedule


class Trainer:
    def __init__(self, model: Model, config: TrainerConfig) -> None:
        self.model = model
        self.config = config
        self.schedule = learning_rate_schedule(config)
        tx = optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.adamw(self.schedule, weight_decay=config.weight_decay),
        )
        self.optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        # The reference policy of the KL term is the initial one, kept only if used.
        self._ref = jax.tree.map(jnp.copy, nnx.state(model)) if config.grpo.kl_coef > 0 else None
        self.updates = 0

    def params(self) -> Any:
        """The current weights, for `RolloutEngine.update_weights`."""
        return nnx.state(self.model)

    def logprobs(self, tokens: np.ndarray) -> np.ndarray:  # [B, T] -> [B, T]
        """Logprob of each token given its prefix (0 at position 0), as the trainer sees it."""
        lp = _logprobs(self.model, jnp.asarray(tokens), self.config.temperature)
        return np.asarray(jnp.pad(lp, ((0, 0), (1, 0))))

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update per mini-batch over ``batch``; returns mean metrics."""
        cfg = self.config
        tokens = jnp.asarray(batch.tokens)
        # pi_old: the policy before this step's updates, for ratios and the importance weight.
        old = _logprobs(self.model, tokens, cfg.temperature)
        ref = (
            _logprobs(nnx.merge(nnx.graphdef(self.model), self._ref), tokens, cfg.temperature)
            if self._ref is not None
            else jnp.zeros_like(old)
        )
        rows = tokens.shape[0]
        size = rows // cfg.mini_batches
        totals: dict[str, float] = {}
        for i in range(cfg.mini_batches):
            sl = slice(i * size, (i + 1) * size)
            lr = float(self.schedule(self.updates))
            metrics = _update(
                self.model,
                self.optimizer,
                tokens[sl],
                jnp.asarray(batch.loss_mask[sl]),
                jnp.asarray(batch.logprobs[sl]),
                jnp.asarray(batch.advantages[sl]),
                old[sl],
                ref[sl],
                cfg.temperature,
                cfg.grpo,
            )
            self.updates += 1
            for name, value in jax.device_get(metrics).items():
                totals[name] = totals.get(name, 0.0) + float(value)
            totals["learning_rate"] = totals.get("learning_rate", 0.0) + lr
        return {name: value / cfg.mini_batches for name, value in totals.items()}


@nnx.jit(static_argnames=("temperature",))
def _logprobs(model: Model, tokens: jax.Array, temperature: float) -> jax.Array:
    # [B, T] -> [B, T-1]: the logprob of tokens[:, 1:] given the tokens before.
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1] - 1), tokens[:, :-1].shape)
    logits, _ = model(tokens[:, :-1], positions)
    lp, _ = token_logprobs(logits, tokens[:, 1:], temperature)
    return lp


@nnx.jit(static_argnames=("temperature", "grpo"))
def _update(
    model: Model,
    optimizer: nnx.Optimizer[Model],
    tokens: jax.Array,  # [B, T]
    loss_mask: jax.Array,  # [B, T]
    behaviour: jax.Array,  # [B, T] sampler logprobs, aligned with tokens
    advantages: jax.Array,  # [B]
    old: jax.Array,  # [B, T-1]
    ref: jax.Array,  # [B, T-1]
    temperature: float,
    grpo: GrpoConfig,
) -> dict[str, jax.Array]:
    # Right-padded rows: padding sits after every real token, so the causal
    # mask alone keeps it out of the real tokens' logits.
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mask, behaviour = loss_mask[:, 1:], behaviour[:, 1:]
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)

    def loss_fn(model: Model) -> tuple[jax.Array, dict[str, jax.Array]]:
        logits, _ = model(inputs, positions)
        lp, entropy = token_logprobs(logits, targets, temperature)
        return policy_loss(
            lp,
            old,
            behaviour,
            advantages,
            mask,
            entropy,
            grpo,
            ref_logprobs=ref if grpo.kl_coef > 0 else None,
        )

    (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return dict(metrics)
