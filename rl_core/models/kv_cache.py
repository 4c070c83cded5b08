"""The KV cache: a plain pytree carried in and out of jitted prefill and decode.

Every row (a slot of the rollout engine's batch) is at its own length: row ``b`` holds
keys and values for positions ``0 .. lengths[b] - 1`` in slots of the same index, and the
next call writes its tokens from slot ``lengths[b]`` on. Sequences of different lengths
therefore share one fixed-shape cache, and a finished row can be refilled by a new request
while the others keep decoding (continuous batching). Slots past a row's length hold stale
values that no query can see.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_core.models.config import ModelConfig


class KVCache(NamedTuple):
    # Heads before slots, the layout attention reads: stored as [B, S, Hkv, Dh] instead, the
    # decode step transposed the whole cache twice per layer (a tenth of its time on a CPU).
    keys: tuple[jax.Array, ...]  # per layer [B, Hkv, S, Dh]
    values: tuple[jax.Array, ...]  # per layer [B, Hkv, S, Dh]
    lengths: jax.Array  # [B] int32: tokens held per row; the next write goes there

    @classmethod
    def empty(cls, config: ModelConfig, batch: int, length: int) -> KVCache:
        dtype = jnp.dtype(config.dtype)
        shape = (batch, config.n_kv_heads, length, config.head_dim)
        # Distinct buffers per layer and for keys and values: the engine donates them.
        return cls(
            keys=tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers)),
            values=tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers)),
            lengths=jnp.zeros((batch,), jnp.int32),
        )

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[2])
