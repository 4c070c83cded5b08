"""Token sampling as a pure function: penalties, a grammar's mask, temperature, top-k, top-p,
the sampled logprob and the most likely alternatives.

The order is the one OpenAI-compatible servers apply (vLLM among them): the penalties change
the logits, the grammar's mask cuts what it forbids, then temperature, top-k and top-p shape
what is left. The logprob recorded for a token is under that final distribution, the one it
was drawn from: the behaviour policy the trainer's importance weight divides by.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

# The alternatives computed per token when any row asks for them; OpenAI caps
# ``top_logprobs`` at 20, and one compiled width serves every request (the host slices).
TOP_LOGPROBS = 20


class Controls(NamedTuple):
    """Each row's sampling controls, traced: a new value never recompiles."""

    temperature: jax.Array  # [B] float32; <= 0 means greedy
    top_k: jax.Array  # [B] int32; 0 means off
    top_p: jax.Array  # [B] float32 in (0, 1]
    frequency: jax.Array  # [B] float32: OpenAI's frequency_penalty (0: off)
    presence: jax.Array  # [B] float32: OpenAI's presence_penalty (0: off)
    constrained: jax.Array  # [B] bool: the row's grammar mask applies
    allowed: jax.Array  # [B, ceil(V / 32)] int32: bit v % 32 of word v // 32 allows token v
    top: jax.Array  # [B] bool: the row wants its top alternatives


class Sampled(NamedTuple):
    token: jax.Array  # [B] int32
    logprob: jax.Array  # [B] float32; 0 where greedy
    # [B, min(TOP_LOGPROBS, V)], most likely first; zeros and -inf when no row asked.
    top_ids: jax.Array  # int32
    top_logprobs: jax.Array  # float32; -inf for tokens that cannot be drawn


def filter_logits(
    logits: jax.Array,  # [B, V] float32
    temperature: jax.Array,  # [B]; <= 0 means greedy
    top_k: jax.Array,  # [B] int; 0 means off
    top_p: jax.Array,  # [B] in (0, 1]
) -> jax.Array:  # [B, V] log-probabilities of the sampling distribution (-inf where cut)
    """The distribution a token is actually drawn from.

    Logits are divided by the temperature, then everything below the k-th
    largest is cut (ties at the threshold are kept), then the smallest set of
    tokens whose probability reaches ``top_p`` is kept (Holtzman et al., 2019).
    The parameters are traced arrays, so changing them never recompiles. When no row
    filters, the sort over the vocabulary (most of a small model's sampling time) is
    skipped at run time.
    """
    temp = jnp.where(temperature > 0, temperature, 1.0)[:, None]
    scaled = logits / temp
    filtering = jnp.any((top_k > 0) | (top_p < 1.0))
    out: jax.Array = jax.lax.cond(
        filtering,
        lambda s: _top_k_top_p(s, top_k, top_p),
        lambda s: jax.nn.log_softmax(s, axis=-1),
        scaled,
    )
    return out


