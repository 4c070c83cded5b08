"""Model hyper-parameters: one frozen, keyword-only dataclass with named presets."""

from __future__ import annotations

import dataclasses
from typing import Literal

DType = Literal["float32", "bfloat16"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A Llama-family decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, tied embeddings."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    max_seq_len: int = 2048
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    # Small embedding init keeps a random-init policy close to uniform over the
    # vocabulary (tied logits are h @ E.T), so RL starts by exploring.
    embed_init_std: float = 0.02
    dtype: DType = "float32"

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")

    @classmethod
    def tiny(cls, *, vocab_size: int | None = None, **overrides: object) -> ModelConfig:
        """About 100k parameters: a train step takes milliseconds on a CPU core."""
        if vocab_size is None:
            from rl_core.tokenizer import BuiltinTokenizer

            vocab_size = BuiltinTokenizer().vocab_size
        fields: dict[str, object] = dict(
            vocab_size=vocab_size,
            d_model=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            head_dim=16,
            d_ff=192,
            max_seq_len=1024,
        )
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]

    @classmethod
    def small(cls, *, vocab_size: int | None = None, **overrides: object) -> ModelConfig:
        """About 1.5M parameters: still trainable on CPU, slower to learn per second."""
        fields: dict[str, object] = dict(
            d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, head_dim=32, d_ff=512
        )
        fields.update(overrides)
        return cls.tiny(vocab_size=vocab_size, **fields)


PRESETS = {"tiny": ModelConfig.tiny, "small": ModelConfig.small}
