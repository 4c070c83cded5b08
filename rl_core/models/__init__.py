"""Decoder-only transformers in Flax NNX (Llama family) and their presets.

Importing this package imports JAX; the control plane must not.
"""

from rl_core.models.config import ModelConfig
from rl_core.models.decoder import Model
from rl_core.models.kv_cache import KVCache

__all__ = ["KVCache", "Model", "ModelConfig"]
