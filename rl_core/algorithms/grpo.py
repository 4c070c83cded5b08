"""GRPO (Shao et al., 2024, DeepSeekMath) and its Dr.GRPO / DAPO variants, as pure functions.

Advantages are group-relative: every episode of a group starts from the same
environment seed, and its advantage is its reward minus the group mean,
optionally divided by the group std (``scale_rewards``; Dr.GRPO, Liu et al.
2025, drops the division, which otherwise up-weights near-unanimous groups).
`turn_advantages` is the multi-turn form: each turn's tokens get that turn's
return-to-go against the group's at the same turn, instead of the episode's.

The per-token objective is PPO's clipped surrogate (Schulman et al., 2017)
with asymmetric clipping (DAPO's clip-higher, Yu et al. 2025)::

    r_t   = pi_theta(a_t) / pi_old(a_t)
    L_t   = -min(r_t * A, clip(r_t, 1 - eps, 1 + eps_high) * A) * w_t
    w_t   = min(pi_old(a_t) / mu(a_t), cap)      # truncated importance sampling

where ``pi_old`` is the trainer's own policy at the start of the step and
``mu`` the sampler's (behaviour) policy: w corrects for stale samples and for
numerical mismatch between sampler and trainer (Yao et al., 2025, "Your
efficient RL framework secretly brings you off-policy RL training"). The KL
penalty to a reference uses the k3 estimator ``exp(q) - q - 1`` with
``q = log pi_ref - log pi_theta`` (Schulman, 2020) by default; see `kl.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from rl_core.algorithms.kl import KlEstimator, kl_penalty, sampled_kl

Aggregation = Literal["token_mean", "sequence_mean", "token_sum_norm"]


class Counts(NamedTuple):
    """Normalisers of a whole (mini-)batch, passed to each of its micro-batches.

    A loss reduced with the batch's counts is a sum over rows, so summing it
    over micro-batches gives exactly the full-batch loss (gradient accumulation
    changes nothing but the order of float additions).
    """

    tokens: jax.Array  # [] float: masked tokens in the batch (>= 1)
    sequences: jax.Array  # [] float: rows with any masked token (>= 1)
    # Masked tokens sampled with the trainer's own weights / with older ones (may be 0);
    # None when the batch does not say (no ``lag``).
    fresh_tokens: jax.Array | None = None
    lagged_tokens: jax.Array | None = None

    @classmethod
    def of(cls, mask: jax.Array, lag: jax.Array | None = None) -> Counts:  # [B, T] each
        mask = mask.astype(jnp.float32)
        fresh = lagged = None
        if lag is not None:
            lagged = (mask * (lag > 0)).sum()
            fresh = mask.sum() - lagged
        return cls(
            tokens=jnp.maximum(mask.sum(), 1.0),
            sequences=jnp.maximum((mask.sum(axis=1) > 0).sum().astype(jnp.float32), 1.0),
            fresh_tokens=fresh,
            lagged_tokens=lagged,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class GrpoConfig:
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # None: symmetric, = clip_eps
    kl_coef: float = 0.0
    kl_estimator: KlEstimator = "k3"
    entropy_coef: float = 0.0
    # None: the bonus rewards entropy everywhere. A number: only a token whose
    # distribution has less entropy than this (nats) is pushed up, to it; a
    # sharper policy than the floor is still free to form elsewhere.
    entropy_floor: float | None = None
    aggregation: Aggregation = "token_mean"
    importance_correction: Literal["none", "truncated"] = "truncated"
    importance_cap: float = 2.0
    # token_sum_norm divides the token sum by (sequences x norm_tokens), a
    # constant per run (Dr.GRPO): the generation budget of one episode.
    norm_tokens: int = 512


Baseline = Literal["group", "batch"]


def _baseline_axes(baseline: Baseline) -> tuple[int, ...]:
    if baseline == "group":
        return (1,)
    if baseline == "batch":
        return (0, 1)
    raise ValueError(f"unknown baseline {baseline!r}")


@functools.partial(jax.jit, static_argnames="baseline")
def group_advantages(
    rewards: jax.Array,  # [G, K]
    valid: jax.Array,  # [G, K] bool: the episode is in the batch (not dropped)
    scale: bool | jax.Array = True,
    eps: float = 1e-6,
    baseline: Baseline = "group",
) -> jax.Array:  # [G, K]; 0 where not valid
    """A = (R - mean R) [/ (std R + eps)], over the valid episodes of each group.

    ``baseline="batch"`` takes the mean (and std) over every valid episode of the
    batch instead (REINFORCE++'s global normalisation, Hu 2025): a group whose
    members all earned the same still gets a signal, negative when the batch did
    better. GRPO's group mean gives such a group none, which lets a policy that
    answers one input wrongly with certainty stay there (see `turn_advantages`).
    """
    axes = _baseline_axes(baseline)
    valid_f = valid.astype(jnp.float32)
    count = jnp.maximum(valid_f.sum(axis=axes, keepdims=True), 1.0)
    mean = (rewards * valid_f).sum(axis=axes, keepdims=True) / count
    centred = (rewards - mean) * valid_f
    std = jnp.sqrt((centred**2).sum(axis=axes, keepdims=True) / count)
    return jnp.where(scale, centred / (std + eps), centred) * valid_f


@functools.partial(jax.jit, static_argnames="baseline")
def turn_advantages(
    rewards: jax.Array,  # [G, K, T] the reward of each member's turn t (0 past its end)
    reached: jax.Array,  # [G, K, T] bool: the member took turn t and is in the batch
    scale: bool | jax.Array = True,
    eps: float = 1e-6,
    baseline: Baseline = "group",
    gamma: float = 1.0,
) -> jax.Array:  # [G, K, T]; 0 where not reached
    """Turn-level GRPO: each turn's return-to-go against the group's at the same turn.

    ``G_t = sum_{j >= t} gamma^(j - t) r_j`` (what turn t and the turns after it
    earned; a turn is not credited with rewards that came before it; ``gamma`` < 1
    credits it less with the later turns', which in a game whose turns do not
    change what comes after are noise: 0 credits each turn with its own reward), and
    ``A_t = (G_t - mean_group G_t) [/ (std_group G_t + eps)]`` over the members
    that reached turn t. Every member of a group starts from the same
    environment seed, so the mean is a per-turn baseline: the estimate stays
    unbiased, and a turn's tokens are no longer credited with the luck of the
    turns before it. With one turn this is `group_advantages`.

    ``baseline="batch"``: the mean (and std) at turn t over every member of every
    group that reached it. Still unbiased (the baseline does not depend on the
    action), noisier, and it does not go silent when a whole group answers a turn
    the same way: with the group's mean, a policy that maps one observation to a
    wrong answer with near certainty gets zero advantage on it and never leaves.
    """
    axes = _baseline_axes(baseline)
    reached_f = reached.astype(jnp.float32)
    earned = rewards * reached_f
    offset = jnp.arange(earned.shape[-1])
    later = offset[None, :] - offset[:, None]  # [t, j]: j - t
    discount = jnp.where(later >= 0, jnp.power(gamma, jnp.maximum(later, 0)), 0.0)
    togo = jnp.einsum("gkj,tj->gkt", earned, discount)
    count = jnp.maximum(reached_f.sum(axis=axes, keepdims=True), 1.0)  # [G|1, 1, T]
    mean = (togo * reached_f).sum(axis=axes, keepdims=True) / count
    centred = (togo - mean) * reached_f
    std = jnp.sqrt((centred**2).sum(axis=axes, keepdims=True) / count)
    return jnp.where(scale, centred / (std + eps), centred) * reached_f


def token_logprobs(
    logits: jax.Array,  # [B, T, V] float32
    targets: jax.Array,  # [B, T] int
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:  # logprobs [B, T], entropy [B, T]
    """log pi(target) and the entropy of pi, with pi = softmax(logits / temperature)."""
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
    chosen = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(logp) * logp).sum(axis=-1)
    return chosen, entropy


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    mode: Aggregation,
    norm_tokens: int,
    counts: Counts | None = None,
    sequence_weights: jax.Array | None = None,
) -> jax.Array:
    """Reduce a [B, T] per-token quantity over the masked tokens to a scalar.

    token_mean: sum / tokens (DAPO). sequence_mean: each sequence's token mean,
    then the mean over sequences with any tokens (GRPO). token_sum_norm:
    sum / (sequences x norm_tokens) (Dr.GRPO). ``counts`` are the whole
    batch's when ``per_token`` is one micro-batch of it (default: this one's).
    ``sequence_weights`` [B, T]: rows that hold several sequences (packed; their
    ``counts`` say how many): each token weighted by 1 / its own sequence's masked
    tokens, for sequence_mean.
    """
    mask = mask.astype(per_token.dtype)
    counts = Counts.of(mask) if counts is None else counts
    total = (per_token * mask).sum()
    if mode == "token_mean":
        return total / counts.tokens
    if mode == "sequence_mean":
        if sequence_weights is not None:
            return (per_token * mask * sequence_weights).sum() / counts.sequences
        seq_mean = (per_token * mask).sum(axis=1) / jnp.maximum(mask.sum(axis=1), 1.0)
        return seq_mean.sum() / counts.sequences
    if mode == "token_sum_norm":
        return total / (counts.sequences * norm_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def policy_loss(
    logprobs: jax.Array,  # [B, T] current policy, differentiable
    old_logprobs: jax.Array,  # [B, T] trainer policy at the start of the step
    behaviour_logprobs: jax.Array,  # [B, T] sampler's logprobs
    advantages: jax.Array,  # [B] per sequence (GRPO) or [B, T] per token (PPO)
    mask: jax.Array,  # [B, T] 1 on model-produced tokens
    entropy: jax.Array,  # [B, T]
    config: GrpoConfig,
    ref_logprobs: jax.Array | None = None,  # [B, T] reference policy, needed if kl_coef > 0
    counts: Counts | None = None,  # the whole batch's, when this is one micro-batch
    lag: jax.Array | None = None,  # [B, T] policy versions between sampler and trainer
    sequence_weights: jax.Array | None = None,  # [B, T] packed rows (`aggregate`)
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped, importance-corrected policy-gradient loss and its diagnostics.

    Metrics are token means over the batch (``counts``), so they too add up
    over micro-batches. ``pg_loss`` is the surrogate term alone.
    """
    mask_f = mask.astype(jnp.float32)
    counts = Counts.of(mask_f, lag) if counts is None else counts
    old = jax.lax.stop_gradient(old_logprobs)
    adv = advantages[:, None] if advantages.ndim == 1 else advantages
    ratio = jnp.exp(logprobs - old)
    eps_low = config.clip_eps
    eps_high = config.clip_eps if config.clip_eps_high is None else config.clip_eps_high
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    surrogate = jnp.minimum(ratio * adv, clipped * adv)
    # The sampler's logprobs are 0 off the mask; the where keeps exp() tame there.
    log_w = jnp.where(mask > 0, old - behaviour_logprobs, 0.0)
    if config.importance_correction == "truncated":
        weight = jnp.minimum(jnp.exp(log_w), config.importance_cap)
    else:
        weight = jnp.ones_like(log_w)
    pg_token = -surrogate * jax.lax.stop_gradient(weight)
    per_token = pg_token

    if ref_logprobs is not None and config.kl_coef > 0:
        kl_tok = kl_penalty(logprobs, jax.lax.stop_gradient(ref_logprobs), config.kl_estimator)
        per_token = per_token + config.kl_coef * kl_tok
    else:
        kl_tok = jnp.zeros_like(logprobs)
    if config.entropy_coef > 0:
        floor = config.entropy_floor
        bonus = entropy if floor is None else jnp.minimum(entropy, floor)
        per_token = per_token - config.entropy_coef * bonus

    def reduce(x: jax.Array) -> jax.Array:
        return aggregate(
            x, mask_f, config.aggregation, config.norm_tokens, counts, sequence_weights
        )

    loss = reduce(per_token)

    def token_mean(x: jax.Array) -> jax.Array:
        return (x * mask_f).sum() / counts.tokens

    was_clipped = (ratio * adv != surrogate) & (mask > 0)  # the clipped branch was taken
    # KL(mu || pi_old) on the sampled tokens: the sampler/trainer mismatch (0 off the mask).
    mismatch = sampled_kl(
        jnp.where(mask > 0, old, 0.0), jnp.where(mask > 0, behaviour_logprobs, 0.0)
    )
    metrics = {
        "loss": loss,
        "pg_loss": reduce(jax.lax.stop_gradient(pg_token)),
        "clip_frac": token_mean(was_clipped.astype(jnp.float32)),
        "entropy": token_mean(entropy),
        "kl": token_mean(kl_tok),
        "mismatch_kl": token_mean(mismatch),
        # The worst single token: a mean hides the few tokens where the two disagree.
        # Reduced by max over micro- and mini-batches (the ``_max`` suffix).
        "mismatch_max": jnp.max(jnp.where(mask > 0, jnp.abs(old - behaviour_logprobs), 0.0)),
        "importance_weight": token_mean(weight),
        "ratio": token_mean(ratio),
    }
    if lag is not None:
        metrics |= mismatch_by_lag(old, behaviour_logprobs, mismatch, mask_f, lag, counts)
    return loss, metrics


