"""Per-token log pi(target) and entropy without ever holding every position's logits.

The output head is a [D, V] matmul per position. With a large vocabulary (SmolLM2:
V = 49,152 against d_model 576) the [tokens, V] float32 logits, their log-softmax and
the backward's copies are most of a train step's activation memory, and the trainer
only needs two numbers per position from them: log pi of the next token and the
entropy. Here the flattened positions are cut into chunks of a static size (the last
padded); a `jax.lax.map` computes each chunk's logits, reduces them to those two
numbers and drops them. The per-chunk function is under `jax.checkpoint`, so the
backward does not keep any chunk's logits either: it recomputes one chunk at a time
(the head's matmul again, a fraction of the trunk's work) and adds that chunk's
gradient into h and, when they are trained, the head's weights.

The numbers are the full path's (`rl_core.algorithms.grpo.token_logprobs` over
``model.logits``) up to float32 reordering: the same function runs on each chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rl_core.algorithms.grpo import token_logprobs

Head = Callable[[jax.Array], jax.Array]  # [N, D] hidden -> [N, V] float32 logits

# The trainers' default chunk: 256 saved only 96 MB more than 512 on SmolLM2 for twice
# the chunks (bench/README.md, "P1 / chunked logits").
LOGITS_CHUNK = 512


def chunked_token_logprobs(
    hidden: jax.Array,  # [..., D] final-normed states
    targets: jax.Array,  # [...] int: the token each position predicts
    head: Head,
    temperature: float,
    chunk: int,
) -> tuple[jax.Array, jax.Array]:  # logprobs [...], entropy [...]
    """`token_logprobs(head(hidden), targets, temperature)`, ``chunk`` positions at a time.

    ``head`` is the model's output projection (`Model.logits`: the tied embedding
    transposed or ``lm_head``); it may close over traced weights, whose gradients flow
    through the map. Peak memory is one chunk's [chunk, V] logits (and their
    log-softmax), not the batch's.
    """
    lp, entropy = _chunked(
        hidden, targets, lambda h, t: token_logprobs(head(h), t, temperature), chunk
    )
    return lp, entropy


def chunked_target_logprobs(
    hidden: jax.Array,  # [..., D] final-normed states
    targets: jax.Array,  # [...] int
    head: Head,
    chunk: int,
) -> jax.Array:  # log pi(target) [...], at temperature 1
    """The log-probability of each target alone, ``chunk`` positions at a time: what the
    Tinker losses read (`rl_core.training.multi_trainer`), with no entropy to compute."""

    def one(h: jax.Array, t: jax.Array) -> tuple[jax.Array]:
        logp = jax.nn.log_softmax(head(h), axis=-1)
        return (jnp.take_along_axis(logp, t[:, None], axis=-1)[:, 0],)

    (lp,) = _chunked(hidden, targets, one, chunk)
    return lp


def _chunked(
    hidden: jax.Array,  # [..., D]
    targets: jax.Array,  # [...]
    per_chunk: Callable[[jax.Array, jax.Array], tuple[jax.Array, ...]],  # [n, D], [n] -> [n]s
    chunk: int,
) -> tuple[jax.Array, ...]:  # each [...]
    if chunk < 1:
        raise ValueError(f"logits chunk must be >= 1 position, got {chunk}")
    lead, d = hidden.shape[:-1], hidden.shape[-1]
    n = math.prod(lead)
    size = min(chunk, max(n, 1))  # a batch smaller than a chunk is one chunk, unpadded
    pad = -n % size
    flat_h = jnp.pad(hidden.reshape(n, d), ((0, pad), (0, 0)))
    flat_t = jnp.pad(targets.reshape(n), (0, pad))  # padded positions predict token 0, dropped

    @jax.checkpoint
    def one(part: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, ...]:
        return per_chunk(*part)  # [size, D], [size]

    outs = jax.lax.map(one, (flat_h.reshape(-1, size, d), flat_t.reshape(-1, size)))
    return tuple(x.reshape(-1)[:n].reshape(lead) for x in outs)


__all__ = ["LOGITS_CHUNK", "Head", "chunked_target_logprobs", "chunked_token_logprobs"]
