"""The output head at the trained positions only: log pi and entropy where the loss reads them.

The loss reads log pi(target) and the entropy only where the loss mask is set (the model's
own tokens); the prompt, the environment's observations and the padding contribute
nothing, yet the head's [D, V] matmul (49k columns for SmolLM2, about a fifth of a
small model's FLOPs per position) ran at all of them. Here, before the jitted step, each
row's positions whose mask is set are listed (`trained_positions`), left-packed and padded
with -1 to a bucketed width K, so a run compiles a few widths, not one per batch. Inside the jit the
trunk still runs over every position (attention needs them), then `gathered_token_logprobs`
takes the K hidden states of each row, runs the head on those only (in chunks, as
`rl_core.training.chunked_logits` does, when asked) and writes the two numbers back to
the row layout [B, L], 0 at every other position. The loss, its counts and its metrics
multiply by the mask, so they read the same numbers as the all-positions path; a gradient
reaches the trunk's states at the trained positions only, as it did (the others' was 0).

Per row, not flat over the batch: a micro-batch or a mini-batch is a slice of rows, so the
[B, K] index is sliced with every other [B, ...] array and no per-slice index is rebuilt.
The price is the spread of trained counts between rows (K is the longest row's, bucketed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rl_core.algorithms.grpo import token_logprobs
from rl_core.models.buckets import next_bucket
from rl_core.training.chunked_logits import Head, chunked_token_logprobs

# Narrowest index: a run whose rows train on a few tokens still compiles one width.
MIN_POSITIONS = 16


def trained_positions(
    mask: jax.Array | np.ndarray,  # [B, L] the loss mask, aligned with the targets
    minimum: int = MIN_POSITIONS,
) -> jax.Array:  # [B, K] int32: each row's trained positions in order, then -1
    """K is the most trained positions of any row, rounded up to a power of two (at least
    ``minimum``) and at most L: a row of L trained positions is indexed whole.

    Computed where the mask is: a batch whose rows are spread over a multi-process
    trainer's processes (`rl_core.training.spmd`) is never gathered on one host. Its K,
    a replicated scalar, is the same in every process, so they all run one program."""
    most = int(_most_trained(mask))
    positions: jax.Array = _packed(mask, index_width(most, mask.shape[1], minimum))
    return positions


def index_width(most: int, length: int, minimum: int = MIN_POSITIONS) -> int:
    """K for rows of ``length`` targets whose fullest trains ``most``: `trained_positions`'
    width, computed where the host plans a step (packing's bins, the shape ledger)."""
    return int(min(next_bucket(most, minimum), length))


@jax.jit
def _most_trained(mask: jax.Array) -> jax.Array:  # [B, L] -> []
    return (mask > 0).sum(axis=1).max()


@functools.partial(jax.jit, static_argnums=1)
def _packed(mask: jax.Array, k: int) -> jax.Array:  # [B, L] -> [B, K]
    trained = mask > 0
    # A stable sort on "not trained" puts each row's trained positions first, in order.
    order = jnp.argsort((~trained).astype(jnp.int32), axis=1, stable=True)[:, :k]
    counts = trained.sum(axis=1)
    return jnp.where(jnp.arange(k)[None, :] < counts[:, None], order, -1).astype(jnp.int32)


def gathered_token_logprobs(
    hidden: jax.Array,  # [B, L, D] final-normed states
    targets: jax.Array,  # [B, L] int: the token each position predicts
    positions: jax.Array,  # [B, K] int: `trained_positions` (-1: none)
    head: Head,
    temperature: float,
    chunk: int | None,
) -> tuple[jax.Array, jax.Array]:  # logprobs [B, L], entropy [B, L]; 0 off ``positions``
    """`token_logprobs(head(hidden), targets)` at ``positions``, zeros elsewhere.

    ``chunk``: positions per chunk of the head over the gathered [B * K] states
    (`chunked_token_logprobs`); None: their [B, K, V] logits at once.
    """
    b, length = targets.shape
    valid = positions >= 0
    at = jnp.maximum(positions, 0)  # a padding slot reads position 0; its result is dropped
    row = jnp.arange(b)[:, None]
    h = hidden[row, at]  # [B, K, D]
    t = targets[row, at]  # [B, K]
    if chunk is None:
        lp, entropy = token_logprobs(head(h), t, temperature)
    else:
        lp, entropy = chunked_token_logprobs(h, t, head, temperature, chunk)
    # Padding slots aim past the last row, where mode="drop" discards them: no slot
    # overwrites a real position's value, whatever it indexes.
    dest = jnp.where(valid, row, b)

    def back(x: jax.Array) -> jax.Array:  # [B, K] -> [B, L]
        return jnp.zeros((b, length), jnp.float32).at[dest, at].set(x, mode="drop")

    return back(lp), back(entropy)


def shifted_positions(
    positions: jax.Array,  # [B, K] row layout (`trained_positions` of the batch)
    rows: jax.Array,  # [R] int32: the batch row in each slot (-1: padding)
    offsets: jax.Array,  # [R] int32: where each slot's span starts in its row
) -> jax.Array:  # [R, K]: each slot's trained positions within its span, then -1
    """The index of slots that hold rows from ``offsets`` on (prefix-shared suffixes,
    `rl_core.training.prefix_layout`). A suffix starts at or before its row's first
    trained position and runs past its last, so every position stays inside the span."""
    real = rows >= 0
    picked = positions[jnp.maximum(rows, 0)]  # [R, K]
    keep = real[:, None] & (picked >= 0)
    return jnp.where(keep, picked - offsets[:, None], -1).astype(jnp.int32)


__all__ = [
    "MIN_POSITIONS",
    "gathered_token_logprobs",
    "shifted_positions",
    "trained_positions",
]
