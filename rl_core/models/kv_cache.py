"""The KV cache: a plain pytree carried in and out of jitted prefill and decode.

All sequences of a batch share one write index, because prompts are
left-padded to the same bucket length: the last prompt token of every row sits
at the same slot, and each decode step writes one slot for all rows, at ``cursor``. Which
slots hold real tokens is tracked per row in ``valid``; RoPE uses each row's
true positions, so padding changes nothing but the memory used.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_core.models.config import ModelConfig


class KVCache(NamedTuple):
    keys: tuple[jax.Array, ...]  # per layer [B, S, Hkv, Dh]
    values: tuple[jax.Array, ...]  # per layer [B, S, Hkv, Dh]
    valid: jax.Array  # [B, S] bool: the slot holds a real token
    cursor: jax.Array  # [] int32: the next slot to write

    @classmethod
    def empty(cls, config: ModelConfig, batch: int, length: int) -> KVCache:
        dtype = jnp.dtype(config.dtype)
        shape = (batch, length, config.n_kv_heads, config.head_dim)
        zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers))
        return cls(
            keys=zeros,
            values=zeros,
            valid=jnp.zeros((batch, length), bool),
            cursor=jnp.zeros((), jnp.int32),
        )

    @property
    def length(self) -> int:
        return int(self.valid.shape[1])
