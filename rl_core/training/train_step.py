"""The trainer's pure numerics over a model: forward, loss, accumulated gradients, one update.

Everything here is a function of arrays and static configuration; the
`Trainer` (rl_core/training/trainer.py) owns the state and calls these jitted.

Gradient accumulation: a mini-batch of B rows is split into ``micro_batches``
slices scanned one after another, so peak activation memory is that of
B / micro_batches rows. Each slice's loss is normalised by the *whole*
mini-batch's counts (`Counts`), so the sum of the slices' gradients is the
full-batch gradient, not an average of differently normalised ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rl_core.algorithms.grpo import Counts, GrpoConfig, policy_loss, token_logprobs
from rl_core.algorithms.ppo import PpoConfig, value_loss
from rl_core.training.chunked_logits import chunked_token_logprobs
from rl_core.training.head_positions import gathered_token_logprobs
from rl_core.training.lora import LoraConfig, merged_params
from rl_core.training.lora_unmerged import lora_model
from rl_core.training.prefix_shared import SharedPrefix, shared_hidden

Params = Any  # an nnx.State of the model's nnx.Param variables
LoraApply = Literal["merged", "unmerged"]
Trainable = dict[str, Any]  # {"policy": Params | lora.Adapters, "value"?: value head}


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The static (hashable) part of a step: changing it recompiles."""

    temperature: float
    grpo: GrpoConfig
    ppo: PpoConfig | None
    lora: LoraConfig | None
    micro_batches: int
    # Positions per chunk of the output head's logits (rl_core.training.chunked_logits);
    # None: every position's [V] logits at once.
    logits_chunk: int | None = None
    # How the LoRA adapters meet the base in the loss's forward (rl_core.training.
    # lora_unmerged): "unmerged" forms no full-size gradient of a frozen kernel.
    lora_apply: LoraApply = "merged"
    # The loss's forward rematerialises each block in the backward (`Model.hidden`'s
    # ``remat``): the trunk's activations for about one more forward's compute.
    remat: bool = False


class MiniBatch(NamedTuple):
    """One optimiser update's rows. [B, T-1] arrays are aligned with ``tokens[:, 1:]``.

    With ``prefix`` (`rl_core.training.prefix_shared`) each row is a suffix: its tokens
    from its prefix's length on, [B, S+1], and its [B, S] arrays from that position on.
    """

    tokens: jax.Array  # [B, T] int32
    mask: jax.Array  # [B, T-1] float32
    behaviour: jax.Array  # [B, T-1] sampler logprobs
    lag: jax.Array | None  # [B, T-1] policy versions behind the trainer; None: unknown
    advantages: jax.Array  # [B] (GRPO) or [B, T-1] (PPO)
    old_logprobs: jax.Array | None  # [B, T-1]; None: pi_old is the current policy
    ref_logprobs: jax.Array | None  # [B, T-1]; None without a KL term
    old_values: jax.Array | None  # [B, T-1] (PPO)
    returns: jax.Array | None  # [B, T-1] (PPO)
    prefix: SharedPrefix | None = None  # the prompts the rows continue; None: whole rows
    # [B, K] int32: each row's trained positions (`rl_core.training.head_positions`), where
    # alone the output head runs; None: the head at every position.
    trained_at: jax.Array | None = None
    # Packed rows (`rl_core.training.packing`): each row here is a bin of several batch
    # rows, [B, T] positions restarting at 0 and segment ids (-1: padding) per row; the
    # batch rows per bin [B] (the sequence count of `Counts`); sequence_mean's per-target
    # weight [B, T-1], 1 / its own row's trained tokens. None: one batch row per row.
    positions: jax.Array | None = None
    segments: jax.Array | None = None
    sequences: jax.Array | None = None
    sequence_weights: jax.Array | None = None


def effective_params(trainable: Trainable, frozen: dict[str, Any], lora: LoraConfig | None) -> Any:
    """The policy's weights as the model sees them (LoRA: base + merged adapters)."""
    if lora is None:
        return trainable["policy"]
    return merged_params(frozen["base"], trainable["policy"], lora)


def policy_model(
    trainable: Trainable, frozen: dict[str, Any], rest: Any, *, graphdef: Any, cfg: StepConfig
) -> Any:  # the policy as a callable `Model`, for inside a traced function
    """The policy being trained: the model itself, or the frozen base with the adapters
    merged into its kernels or applied beside them (``cfg.lora_apply``)."""
    if cfg.lora is not None and cfg.lora_apply == "unmerged":
        return lora_model(graphdef, frozen["base"], rest, trainable["policy"], cfg.lora)
    return nnx.merge(graphdef, effective_params(trainable, frozen, cfg.lora), rest)