def mismatch_by_lag(
    old: jax.Array,  # [B, T] the trainer's logprobs at the step's start
    behaviour: jax.Array,  # [B, T] the sampler's
    mismatch: jax.Array,  # [B, T] KL(mu || pi_old) per sampled token
    mask: jax.Array,  # [B, T] float
    lag: jax.Array,  # [B, T] policy versions between sampler and trainer
    counts: Counts,
) -> dict[str, jax.Array]:
    """``mismatch_kl`` / ``mismatch_max`` split by what they measure (docs/learning.md).

    ``mismatch/engine_*``: tokens the sampler drew with the weights the trainer holds
    (lag 0), so any gap is the engine's own (kernels, precision, a stale weight copy).
    ``mismatch/lagged_*``: tokens drawn with older weights (async runs), where the gap is
    the policy's lag plus that disagreement. A split with no tokens is NaN, which the
    metric pipes leave out rather than report as a perfect 0."""
    assert counts.fresh_tokens is not None and counts.lagged_tokens is not None
    fresh = mask * (lag == 0)
    lagged = mask * (lag > 0)
    gap = jnp.abs(old - behaviour)

    def mean(x: jax.Array, where: jax.Array, n: jax.Array) -> jax.Array:
        return jnp.where(n > 0, (x * where).sum() / jnp.maximum(n, 1.0), jnp.nan)

    def worst(where: jax.Array, n: jax.Array) -> jax.Array:
        return jnp.where(n > 0, jnp.max(jnp.where(where > 0, gap, 0.0)), jnp.nan)

    return {
        "mismatch/engine_kl": mean(mismatch, fresh, counts.fresh_tokens),
        "mismatch/engine_max": worst(fresh, counts.fresh_tokens),
        "mismatch/lagged_kl": mean(mismatch, lagged, counts.lagged_tokens),
        "mismatch/lagged_max": worst(lagged, counts.lagged_tokens),
        "mismatch/lagged_token_frac": lagged.sum() / counts.tokens,
        "mismatch/lag_mean": (lag * mask).sum() / counts.tokens,
    }
