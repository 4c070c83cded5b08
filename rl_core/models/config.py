"""Model hyper-parameters: one frozen, keyword-only dataclass with named presets.

The same `ModelConfig` describes the random-init presets (``tiny``, ``small``) and the
Llama / Qwen2 / Qwen3 checkpoints the loaders read (`rl_core.pretrained.hf_config.model_config`):
the features that tell those families apart are flags (``qkv_bias`` for Qwen2, ``qk_norm``
for Qwen3, ``tie_embeddings``, an explicit ``head_dim``, a RoPE scaling variant). The
architecture names and RoPE variants live here, with the model; the loaders parse files into them.
"""

from __future__ import annotations

import dataclasses
from typing import Final, Literal

DType = Literal["float32", "bfloat16"]

Architecture = Literal["llama", "qwen2", "qwen3"]
RopeKind = Literal["linear", "dynamic", "yarn", "llama3"]

ARCHITECTURES: Final[tuple[Architecture, ...]] = ("llama", "qwen2", "qwen3")
ROPE_KINDS: Final[tuple[RopeKind, ...]] = ("linear", "dynamic", "yarn", "llama3")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """A RoPE frequency-scaling variant, as in transformers' ``ROPE_INIT_FUNCTIONS``.

    - ``linear``: positions divided by ``factor`` (Chen et al. 2023, position interpolation).
    - ``dynamic``: NTK-aware base rescaling past ``original_max_position_embeddings``.
    - ``yarn``: YaRN (Peng et al. 2023): ``beta_fast`` / ``beta_slow`` ramp,
      ``attention_factor`` (defaults to ``0.1 ln(factor) + 1`` when None).
    - ``llama3``: Llama 3.1's piecewise scaling of low frequencies by ``factor`` between
      ``low_freq_factor`` and ``high_freq_factor`` wavelengths.

    Fields a variant does not use are None. ``original_max_position_embeddings`` is None when
    the file does not state it (transformers then uses ``max_position_embeddings``).
    """

    kind: RopeKind
    factor: float
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A Llama-family decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    # The context the model was trained for; dynamic and YaRN RoPE scale relative to it.
    max_seq_len: int = 2048
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-6
    qkv_bias: bool = False  # Qwen2: biases on q/k/v (never on o)
    qk_norm: bool = False  # Qwen3: per-head RMSNorm of queries and keys before RoPE
    tie_embeddings: bool = True  # logits = h @ E.T; else a separate lm_head
    # Which Hugging Face family this is, for export; the maths follows the flags above.
    architecture: Architecture = "llama"
    # Small embedding init keeps a random-init policy close to uniform over the
    # vocabulary (tied logits are h @ E.T), so RL starts by exploring.
    embed_init_std: float = 0.02
    # ALiBi (Press et al., 2022) on top of RoPE: head h's attention scores are lowered by
    # alibi_slope * 2**-h per token of distance, so each head starts out looking at recent
    # tokens, the nearest most. 0 is plain Llama. Only the ``tiny-alibi`` preset sets it:
    # a random-init model's attention is otherwise spread over the whole context, so its
    # answer hardly depends on the last observation and RL settles on one answer for every
    # input before it learns to read (docs/learning.md). No Hugging Face family expresses
    # it, so such a model is not exported (and cannot be served by vLLM).
    alibi_slope: float = 0.0
    dtype: DType = "float32"

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if self.alibi_slope < 0:
            raise ValueError(f"alibi_slope ({self.alibi_slope}) must not be negative")

    @property
    def block_flops_per_token(self) -> int:
        """The blocks' matmul FLOPs for one position (2 per weight), attention's scores
        aside: what a prefill costs a token."""
        attention = self.d_model * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        return 2 * self.n_layers * (attention + 3 * self.d_model * self.d_ff)

    @classmethod
    def tiny(cls, *, vocab_size: int | None = None, **overrides: object) -> ModelConfig:
        """About 100k parameters: a train step takes milliseconds on a CPU core."""
        if vocab_size is None:
            from rl_core.models.tokenizer import BuiltinTokenizer

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

    @classmethod
    def tiny_alibi(cls, *, vocab_size: int | None = None, **overrides: object) -> ModelConfig:
        """``tiny`` whose heads start out attending to recent tokens (``alibi_slope``): the
        preset for games whose right answer depends on the last observation."""
        fields: dict[str, object] = dict(alibi_slope=1.0)
        fields.update(overrides)
        return cls.tiny(vocab_size=vocab_size, **fields)


PRESETS = {
    "tiny": ModelConfig.tiny,
    "small": ModelConfig.small,
    "tiny-alibi": ModelConfig.tiny_alibi,
}