def _top_k_top_p(
    scaled: jax.Array,  # [B, V] temperature-scaled logits
    top_k: jax.Array,  # [B]
    top_p: jax.Array,  # [B]
) -> jax.Array:  # [B, V] log-probabilities, -inf where cut
    vocab = scaled.shape[-1]
    desc = -jnp.sort(-scaled, axis=-1)  # [B, V], largest first
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(desc, (k - 1)[:, None], axis=-1)  # [B, 1]
    scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
    desc = jnp.where(desc >= kth, desc, -jnp.inf)
    probs = jax.nn.softmax(desc, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each sorted token
    # The first token is always kept; top_p 1 keeps all even where the cumsum rounds to 1.
    keep = (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    cutoff = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)  # [B, 1]
    scaled = jnp.where(scaled >= cutoff, scaled, -jnp.inf)
    return jax.nn.log_softmax(scaled, axis=-1)


def draw(keys: jax.Array, logp: jax.Array) -> jax.Array:  # [B] keys, [B, V] -> [B] int32
    """One token per row from ``softmax(logp)``, exactly, with about 2·sqrt(V) random numbers.

    Gumbel-max over the whole vocabulary (`jax.random.categorical`) needs V random numbers
    per row, and on a CPU generating them was most of a decode step's sampling time. Here a
    block of the vocabulary is drawn by its total probability, then a token within the
    block by its own: P(block) · P(token | block) = P(token), so the law is unchanged.
    """
    b, v = logp.shape
    size = 1 << max(0, math.ceil(math.log2(math.sqrt(v))))  # block size, a power of two
    n_blocks = -(-v // size)
    padded = jnp.pad(logp, ((0, 0), (0, n_blocks * size - v)), constant_values=-jnp.inf)
    blocks = padded.reshape(b, n_blocks, size)
    block_logp = jax.nn.logsumexp(blocks, axis=-1)  # [B, n_blocks]; -inf where all are cut
    pair = jax.vmap(lambda k: jax.random.split(k, 2))(keys)  # [B, 2]
    block = jax.vmap(jax.random.categorical)(pair[:, 0], block_logp)  # [B]
    inside = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]  # [B, size]
    offset = jax.vmap(jax.random.categorical)(pair[:, 1], inside)  # [B]
    return (block * size + offset).astype(jnp.int32)


def argmax(logits: jax.Array) -> jax.Array:  # [B, V] -> [B] int32, the first maximum
    """`jnp.argmax` as two plain reductions: XLA's CPU argmax (one reduction over value and
    index pairs) took 1.8 ms over a [16, 49152] batch, these two 0.4 ms."""
    top = jnp.max(logits, axis=-1, keepdims=True)
    index = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(logits == top, index, logits.shape[-1]), axis=-1)


def penalise(
    logits: jax.Array,  # [B, V]
    seen: jax.Array,  # [B, V] int32: times each token was sampled so far in the row's completion
    frequency: jax.Array,  # [B]
    presence: jax.Array,  # [B]
) -> jax.Array:  # [B, V]
    """OpenAI's penalties: ``logit - frequency * count - presence * (count > 0)``.

    Skipped at run time when no row has one: a batch without penalties pays one test.
    """

    def apply(x: jax.Array) -> jax.Array:
        count = seen.astype(x.dtype)
        return x - frequency[:, None] * count - presence[:, None] * (count > 0)

    out: jax.Array = jax.lax.cond(
        jnp.any((frequency != 0) | (presence != 0)), apply, lambda x: x, logits
    )
    return out


def unpack_bitmask(allowed: jax.Array, vocab: int) -> jax.Array:  # [B, W] int32 -> [B, V] bool
    """llguidance's token bitmask as booleans; tokens past its words are not allowed."""
    bits = (allowed[:, :, None] >> jnp.arange(32, dtype=allowed.dtype)) & 1  # [B, W, 32]
    flat = bits.reshape(allowed.shape[0], -1).astype(bool)
    if flat.shape[1] >= vocab:
        return flat[:, :vocab]
    return jnp.pad(flat, ((0, 0), (0, vocab - flat.shape[1])))


def constrain(
    logits: jax.Array,  # [B, V]
    constrained: jax.Array,  # [B] bool
    allowed: jax.Array,  # [B, W] int32 bitmask
) -> jax.Array:  # [B, V], -inf where a grammar forbids the token
    """Cut what each constrained row's grammar forbids; skipped when no row is constrained."""

    def apply(x: jax.Array) -> jax.Array:
        ok = unpack_bitmask(allowed, x.shape[-1]) | ~constrained[:, None]
        return jnp.where(ok, x, -jnp.inf)

    out: jax.Array = jax.lax.cond(jnp.any(constrained), apply, lambda x: x, logits)
    return out


def sample(
    logits: jax.Array,  # [B, V]
    keys: jax.Array,  # [B] PRNG keys
    controls: Controls,
    seen: jax.Array | None = None,  # [B, V] int32 token counts; None: no token sampled yet
) -> Sampled:
    """Greedy rows take the argmax, the others a draw from the filtered distribution.

    A batch that is all greedy (evaluation) skips the distribution: each pass over the
    vocabulary costs about a millisecond of a decode step on a CPU. The top alternatives
    are computed only when a row asks for them; a greedy row's are those of its
    penalised, masked distribution at temperature 1 (its own is a point mass), so the
    first is the token taken.
    """
    c = controls
    if seen is not None:
        logits = penalise(logits, seen, c.frequency, c.presence)
    logits = constrain(logits, c.constrained, c.allowed)
    greedy = c.temperature <= 0
    token, logprob, dist = jax.lax.cond(
        jnp.all(greedy),
        lambda: (argmax(logits), jnp.zeros(greedy.shape, jnp.float32), logits),
        lambda: _sample_mixed(logits, keys, c),
    )
    top_ids, top_lps = jax.lax.cond(jnp.any(c.top), _top, _no_top, dist, greedy, logits)
    return Sampled(token, logprob, top_ids, top_lps)


