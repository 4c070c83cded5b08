"""Decoder-only transformers in Flax NNX (Llama family), their presets and vocabularies.

`config` (hyper-parameters, presets, the architecture names and RoPE variants),
`tokenizer` (the `Tokenizer` protocol and the builtin vocabulary), `buckets`
(padded sizes) are pure Python; `decoder`, `layers`, `rope`, `kv_cache` and
`sharding` are JAX. This ``__init__`` loads `Model` and `KVCache` on first use,
so importing the pure modules (as the checkpoint loaders do) starts no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rl_core.models.config import ModelConfig

if TYPE_CHECKING:
    from rl_core.models.decoder import Model
    from rl_core.models.kv_cache import KVCache

__all__ = ["KVCache", "Model", "ModelConfig"]


def __getattr__(name: str) -> Any:
    if name == "Model":
        from rl_core.models.decoder import Model

        return Model
    if name == "KVCache":
        from rl_core.models.kv_cache import KVCache

        return KVCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
