"""The decoder-only transformer: embeddings, blocks, final norm, tied output projection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.models.config import ModelConfig
from rl_core.models.kv_cache import KVCache
from rl_core.models.layers import Block, RMSNorm


class Model(nnx.Module):
    """A Llama-family decoder. ``Model(ModelConfig.tiny(), rngs=nnx.Rngs(0))``.

    Called on token ids and their positions; with a `KVCache` it writes this
    call's keys and values at ``cache.cursor`` and attends to every valid slot
    up to each query's own slot (prefill and decode are the same call).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs) -> None:
        self.config = config
        init = jax.nn.initializers.normal(stddev=config.embed_init_std)
        self.embed = nnx.Embed(
            config.vocab_size,
            config.d_model,
            dtype=jnp.dtype(config.dtype),
            embedding_init=init,
            rngs=rngs,
        )
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.final_norm = RMSNorm(config.d_model, eps=config.norm_eps, rngs=rngs)

    def __call__(
        self,
        tokens: jax.Array,  # [B, T] int
        positions: jax.Array,  # [B, T] int
        *,
        valid: jax.Array | None = None,  # [B, T] bool; default all True
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:  # logits [B, T, V] float32, updated cache
        b, t = tokens.shape
        if valid is None:
            valid = jnp.ones((b, t), bool)
        if cache is None:
            causal = jnp.tril(jnp.ones((t, t), bool))
            mask = causal[None] & valid[:, None, :]  # [B, T, T]
            slot_valid, index = None, None
        else:
            index = cache.cursor
            slot_valid = jax.lax.dynamic_update_slice(cache.valid, valid, (0, index))  # [B, S]
            query_slot = index + jnp.arange(t)  # [T]
            visible = jnp.arange(cache.length)[None, :] <= query_slot[:, None]  # [T, S]
            mask = visible[None] & slot_valid[:, None, :]  # [B, T, S]

        x = self.embed(tokens)  # [B, T, D]
        new_keys, new_values = [], []
        for i, block in enumerate(self.blocks):
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            x, kv = block(x, positions, mask, kv, index)
            if kv is not None:
                new_keys.append(kv[0])
                new_values.append(kv[1])
        logits = self.embed.attend(self.final_norm(x)).astype(jnp.float32)  # [B, T, V]

        if cache is None:
            return logits, None
        assert slot_valid is not None and index is not None
        return logits, KVCache(tuple(new_keys), tuple(new_values), slot_valid, index + t)

    def init_cache(self, batch: int, length: int) -> KVCache:
        return KVCache.empty(self.config, batch, length)


def count_params(model: nnx.Module) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
