"""The jitted device programs of the built-in engine: prefill, insert, decode.

Each is compiled once per shape bucket, never per request: prompts are right-padded to
a power-of-two length, the number of rows joining at once to a power of two, and the
decode batch is a fixed number of slots over a cache of a bucketed length. Sampling
parameters, seeds and lengths are traced arrays. Programs are module-level, so engines of
the same model structure share them (a second run in the process compiles nothing).

Randomness is per request and per token: token ``i`` of a request with seed ``s`` is drawn
with ``fold_in(key(s), i)``, so a request samples the same tokens whichever slot it lands
in and whoever shares the batch.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.models.kv_cache import KVCache
from rl_core.rollout.sampling import sample

Sampling = tuple[jax.Array, jax.Array, jax.Array]  # temperature [B], top_k [B], top_p [B]


def _keys(seeds: jax.Array, counts: jax.Array) -> jax.Array:  # [B] uint32, [B] int32 -> [B]
    return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seeds, counts)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def prefill(
    graphdef: Any,
    state: Any,
    tokens: jax.Array,  # [K, P] int32, right-padded prompts
    lengths: jax.Array,  # [K] int32, >= 1
    sampling: Sampling,
    seeds: jax.Array,  # [K] uint32
) -> tuple[KVCache, jax.Array, jax.Array]:  # prompt cache [K, P], first token [K], logprob [K]
    model = nnx.merge(graphdef, state)
    k, p = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (k, p))
    valid = positions < lengths[:, None]
    logits, cache = model(tokens, positions, valid=valid, cache=model.init_cache(k, p))
    assert cache is not None
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [K, V]
    token, logprob = sample(last, _keys(seeds, jnp.zeros_like(lengths)), *sampling)
    return cache, token, logprob


@functools.partial(jax.jit, donate_argnums=(0,))
def insert(
    cache: KVCache,  # [R, S]
    prompt: KVCache,  # [K, P], P <= S
    slots: jax.Array,  # [K] int32; R (out of range) for padding rows, which are dropped
) -> KVCache:
    """Write freshly prefilled prompts into their slots of the running batch."""
    p = prompt.keys[0].shape[1]

    def put(big: jax.Array, small: jax.Array) -> jax.Array:
        return big.at[slots, :p].set(small.astype(big.dtype), mode="drop")

    return KVCache(
        tuple(put(b, s) for b, s in zip(cache.keys, prompt.keys, strict=True)),
        tuple(put(b, s) for b, s in zip(cache.values, prompt.values, strict=True)),
        cache.lengths.at[slots].set(prompt.lengths, mode="drop"),
    )


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnums=(2,))
def decode(
    graphdef: Any,
    state: Any,
    cache: KVCache,  # [R, S]
    last: jax.Array,  # [R] int32: each slot's newest token, not yet in the cache
    active: jax.Array,  # [R] bool: the slot holds a running request
    sampling: Sampling,
    seeds: jax.Array,  # [R] uint32
    counts: jax.Array,  # [R] int32: tokens the slot's request has sampled so far
) -> tuple[KVCache, jax.Array, jax.Array]:  # cache, next token [R], logprob [R]
    """One token for every slot: feed ``last`` at each row's own position, sample the next."""
    model = nnx.merge(graphdef, state)
    logits, cache = model(last[:, None], cache.lengths[:, None], valid=active[:, None], cache=cache)
    assert cache is not None
    token, logprob = sample(logits[:, 0], _keys(seeds, counts), *sampling)
    return cache, token, logprob
