"""The jitted device programs of the built-in engine: prefill, extend, insert, stash, resize,
decode.

Each is compiled once per shape bucket, never per request: joining prompts are packed end
to end into one row padded to a bucket of their total (`scheduler.packed_bucket`), the
number of them to a power of two, and the decode batch is a fixed number of slots over a
cache of a bucketed length. Sampling parameters, seeds and lengths are traced arrays.
Prompts that continue parked sequences are extended instead: only their new tokens,
packed the same way, after their prefixes' keys and values read from the prefix pool
(`stash` puts them there).
Programs are cached per model structure (`programs`), so engines of the same structure
share them: a second run in the process compiles nothing.

An engine with adapter slots (`AdapterSpec`) runs the same programs with two more
inputs: the stacked adapters ``[S + 1, ...]`` (flat leaves, as the weights) and each row's
slot (each token's, in the packed prefill), through `rl_core.models.multi_lora`'s grouped
product. Both are arrays, so setting another adapter into a slot compiles nothing; the
extra slot S is all zeros and stands for the base alone.

Penalties need the tokens each request sampled so far: the scheduler keeps them on the device
as counts per slot and token (``seen``, [R, V]), set by `seat` when a request takes a slot and
updated by `_decode` as it samples, so no host copy crosses per step.

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
from rl_core.models.lora import LoraConfig
from rl_core.models.multi_lora import Impl, with_adapters
from rl_core.rollout.sampling import Controls, Sampled, sample


def _keys(seeds: jax.Array, counts: jax.Array) -> jax.Array:  # [B] uint32, [B] int32 -> [B]
    return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seeds, counts)


@functools.partial(jax.jit, donate_argnums=(0,))
def insert(
    cache: KVCache,  # [R, S]
    prompt: KVCache,  # [K, P], P <= S
    slots: jax.Array,  # [K] int32; R (out of range) for padding rows, which are dropped
) -> KVCache:
    """Write the rows of a smaller cache into slots of a larger one (a resize moves the
    running requests this way; a fresh prefill goes in with `insert_packed`)."""
    p = prompt.length

    def put(big: jax.Array, small: jax.Array) -> jax.Array:  # [R, Hkv, S, Dh] <- [K, Hkv, P, Dh]
        return big.at[slots, :, :p].set(small.astype(big.dtype), mode="drop")

    return KVCache(
        tuple(put(b, s) for b, s in zip(cache.keys, prompt.keys, strict=True)),
        tuple(put(b, s) for b, s in zip(cache.values, prompt.values, strict=True)),
        cache.lengths.at[slots].set(prompt.lengths, mode="drop"),
    )


@functools.partial(jax.jit, donate_argnums=(0,))
def insert_packed(
    cache: KVCache,  # [R, S]
    packed: KVCache,  # [1, N]: prompts packed end to end, as prefilled
    token_slots: jax.Array,  # [N] int32: each token's slot; R (out of range) for padding
    positions: jax.Array,  # [N] int32: each token's position in its prompt
    slots: jax.Array,  # [K] int32: each prompt's slot; R for padding rows
    lengths: jax.Array,  # [K] int32: each prompt's length
) -> KVCache:
    """Scatter a packed prefill's keys and values to their slots and positions."""

    def put(big: jax.Array, row: jax.Array) -> jax.Array:  # [R, Hkv, S, Dh] <- [1, Hkv, N, Dh]
        moved = row[0].transpose(1, 0, 2).astype(big.dtype)  # [N, Hkv, Dh]
        return big.at[token_slots, :, positions].set(moved, mode="drop")

    return KVCache(
        tuple(put(b, r) for b, r in zip(cache.keys, packed.keys, strict=True)),
        tuple(put(b, r) for b, r in zip(cache.values, packed.values, strict=True)),
        cache.lengths.at[slots].set(lengths, mode="drop"),
    )


@functools.partial(jax.jit, donate_argnums=(0,))
def stash(
    pool: KVCache,  # [P, Sp]: the prefix pool
    cache: KVCache,  # [R, S]
    slot: jax.Array,  # [] int32: the finished row
    row: jax.Array,  # [] int32: the pool row it goes to
) -> KVCache:
    """Copy one slot's keys and values into a row of the prefix pool (``rollout.prefix_pool``)."""
    m = min(pool.length, cache.length)

    def put(p: jax.Array, c: jax.Array) -> jax.Array:  # [P, Hkv, Sp, Dh] <- [R, Hkv, S, Dh]
        return p.at[row, :, :m].set(c[slot, :, :m].astype(p.dtype))

    return KVCache(
        tuple(put(p, c) for p, c in zip(pool.keys, cache.keys, strict=True)),
        tuple(put(p, c) for p, c in zip(pool.values, cache.values, strict=True)),
        pool.lengths,
    )


