"""Tinker's built-in losses, token by token, as pure functions of arrays.

Each returns the loss of every position ([B, T]); Tinker's loss is their sum over the
datum's tokens (no mean: a client scales its advantages for another aggregation). With
``lp`` the trainer's log-probability of each target token (p_theta), ``q`` the sampler's
(``loss_fn_inputs.logprobs``), ``A`` the advantages and ``r = exp(lp - q)``:

- ``importance_sampling``: ``-r A``
- ``ppo`` (Schulman et al., 2017): ``-min(r A, clip(r, lo, hi) A)``
- ``cispo`` (MiniMax-M1, arXiv:2506.13585): ``-sg(clip(r, lo, hi)) lp A``
- ``dro`` (Richemond et al., arXiv:2405.19107): ``-(lp A - beta/2 (lp - q)^2)``
- ``gspo`` (GSPO-token, arXiv:2507.18071): the sequence ratio
  ``s = exp(mean over the datum's marked t of (sg(lp_t) - q_t))`` carried by every token
  with its own gradient, ``s_t = s exp(lp_t - sg(lp_t))``, then ``-min(s_t A, clip(s_t, lo, hi) A)``

(sg: stop-gradient; lo and hi are ``clip_low_threshold`` and ``clip_high_threshold``,
bounds on the ratio itself; ``beta`` is DRO's). What each reads and its defaults are in
`rl_core.protocol.tinker_losses`. The config values arrive as [B, T] arrays beside the
datum's own inputs, so calls of several models with different configs share one batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core.protocol.tinker_losses import BETA, CLIP_HIGH, CLIP_LOW

Batch = dict[str, jax.Array]  # each [B, T]


def _ratio(lp: jax.Array, q: jax.Array) -> jax.Array:
    return jnp.exp(lp - q)


def _clipped_objective(ratio: jax.Array, adv: jax.Array, lo: jax.Array, hi: jax.Array) -> jax.Array:
    return -jnp.minimum(ratio * adv, jnp.clip(ratio, lo, hi) * adv)


def importance_sampling(lp: jax.Array, b: Batch) -> jax.Array:
    return -_ratio(lp, b["logprobs"]) * b["advantages"]


def ppo(lp: jax.Array, b: Batch) -> jax.Array:
    return _clipped_objective(_ratio(lp, b["logprobs"]), b["advantages"], b[CLIP_LOW], b[CLIP_HIGH])


def cispo(lp: jax.Array, b: Batch) -> jax.Array:
    weight = jax.lax.stop_gradient(jnp.clip(_ratio(lp, b["logprobs"]), b[CLIP_LOW], b[CLIP_HIGH]))
    return -weight * lp * b["advantages"]


def dro(lp: jax.Array, b: Batch) -> jax.Array:
    return -(lp * b["advantages"] - 0.5 * b[BETA] * (lp - b["logprobs"]) ** 2)


def sequence_sums(x: jax.Array, b: Batch) -> jax.Array:  # [B, T] -> [B, T] or [B, 1]
    """Each position's sum of ``x`` over its own datum: over the row ([B, 1]), or, where
    the batch packs several datums into a row (``segments`` [B, T], -1 at padding), over
    the positions of the same segment ([B, T]). Padding reads segment 0's sum; the
    caller's mask zeroes its loss."""
    segments = b.get("segments")
    if segments is None:
        return jnp.sum(x, axis=-1, keepdims=True)
    rows, length = x.shape
    ids = jnp.arange(rows)[:, None] * length + jnp.maximum(segments, 0)  # [B, T]
    sums = jax.ops.segment_sum(x.reshape(-1), ids.reshape(-1), num_segments=rows * length)
    return sums[ids]


def gspo(lp: jax.Array, b: Batch) -> jax.Array:
    marked = (b["sequence_ratio_mask"] != 0).astype(lp.dtype) * b["mask"]  # [B, T]
    count = jnp.maximum(sequence_sums(marked, b), 1.0)
    held = jax.lax.stop_gradient(lp)
    log_s = sequence_sums(marked * (held - b["logprobs"]), b) / count
    ratio = jnp.exp(log_s + lp - held)  # s's value, lp's gradient
    return _clipped_objective(ratio, b["advantages"], b[CLIP_LOW], b[CLIP_HIGH])


def cross_entropy(lp: jax.Array, b: Batch) -> jax.Array:
    return -b["weights"] * lp


PER_TOKEN = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
    "gspo": gspo,
}

__all__ = [
    "PER_TOKEN",
    "cispo",
    "cross_entropy",
    "dro",
    "gspo",
    "importance_sampling",
    "ppo",
    "sequence_sums",
]
