"""The decoder-only transformer: embeddings, blocks, final norm, tied or separate output head."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.models.config import ModelConfig
from rl_core.models.kv_cache import KVCache
from rl_core.models.layers import Block, RMSNorm
from rl_core.models.sharding import constrain


class Model(nnx.Module):
    """A Llama / Qwen2 / Qwen3 decoder. ``Model(ModelConfig.tiny(), rngs=nnx.Rngs(0))``.

    Without a cache it is a plain causal forward (training; ``valid`` masks key padding).
    With a `KVCache` each row writes this call's keys and values from its own
    ``cache.lengths[b]`` on and attends to every slot up to each query's own; ``valid``
    (right padding: real tokens first) says how far each row's length advances.
    Prefill and decode are the same call.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs) -> None:
        self.config = config
        dtype = jnp.dtype(config.dtype)
        init = jax.nn.initializers.normal(stddev=config.embed_init_std)
        self.embed = nnx.Embed(
            config.vocab_size, config.d_model, dtype=dtype, embedding_init=init, rngs=rngs
        )
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.final_norm = RMSNorm(config.d_model, eps=config.norm_eps, rngs=rngs)
        self.lm_head = (
            None
            if config.tie_embeddings
            else nnx.Linear(
                config.d_model,
                config.vocab_size,
                use_bias=False,
                dtype=dtype,
                kernel_init=init,
                rngs=rngs,
            )
        )

    def __call__(
        self,
        tokens: jax.Array,  # [B, T] int
        positions: jax.Array,  # [B, T] int
        *,
        valid: jax.Array | None = None,  # [B, T] bool; default all True
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:  # logits [B, T, V] float32, updated cache
        h, cache = self.hidden(tokens, positions, valid=valid, cache=cache)
        return self.logits(h), cache

    def hidden(
        self,
        tokens: jax.Array,  # [B, T] int
        positions: jax.Array,  # [B, T] int
        *,
        valid: jax.Array | None = None,  # [B, T] bool; default all True
        cache: KVCache | None = None,
        segments: jax.Array | None = None,  # [B, T] int: packed sequences
        key_segments: jax.Array | None = None,  # [B, S] int: each cache slot's sequence
        key_positions: jax.Array | None = None,  # [B, S] int: each cache slot's position
        remat: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:  # final-normed states [B, T, D], updated cache
        """The forward pass up to the output head: a prefill needs logits at one position only
        (the head is a [D, V] matmul per position, a fifth of a small model's prefill).

        ``segments`` packs several sequences into one row (the engine's prefill): a token
        attends only to earlier tokens of its own segment, and ``positions`` restart per
        segment. The cache must be empty and as long as the row, so key slot s holds token s,
        unless ``key_segments`` says whose each slot is (the engine's packed extend: parked
        prefixes end to end, then their new tokens from the cache's length on); then a token
        attends to the slots of its own segment up to its own, and ``key_positions`` gives
        the slots' positions (for ALiBi's distances; RoPE's are in the keys already).

        ``remat`` (training): each block is rematerialised in the backward, so a
        differentiated forward keeps only the blocks' inputs, not every block's attention
        scores and MLP activations: about one more forward pass of compute for the trunk's
        activation memory (bench/README.md, "P1 / block remat"). On CPU, XLA's default
        scheduler (optimised for concurrency) runs the recomputations early and keeps
        most of what they free; ``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_
        scheduler=false`` schedules for memory.
        """
        b, t = tokens.shape
        if valid is None:
            valid = jnp.ones((b, t), bool)
        if cache is None:
            causal = jnp.tril(jnp.ones((t, t), bool))
            mask = causal[None] & valid[:, None, :]  # [B, T, T]
            start = None
        else:
            start = cache.lengths  # [B]
            query_slot = start[:, None] + jnp.arange(t)[None, :]  # [B, T]
            mask = jnp.arange(cache.length)[None, None, :] <= query_slot[:, :, None]  # [B, T, S]
        if segments is not None:
            if key_segments is None:
                if cache is not None and cache.length != t:
                    raise ValueError(f"packed segments need an empty cache of length {t}")
                key_segments = segments
            mask = mask & (segments[:, :, None] == key_segments[:, None, :])

        x = constrain(self.embed(tokens))  # [B, T, D], rows split over data and fsdp
        new_keys, new_values = [], []
        for i, block in enumerate(self.blocks):
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            if remat:
                x, kv = _remat_block(block, x, positions, mask, kv, start, key_positions)
            else:
                x, kv = block(x, positions, mask, kv, start, key_positions)
            x = constrain(x)
            if kv is not None:
                new_keys.append(kv[0])
                new_values.append(kv[1])
        h = self.final_norm(x)
        if cache is None:
            return h, None
        assert start is not None
        lengths = start + jnp.sum(valid, axis=1, dtype=jnp.int32)
        return h, KVCache(tuple(new_keys), tuple(new_values), lengths)

    def logits(self, h: jax.Array) -> jax.Array:  # [B, T, D] -> [B, T, V] float32
        out = self.embed.attend(h) if self.lm_head is None else self.lm_head(h)
        return out.astype(jnp.float32)

    def init_cache(self, batch: int, length: int) -> KVCache:
        return KVCache.empty(self.config, batch, length)


def _remat_block(block: Block, *args: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """``block(*args)`` under `jax.checkpoint`: the backward recomputes the block from its
    inputs. The block goes in as its state and is rebuilt inside, so nothing of the
    caller's module is written from the inner trace (the trainer's LoRA wraps hold traced
    arrays; `nnx.remat` writes its state back and fails on them)."""
    graphdef, state = nnx.split(block)

    def run(state: nnx.State[Any, Any], *args: Any) -> tuple[jax.Array, Any]:
        return nnx.merge(graphdef, state)(*args)

    return jax.checkpoint(run)(state, *args)  # type: ignore[no-any-return]


def count_params(model: nnx.Module) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