@functools.partial(jax.jit, donate_argnums=(0,))
def seat(
    seen: jax.Array,  # [R, V] int32: token counts per slot
    slots: jax.Array,  # [K] int32: slots taken by new requests; R (out of range) for padding
    first: jax.Array,  # [K] int32: each one's first sampled token
) -> jax.Array:  # [R, V]
    """Start the counts of slots taken by new requests: their first token, once."""
    seen = seen.at[slots].set(0, mode="drop")
    return seen.at[slots, first].add(1, mode="drop")


@functools.partial(jax.jit, static_argnums=(3,))
def resize(
    cache: KVCache,  # [R, S]
    seen: jax.Array,  # [R, V] int32
    source: jax.Array,  # [R'] int32: the old row each new row takes; R (out of range): none
    length: int,  # S'
) -> tuple[KVCache, jax.Array]:  # [R', S'], [R', V]
    """The cache and the token counts in another shape, the running rows moved to new slots.

    New row j holds old row ``source[j]``'s first ``min(S, S')`` positions, or nothing.
    The running rows go in as a padded index rather than a list of their own length, so
    there is one program per pair of shapes: with a program per count of running rows
    (as there was), a multi-turn run compiled or loaded one at most resizes."""
    keep = min(length, cache.length)
    valid = source < cache.rows
    take = jnp.where(valid, source, 0)

    def move(x: jax.Array) -> jax.Array:  # [R, Hkv, S, Dh] -> [R', Hkv, S', Dh]
        rows = jnp.where(valid[:, None, None, None], x[take, :, :keep], 0)
        return jnp.pad(rows, ((0, 0), (0, 0), (0, length - keep), (0, 0)))

    moved = KVCache(
        tuple(move(k) for k in cache.keys),
        tuple(move(v) for v in cache.values),
        jnp.where(valid, cache.lengths[take], 0),
    )
    return moved, jnp.where(valid[:, None], seen[take], 0)


class Weights(NamedTuple):
    """What a program computes with: the model's flat leaves and, for an engine with
    adapter slots, the stacked adapters' flat leaves ([S + 1, ...] each) with each row's
    slot (None and None without adapters)."""

    leaves: list[jax.Array]
    adapters: list[jax.Array] | None = None
    rows: Any = None  # [B] int32 (decode) or [1, N] (packed prefill, extend): an adapter slot


class AdapterSpec(NamedTuple):
    """The shape of an engine's adapters, a part of its programs' identity."""

    treedef: Any  # of the stacked adapters (`StackedAdapters`)
    lora: LoraConfig
    impl: Impl


class Programs(NamedTuple):
    """The jitted prefill and decode of one model structure; weights go in as `Weights`."""

    prefill: Any  # (weights, tokens, positions, segments, last, controls, seeds) -> (cache, ..)
    extend: Any  # (weights, held, key_segments, key_positions, tokens, positions, segments,
    #   last, controls, seeds) -> (cache, Sampled)
    decode: Any  # (weights, cache, seen, last, previous, on_device, active, controls, seeds,
    #   counts) -> (cache, seen, Sampled)


@functools.lru_cache(maxsize=8)  # a long-lived worker may serve many model structures
def programs(graphdef: Any, treedef: Any, adapters: AdapterSpec | None = None) -> Programs:
    """Compile-once programs for a model structure, shared by every engine of that structure.

    The structure is closed over, not passed per call: hashing an NNX graph definition as a
    static argument and flattening an `nnx.State` cost about 3 ms per call on the host, a
    tenth of a small model's decode step. The engine flattens its weights once per policy.
    """

    def model_of(weights: Weights) -> Any:
        model = nnx.merge(graphdef, jax.tree.unflatten(treedef, weights.leaves))
        if adapters is None:
            return model
        assert weights.adapters is not None  # the engine passes them with its slots
        stacked = jax.tree.unflatten(adapters.treedef, weights.adapters)
        return with_adapters(model, stacked, weights.rows, adapters.lora, impl=adapters.impl)

    return Programs(
        prefill=jax.jit(functools.partial(_prefill, model_of)),
        extend=jax.jit(functools.partial(_extend, model_of)),
        decode=jax.jit(functools.partial(_decode, model_of), donate_argnums=(1, 2)),
    )


