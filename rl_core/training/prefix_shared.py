"""Prefix-shared training: a GRPO group's shared prompt computed once, its members' answers
attending to its keys and values.

The G members of a group start from one prompt; the plain loss runs that prompt through
every layer G times, forward and backward. Here a micro-batch carries each block of rows
that share a prompt (a group, or the part of one that fell in this micro-batch) as one
prefix row ``[N, P]`` and its rows as suffixes ``[R, S]`` that start where the prefix ends.
The prefix is run once into a `KVCache` (the engine's prefill, differentiable: the cache is
plain arrays written by ``dynamic_update_slice``); each row gathers its block's keys and
values and runs its suffix against them as the engine's decode would, at positions
continuing from the prefix's length. A query therefore sees exactly the keys the unshared
forward shows it, computed from the same tokens at the same positions, so the hidden
states are the unshared ones up to float32 reordering. The gradient reaching a prefix's
keys and values is the sum of its rows' (the gather's transpose adds them), and flows on
through the prefix's layers once.

Where the suffix starts: the host (`rl_core.training.prefix_layout`) sets a block's prefix
length ``p`` to at most its rows' common prefix and at most the first position any of them
trains on (``mask`` aligned with ``tokens[1:]``). Position ``p`` itself, the last prompt
token whose hidden state predicts the first trained token, is the suffix's first input, so
each row computes that one hidden state itself: no hidden state crosses the boundary, only
keys and values, and no trained position's logprob comes from the prefix pass. A row's
``[R, S]`` arrays are its ``[T-1]`` ones from position ``p`` on (`take`); a prefix of
length 0 makes the row's suffix its whole sequence, the plain forward. (Dynamic NTK
RoPE rescales by the largest position in a call, padding included, on either path; past
the model's ``max_seq_len`` the two paths' padded positions differ, and so may they.)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rl_core.models.kv_cache import KVCache


class SharedPrefix(NamedTuple):
    """The prefixes of one (micro-)batch and which one each row continues."""

    tokens: jax.Array  # [N, P] int32: each block's shared tokens, right-padded
    lengths: jax.Array  # [N] int32: real length (0: a padding slot)
    owner: jax.Array  # [R] int32: the prefix each row continues, an index into N


def shared_hidden(
    model: Any,  # a `Model`, or one `train_step.policy_model` wrapped
    prefix: SharedPrefix,
    inputs: jax.Array,  # [R, S] each row's tokens from its prefix's length on
    *,
    remat: bool = False,  # each block recomputed in the backward (`Model.hidden`)
) -> jax.Array:  # final-normed states [R, S, D]
    """The hidden states of each row's suffix, attending to its prefix's keys and values.

    Equal to ``model.hidden`` over each row's whole sequence at the suffix's positions;
    padding past a row's end (right) and past a prefix's length (masked: a query sees
    slots below its own, and the suffix overwrites the prefix's padding from its length
    on) changes nothing a real query sees.
    """
    n, p = prefix.tokens.shape
    s = inputs.shape[1]
    # The prefill's final hidden states and its last layer's MLP are unused: XLA drops them.
    _, cache = model.hidden(
        prefix.tokens,
        jnp.broadcast_to(jnp.arange(p), (n, p)),
        cache=model.init_cache(n, p),
        remat=remat,
    )
    assert cache is not None

    def per_row(kv: jax.Array) -> jax.Array:  # [N, Hkv, P, Dh] -> [R, Hkv, P + S, Dh]
        return jnp.pad(kv[prefix.owner], ((0, 0), (0, 0), (0, s), (0, 0)))

    start = prefix.lengths[prefix.owner]  # [R]: where each suffix's keys go
    rows = KVCache(tuple(map(per_row, cache.keys)), tuple(map(per_row, cache.values)), start)
    at = start[:, None] + jnp.arange(s)[None, :]
    h: jax.Array = model.hidden(inputs, at, cache=rows, remat=remat)[0]
    return h


def take(
    x: jax.Array,  # [B] per row, or [B, L, ...] per position
    rows: jax.Array,  # [R] int32: the batch row of each slot (-1: padding, zeros)
    offsets: jax.Array,  # [R] int32: where each slot's span starts
    width: int,  # positions per span
) -> jax.Array:  # [R] or [R, width, ...]
    """Each slot's ``x[row, offset : offset + width]`` (zeros past the row's end and on
    padding slots); a per-row ``x`` [B] gives each slot its row's value."""
    real = rows >= 0
    row = jnp.maximum(rows, 0)
    if x.ndim == 1:
        return jnp.where(real, x[row], jnp.zeros((), x.dtype))
    cols = offsets[:, None] + jnp.arange(width)[None, :]  # [R, width]
    picked = x[row[:, None], jnp.minimum(cols, x.shape[1] - 1)]  # [R, width, ...]
    keep = real[:, None] & (cols < x.shape[1])
    return jnp.where(keep.reshape(*keep.shape, *[1] * (x.ndim - 2)), picked, 0).astype(x.dtype)


def scatter(
    spans: jax.Array,  # [R, S, ...] each slot's values from its offset on
    rows: jax.Array,  # [R] int32 (-1: padding, dropped)
    offsets: jax.Array,  # [R] int32
    length: int,  # L: positions of the row layout
    out: jax.Array,  # [B, L, ...] the row layout to write into
) -> jax.Array:  # [B, L, ...]: ``out`` with the spans written; what they do not cover kept
    """The inverse of `take` for one positional leaf (scored logprobs back to rows)."""
    b = out.shape[0]
    cols = offsets[:, None] + jnp.arange(spans.shape[1])[None, :]  # [R, S]
    target = jnp.where(rows[:, None] >= 0, rows[:, None], b)  # padding: out of range
    target = jnp.where(cols < length, target, b)
    return out.at[target, cols].set(spans.astype(out.dtype), mode="drop")


__all__ = ["SharedPrefix", "scatter", "shared_hidden", "take"]