def forward(
    graphdef: Any,
    params: Params,
    rest: Any,
    tokens: jax.Array,  # [B, T]
    temperature: float,
    *,
    with_hidden: bool = False,
    logits_chunk: int | None = None,
    prefix: SharedPrefix | None = None,
    trained_at: jax.Array | None = None,
    positions: jax.Array | None = None,
    segments: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:  # logprobs, entropy [B, T-1], hidden
    """`forward_model` of the model ``params`` make."""
    return forward_model(
        nnx.merge(graphdef, params, rest),
        tokens,
        temperature,
        with_hidden=with_hidden,
        logits_chunk=logits_chunk,
        prefix=prefix,
        trained_at=trained_at,
        positions=positions,
        segments=segments,
    )


def forward_model(
    model: Any,  # a `Model`, or one `policy_model` wrapped
    tokens: jax.Array,  # [B, T]
    temperature: float,
    *,
    with_hidden: bool = False,
    logits_chunk: int | None = None,
    prefix: SharedPrefix | None = None,
    trained_at: jax.Array | None = None,
    positions: jax.Array | None = None,  # [B, T] packed rows' positions; None: 0..T-1
    segments: jax.Array | None = None,  # [B, T] packed rows' segment ids; None: one each
    remat: bool = False,  # each block recomputed in the backward (`Model.hidden`)
) -> tuple[jax.Array, jax.Array, jax.Array | None]:  # logprobs, entropy [B, T-1], hidden
    """Logprob and entropy of every next token; right padding needs only the causal mask.

    ``logits_chunk``: positions per chunk of the output head (`chunked_token_logprobs`),
    so no [B, T-1, V] logits are ever held; None computes them all at once (the
    reference path). The hidden states (for the value head) are the trunk's output
    either way, from the same forward pass. ``prefix``: ``tokens`` are suffixes of the
    prefixes it holds, computed once each (`shared_hidden`). ``trained_at`` [B, K]: the
    head runs at those positions only and the rest are 0 (`gathered_token_logprobs`).
    ``segments`` (`rl_core.training.packing`): each row holds several sequences, each
    attending to its own tokens only, at ``positions``.
    """
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if segments is not None:
        assert positions is not None and prefix is None
        h, _ = model.hidden(inputs, positions[:, :-1], segments=segments[:, :-1], remat=remat)
    elif prefix is None:
        at = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
        h, _ = model.hidden(inputs, at, remat=remat)  # [B, T-1, D]
    else:
        h = shared_hidden(model, prefix, inputs, remat=remat)
    if trained_at is not None:
        lp, entropy = gathered_token_logprobs(
            h, targets, trained_at, model.logits, temperature, logits_chunk
        )
    elif logits_chunk is None:
        lp, entropy = token_logprobs(model.logits(h), targets, temperature)
    else:
        lp, entropy = chunked_token_logprobs(h, targets, model.logits, temperature, logits_chunk)
    return lp, entropy, (h.astype(jnp.float32) if with_hidden else None)


def init_value_head(d_model: int) -> dict[str, jax.Array]:
    # Zero init: every value starts at 0, so the first advantages are the returns.
    return {"w": jnp.zeros((d_model,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def values_of(head: dict[str, jax.Array], hidden: jax.Array) -> jax.Array:  # [B,T,D] -> [B,T]
    values: jax.Array = hidden @ head["w"] + head["b"]
    return values


def score(
    graphdef: Any,
    cfg: StepConfig,
    params: Params,
    rest: Any,
    value_head: dict[str, jax.Array] | None,
    tokens: jax.Array,  # [B, T]
    prefix: SharedPrefix | None = None,
    trained_at: jax.Array | None = None,  # [B, K]: logprobs there only, 0 elsewhere
    positions: jax.Array | None = None,  # [B, T]: packed rows (`rl_core.training.packing`)
    segments: jax.Array | None = None,  # [B, T]
) -> tuple[jax.Array, jax.Array | None]:  # logprobs [B, T-1], values [B, T-1] | None
    lp, _, hidden = forward(
        graphdef,
        params,
        rest,
        tokens,
        cfg.temperature,
        with_hidden=value_head is not None,
        logits_chunk=cfg.logits_chunk,
        prefix=prefix,
        trained_at=trained_at,
        positions=positions,
        segments=segments,
    )
    values = None if value_head is None or hidden is None else values_of(value_head, hidden)
    return lp, values


def micro_loss(
    trainable: Trainable,
    frozen: dict[str, Any],
    rest: Any,
    mb: MiniBatch,
    counts: Counts,
    *,
    graphdef: Any,
    cfg: StepConfig,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    ppo = cfg.ppo
    lp, entropy, hidden = forward_model(
        policy_model(trainable, frozen, rest, graphdef=graphdef, cfg=cfg),
        mb.tokens,
        cfg.temperature,
        with_hidden=ppo is not None,
        logits_chunk=cfg.logits_chunk,
        prefix=mb.prefix,
        trained_at=mb.trained_at,
        positions=mb.positions,
        segments=mb.segments,
        remat=cfg.remat,
    )
    # One update per step: pi_old is the current policy (ratio 1, gradient of the ratio 1).
    fixed = jax.lax.stop_gradient(lp)
    old = fixed if mb.old_logprobs is None else mb.old_logprobs
    ref = mb.ref_logprobs
    # Off the mask pi_old / pi_ref may be 0 (scored at the trained positions only, or
    # packed rows cut after their last trained token) where log pi is not, or the other
    # way round: exp(log pi - old) or the KL there would be dropped by the mask, but not
    # its overflow. Off the mask both read log pi itself: ratio 1, KL 0.
    old = jnp.where(mb.mask > 0, old, fixed)
    ref = None if ref is None else jnp.where(mb.mask > 0, ref, fixed)
    loss, metrics = policy_loss(
        lp,
        old,
        mb.behaviour,
        mb.advantages,
        mb.mask,
        entropy,
        cfg.grpo,
        ref_logprobs=ref,
        counts=counts,
        lag=mb.lag,
        sequence_weights=mb.sequence_weights,
    )
    if ppo is not None:
        assert hidden is not None and mb.old_values is not None and mb.returns is not None
        values = values_of(trainable["value"], hidden)
        v_loss, v_clip = value_loss(
            values, mb.old_values, mb.returns, mb.mask, ppo.value_clip, counts
        )
        loss = loss + ppo.value_coef * v_loss
        metrics.update(value_loss=v_loss, value_clip_frac=v_clip, loss=loss)
    return loss, metrics


def accumulated_grads(
    trainable: Trainable,
    frozen: dict[str, Any],
    rest: Any,
    mb: MiniBatch,
    *,
    graphdef: Any,
    cfg: StepConfig,
) -> tuple[Trainable, dict[str, jax.Array]]:
    """Gradient and metrics of the whole mini-batch, summed over its micro-batches."""
    counts = Counts.of(mb.mask, mb.lag)
    if mb.sequences is not None:  # packed: a row is a bin of several sequences
        counts = counts._replace(sequences=jnp.maximum(mb.sequences.sum(), 1.0))
    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
    m = cfg.micro_batches
    if m == 1:
        (_, metrics), grads = grad_fn(
            trainable, frozen, rest, mb, counts, graphdef=graphdef, cfg=cfg
        )
        return grads, metrics

    def split(x: jax.Array) -> jax.Array:  # [B, ...] -> [M, B/M, ...]
        return x.reshape(m, x.shape[0] // m, *x.shape[1:])

    slices = jax.tree.map(split, mb)

    def body(acc: Trainable, micro: MiniBatch) -> tuple[Trainable, dict[str, jax.Array]]:
        (_, metrics), grads = grad_fn(
            trainable, frozen, rest, micro, counts, graphdef=graphdef, cfg=cfg
        )
        return jax.tree.map(jnp.add, acc, grads), metrics

    zeros = jax.tree.map(jnp.zeros_like, trainable)
    grads, per_micro = jax.lax.scan(body, zeros, slices)
    # Every metric is normalised by the mini-batch's counts, so the slices add up; a
    # ``_max`` metric is the largest of the slices'.
    return grads, {
        name: x.max(axis=0) if name.endswith("_max") else x.sum(axis=0)
        for name, x in per_micro.items()
    }


def update(
    trainable: Trainable,
    opt_state: optax.OptState,
    frozen: dict[str, Any],
    rest: Any,
    mb: MiniBatch,
    *,
    graphdef: Any,
    cfg: StepConfig,
    tx: optax.GradientTransformation,
) -> tuple[Trainable, optax.OptState, dict[str, jax.Array]]:
    """One AdamW update (after global-norm clipping, inside ``tx``) from one mini-batch."""
    grads, metrics = accumulated_grads(trainable, frozen, rest, mb, graphdef=graphdef, cfg=cfg)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return trainable, opt_state, metrics