def _prefill(
    model_of: Any,
    weights: Weights,
    tokens: jax.Array,  # [1, N] int32: the prompts packed end to end, then padding
    positions: jax.Array,  # [1, N] int32: each token's position in its own prompt
    segments: jax.Array,  # [1, N] int32: the prompt a token belongs to (-1 for padding)
    last: jax.Array,  # [K] int32: where each prompt's last token is in the row
    controls: Controls,  # [K] rows
    seeds: jax.Array,  # [K] uint32
) -> tuple[KVCache, Sampled]:  # packed cache [1, N], each prompt's first token [K]
    model = model_of(weights)
    n = tokens.shape[1]
    h, cache = model.hidden(tokens, positions, segments=segments, cache=model.init_cache(1, n))
    assert cache is not None
    logits = model.logits(h[:, last])[0]  # [K, V]: the head runs at each prompt's end only
    return cache, sample(logits, _keys(seeds, jnp.zeros_like(last)), controls)


@jax.jit
def gather_prefixes(
    pool: KVCache,  # [P, Sp]: the prefix pool
    source_rows: jax.Array,  # [L] int32: the pool row each slot of the row is read from
    source_positions: jax.Array,  # [L] int32: and the position in it
    start: jax.Array,  # [1] int32: prefix tokens in the row; an extend's new ones go from here
) -> KVCache:  # [1, L]
    """Parked prefixes' keys and values, read from their pool rows into one row end to end
    (an extend's input). A program of its own, so the extend's shape is not the pool's."""

    def gather(p: jax.Array) -> jax.Array:  # [P, Hkv, Sp, Dh] -> [1, Hkv, L, Dh]
        return p[source_rows, :, source_positions].transpose(1, 0, 2)[None]

    return KVCache(tuple(map(gather, pool.keys)), tuple(map(gather, pool.values)), start)


def _extend(
    model_of: Any,
    weights: Weights,
    held: KVCache,  # [1, L]: the prefixes end to end (`gather_prefixes`), then room
    key_segments: jax.Array,  # [1, L] int32: whose each slot is (-1 padding, -2 nobody's)
    key_positions: jax.Array,  # [1, L] int32: each slot's position in its own sequence
    tokens: jax.Array,  # [1, N] int32: the prompts' new tokens packed end to end, then padding
    positions: jax.Array,  # [1, N] int32: each one's position in its own prompt
    segments: jax.Array,  # [1, N] int32: the prompt a token belongs to (-1 for padding)
    last: jax.Array,  # [K] int32: where each prompt's last new token is in the row
    controls: Controls,  # [K] rows
    seeds: jax.Array,  # [K] uint32
) -> tuple[KVCache, Sampled]:  # packed cache [1, L], each prompt's first token [K]
    """Prefill only what follows parked prefixes, packed as the prefill is.

    The new tokens go into the row after the prefixes (from ``held.lengths``), each
    attending to its own prefix and to its own prompt's new tokens before it
    (``key_segments``). Cost: the new tokens only, with no padding per prompt, and
    attention over the row's prefixes. The row goes to the prompts' slots with
    `insert_packed`, so this program's shape is the row's, not the cache's or the pool's."""
    model = model_of(weights)
    h, packed = model.hidden(
        tokens,
        positions,
        segments=segments,
        key_segments=key_segments,
        key_positions=key_positions,
        cache=held,
    )
    assert packed is not None
    logits = model.logits(h[:, last])[0]  # [K, V]: the head runs at each prompt's end only
    return packed, sample(logits, _keys(seeds, jnp.zeros_like(last)), controls)


def _decode(
    model_of: Any,
    weights: Weights,
    cache: KVCache,  # [R, S]
    seen: jax.Array,  # [R, V] int32: the tokens each slot's request sampled so far, counted
    last: jax.Array,  # [R] int32: each slot's newest token, not yet in the cache
    previous: jax.Array,  # [R] int32: the previous decode step's tokens, still on the device
    on_device: jax.Array,  # [R] bool: take the slot's newest token from ``previous``
    active: jax.Array,  # [R] bool: the slot holds a running request
    controls: Controls,  # [R] rows
    seeds: jax.Array,  # [R] uint32
    counts: jax.Array,  # [R] int32: tokens the slot's request has sampled so far
) -> tuple[KVCache, jax.Array, Sampled]:  # cache, seen, the next token [R]
    """One token for every slot: feed its newest token at the row's own position, sample the
    next. Taking it from ``previous`` lets the host dispatch this step before reading that one."""
    model = model_of(weights)
    last = jnp.where(on_device, previous, last)
    logits, cache = model(last[:, None], cache.lengths[:, None], valid=active[:, None], cache=cache)
    assert cache is not None
    sampled = sample(logits[:, 0], _keys(seeds, counts), controls, seen)
    rows = jnp.arange(seen.shape[0])
    seen = seen.at[rows, sampled.token].add(active.astype(seen.dtype), mode="drop")
    return cache, seen, sampled
