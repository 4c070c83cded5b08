"""The jitted device programs of the built-in engine: prefill, insert, decode.

Each is compiled once per shape bucket, never per request: prompts are right-padded to
a power-of-two length, the number of rows joining at once to a power of two, and the
decode batch is a fixed number of slots over a cache of a bucketed length. Sampling
parameters, seeds and lengths are traced arrays. Programs are cached per model structure
(`programs`), so engines of the same structure share them: a second run in the process
compiles nothing.

Randomness is per request and per token: token ``i`` of a request with seed ``s`` is drawn
with ``fold_in(key(s), i)``, so a request samples the same tokens whichever slot it lands
in and whoever shares the batch.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.models.kv_cache import KVCache
from rl_core.rollout.sampling import sample

Sampling = tuple[jax.Array, jax.Array, jax.Array]  # temperature [B], top_k [B], top_p [B]


def _keys(seeds: jax.Array, counts: jax.Array) -> jax.Array:  # [B] uint32, [B] int32 -> [B]
    return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seeds, counts)


@functools.partial(jax.jit, donate_argnums=(0,))
def insert(
    cache: KVCache,  # [R, S]
    prompt: KVCache,  # [K, P], P <= S
    slots: jax.Array,  # [K] int32; R (out of range) for padding rows, which are dropped
) -> KVCache:
    """Write freshly prefilled prompts into their slots of the running batch."""
    p = prompt.length

    def put(big: jax.Array, small: jax.Array) -> jax.Array:  # [R, Hkv, S, Dh] <- [K, Hkv, P, Dh]
        return big.at[slots, :, :p].set(small.astype(big.dtype), mode="drop")

    return KVCache(
        tuple(put(b, s) for b, s in zip(cache.keys, prompt.keys, strict=True)),
        tuple(put(b, s) for b, s in zip(cache.values, prompt.values, strict=True)),
        cache.lengths.at[slots].set(prompt.lengths, mode="drop"),
    )


class Programs(NamedTuple):
    """The jitted prefill and decode of one model structure; weights go in as flat leaves."""

    prefill: Any  # (leaves, tokens, lengths, sampling, seeds) -> (prompt cache, token, logprob)
    decode: Any  # (leaves, cache, last, active, sampling, seeds, counts) -> (cache, token, logprob)


@functools.cache
def programs(graphdef: Any, treedef: Any) -> Programs:
    """Compile-once programs for a model structure, shared by every engine of that structure.

    The structure is closed over, not passed per call: hashing an NNX graph definition as a
    static argument and flattening an `nnx.State` cost about 3 ms per call on the host, a
    tenth of a small model's decode step. The engine flattens its weights once per policy.
    """

    def model_of(leaves: list[jax.Array]) -> Any:
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))

    return Programs(
        prefill=jax.jit(functools.partial(_prefill, model_of)),
        decode=jax.jit(functools.partial(_decode, model_of), donate_argnums=(1,)),
    )


def _prefill(
    model_of: Any,
    leaves: list[jax.Array],
    tokens: jax.Array,  # [K, P] int32, right-padded prompts
    lengths: jax.Array,  # [K] int32, >= 1
    sampling: Sampling,
    seeds: jax.Array,  # [K] uint32
) -> tuple[KVCache, jax.Array, jax.Array]:  # prompt cache [K, P], first token [K], logprob [K]
    model = model_of(leaves)
    k, p = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (k, p))
    valid = positions < lengths[:, None]
    h, cache = model.hidden(tokens, positions, valid=valid, cache=model.init_cache(k, p))
    assert cache is not None
    h_last = jnp.take_along_axis(h, (lengths - 1)[:, None, None], axis=1)  # [K, 1, D]
    last = model.logits(h_last)[:, 0]  # [K, V]: the head runs at each row's last token only
    token, logprob = sample(last, _keys(seeds, jnp.zeros_like(lengths)), *sampling)
    return cache, token, logprob


def _decode(
    model_of: Any,
    leaves: list[jax.Array],
    cache: KVCache,  # [R, S]
    last: jax.Array,  # [R] int32: each slot's newest token, not yet in the cache
    active: jax.Array,  # [R] bool: the slot holds a running request
    sampling: Sampling,
    seeds: jax.Array,  # [R] uint32
    counts: jax.Array,  # [R] int32: tokens the slot's request has sampled so far
) -> tuple[KVCache, jax.Array, jax.Array]:  # cache, next token [R], logprob [R]
    """One token for every slot: feed ``last`` at each row's own position, sample the next."""
    model = model_of(leaves)
    logits, cache = model(last[:, None], cache.lengths[:, None], valid=active[:, None], cache=cache)
    assert cache is not None
    token, logprob = sample(logits[:, 0], _keys(seeds, counts), *sampling)
    return cache, token, logprob