def _sample_mixed(
    logits: jax.Array,  # [B, V] penalised and masked
    keys: jax.Array,  # [B]
    c: Controls,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # tokens [B], logprobs [B], the distribution
    logp = filter_logits(logits, c.temperature, c.top_k, c.top_p)
    greedy = c.temperature <= 0
    tokens = jnp.where(greedy, argmax(logits), draw(keys, logp))
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, jnp.where(greedy, 0.0, chosen).astype(jnp.float32), logp


def _top(
    dist: jax.Array,  # [B, V] the sampled rows' log-probabilities (greedy rows: ignored)
    greedy: jax.Array,  # [B]
    logits: jax.Array,  # [B, V] penalised and masked
) -> tuple[jax.Array, jax.Array]:
    logp = jnp.where(greedy[:, None], jax.nn.log_softmax(logits, axis=-1), dist)
    values, ids = top_k(logp, min(TOP_LOGPROBS, logp.shape[-1]))
    return ids, values.astype(jnp.float32)


def top_k(
    x: jax.Array,  # [B, V]
    k: int,
    block: int = 256,
) -> tuple[jax.Array, jax.Array]:  # values [B, k] largest first, ids [B, k] int32
    """`jax.lax.top_k` without sorting the whole vocabulary.

    XLA's CPU top-k sorts each row: over SmolLM2's 49,152 tokens it halved a tiny model's
    decode rate (bench C1). The k largest values lie in at most k blocks, and those blocks
    are among the k with the largest maxima (a block holding one of them has a maximum at
    least as large as the k-th value, and each such maximum is itself one of the k largest);
    so the top k of those k blocks is the top k of the row. Among equal values the lower
    index comes first, as in `argmax`.
    """
    b, v = x.shape
    n_blocks = -(-v // block)
    if n_blocks <= 4 * k:  # a small vocabulary: the plain sort is as cheap
        values, ids = jax.lax.top_k(x, k)
        return values, ids.astype(jnp.int32)
    padded = jnp.pad(x, ((0, 0), (0, n_blocks * block - v)), constant_values=-jnp.inf)
    blocks = padded.reshape(b, n_blocks, block)
    _, best = jax.lax.top_k(blocks.max(axis=-1), k)  # [B, k] block indices, larger max first
    best = jnp.sort(best, axis=-1)  # index order: ties resolve to the lower token id
    picked = jnp.take_along_axis(blocks, best[:, :, None], axis=1).reshape(b, k * block)
    values, at = jax.lax.top_k(picked, k)
    ids = jnp.take_along_axis(best, at // block, axis=1) * block + at % block
    return values, ids.astype(jnp.int32)


def _no_top(dist: jax.Array, greedy: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    shape = (dist.shape[0], min(TOP_LOGPROBS, dist.shape[-1]))
    return jnp.zeros(shape, jnp.int32), jnp.full(shape, -jnp.inf, jnp.float32)


def no_controls(temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, vocab: int) -> Controls:
    """Controls of plain sampling (no penalties, grammar or alternatives): tests, scripts."""
    b = temperature.shape[0]
    return Controls(
        temperature=jnp.asarray(temperature, jnp.float32),
        top_k=jnp.asarray(top_k, jnp.int32),
        top_p=jnp.asarray(top_p, jnp.float32),
        frequency=jnp.zeros((b,), jnp.float32),
        presence=jnp.zeros((b,), jnp.float32),
        constrained=jnp.zeros((b,), bool),
        allowed=jnp.zeros((b, -(-vocab // 32)), jnp.int32),
        top=jnp.zeros((b,), bool),
    )
