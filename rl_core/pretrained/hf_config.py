"""The architecture of a Llama / Qwen2 / Qwen3 decoder, parsed from a Hugging Face ``config.json``.

`ArchConfig` is the loaders' framework-neutral description of a checkpoint: enough to know
which tensors it must hold and with which shapes, and what the model code needs to run it.
`parse_hf_config` reads both layouts of the RoPE settings that ``config.json`` files use:

- old (transformers < 5): top-level ``rope_theta`` and ``rope_scaling`` (``null`` or a dict
  with ``rope_type`` / ``type``);
- new (transformers >= 5): ``rope_parameters = {"rope_type": ..., "rope_theta": ..., ...}``.

Fields that transformers itself defaults when a file omits them (``rope_theta``,
``rms_norm_eps``, ``num_key_value_heads``, ...) get transformers' defaults for that
architecture; the fields that fix tensor shapes are required.

Features that change the tensor set or the maths in ways the model code does not implement
(``attention_bias`` on Llama/Qwen3, which also puts a bias on ``o_proj``; ``mlp_bias``;
sliding-window attention; activations other than SiLU) are refused with
`UnsupportedConfigError` rather than loaded into a model that would silently compute
something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from rl_core.models.config import (
    ARCHITECTURES,
    ROPE_KINDS,
    Architecture,
    DType,
    ModelConfig,
    RopeKind,
    RopeScaling,
)
from rl_core.pretrained.errors import (
    ConfigError,
    MissingConfigFieldError,
    UnsupportedConfigError,
)

# `architectures[0]` in config.json, for files that lack `model_type`.
_CLASS_TO_ARCH: Final[dict[str, Architecture]] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

# transformers' defaults for the fields a config.json may omit (LlamaConfig / Qwen2Config /
# Qwen3Config): max_position_embeddings differs, the rest agree.
_DEFAULT_MAX_POSITIONS: Final[dict[Architecture, int]] = {
    "llama": 2048,
    "qwen2": 32768,
    "qwen3": 32768,
}
_DEFAULT_ROPE_THETA: Final = 10000.0
_DEFAULT_RMS_NORM_EPS: Final = 1e-6


@dataclass(frozen=True, kw_only=True)
class ArchConfig:
    """A decoder-only transformer of the Llama family (pre-norm, RMSNorm, SwiGLU MLP, GQA, RoPE).

    ``attention_bias`` means a bias on the q/k/v projections only (Qwen2); ``qk_norm`` means
    a per-head RMSNorm (weight ``[head_dim]``) on queries and keys before RoPE (Qwen3).
    ``eos_token_ids`` is a tuple because some configs (Llama 3) list several.
    """

    architecture: Architecture
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None

    @property
    def eos_token_id(self) -> int | None:
        """The first end-of-sequence id, or None."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(name, f"must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                "num_key_value_heads",
                f"{self.num_kv_heads} does not divide num_attention_heads={self.num_heads}",
            )
        if self.head_dim % 2:
            raise ConfigError("head_dim", f"RoPE needs an even head_dim, got {self.head_dim}")


def parse_hf_config(raw: Mapping[str, Any]) -> ArchConfig:
    """The `ArchConfig` of a ``config.json`` dict.

    Raises `MissingConfigFieldError` / `UnsupportedConfigError` / `ConfigError` naming the field.
    """
    arch = _architecture(raw)
    hidden_size = _int(raw, "hidden_size")
    num_heads = _int(raw, "num_attention_heads")
    num_kv_heads = _int(raw, "num_key_value_heads", default=num_heads)
    head_dim = _int(raw, "head_dim", default=0)
    if not head_dim:
        if num_heads <= 0 or hidden_size % num_heads:
            raise ConfigError(
                "head_dim",
                f"absent, and hidden_size={hidden_size} is not a multiple of "
                f"num_attention_heads={num_heads}",
            )
        head_dim = hidden_size // num_heads

    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedConfigError("hidden_act", act, ["silu"])
    if raw.get("mlp_bias", False):
        raise UnsupportedConfigError("mlp_bias", raw["mlp_bias"], "false")
    if arch == "qwen2":
        attention_bias = True  # Qwen2 always has q/k/v biases (and none on o_proj)
    else:
        if raw.get("attention_bias", False):
            # Llama/Qwen3 put this bias on o_proj as well: a tensor set the model lacks.
            raise UnsupportedConfigError("attention_bias", raw["attention_bias"], "false")
        attention_bias = False
    if raw.get("use_sliding_window", False):
        raise UnsupportedConfigError("use_sliding_window", raw["use_sliding_window"], "false")

    rope_theta, rope_scaling = _rope(raw)
    return ArchConfig(
        architecture=arch,
        vocab_size=_int(raw, "vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=_int(raw, "intermediate_size"),
        num_layers=_int(raw, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_float(raw, "rms_norm_eps", default=_DEFAULT_RMS_NORM_EPS),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=_int(
            raw, "max_position_embeddings", default=_DEFAULT_MAX_POSITIONS[arch]
        ),
        tie_word_embeddings=_bool(raw, "tie_word_embeddings", default=False),
        attention_bias=attention_bias,
        qk_norm=arch == "qwen3",
        bos_token_id=_optional_int(raw, "bos_token_id"),
        eos_token_ids=_token_ids(raw, "eos_token_id"),
        pad_token_id=_optional_int(raw, "pad_token_id"),
    )


def parse_rope_scaling(
    raw: Mapping[str, Any] | None, *, field: str = "rope_scaling"
) -> RopeScaling | None:
    """A `RopeScaling` from a ``rope_scaling`` / ``rope_parameters`` dict (None: no scaling)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(field, f"expected an object, got {type(raw).__name__}")
    kind = raw.get("rope_type", raw.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ROPE_KINDS:
        raise UnsupportedConfigError(f"{field}.rope_type", kind, ("default", *ROPE_KINDS))
    kind = cast(RopeKind, kind)
    required = {
        "linear": ("factor",),
        "dynamic": ("factor",),
        "yarn": ("factor",),
        "llama3": (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ),
    }[kind]
    for key in required:
        if raw.get(key) is None:
            raise MissingConfigFieldError(f"{field}.{key}", f"a {kind!r} rope scaling")

    def opt_float(key: str) -> float | None:
        return None if raw.get(key) is None else _float(raw, key, prefix=field)

    original = raw.get("original_max_position_embeddings")
    return RopeScaling(
        kind=kind,
        factor=_float(raw, "factor", prefix=field),
        original_max_position_embeddings=(
            None
            if original is None
            else _int(raw, "original_max_position_embeddings", prefix=field)
        ),
        low_freq_factor=opt_float("low_freq_factor"),
        high_freq_factor=opt_float("high_freq_factor"),
        beta_fast=opt_float("beta_fast"),
        beta_slow=opt_float("beta_slow"),
        attention_factor=opt_float("attention_factor"),
        mscale=opt_float("mscale"),
        mscale_all_dim=opt_float("mscale_all_dim"),
    )


def _architecture(raw: Mapping[str, Any]) -> Architecture:
    model_type = raw.get("model_type")
    if model_type is not None:
        if model_type not in ARCHITECTURES:
            raise UnsupportedConfigError("model_type", model_type, ARCHITECTURES)
        return cast(Architecture, model_type)
    classes = raw.get("architectures")
    if not classes:
        raise MissingConfigFieldError("model_type")
    if not isinstance(classes, list) or classes[0] not in _CLASS_TO_ARCH:
        raise UnsupportedConfigError("architectures", classes, sorted(_CLASS_TO_ARCH))
    return _CLASS_TO_ARCH[classes[0]]


def _rope(raw: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    params = raw.get("rope_parameters")
    if params is not None:  # the transformers >= 5 layout
        if not isinstance(params, Mapping):
            raise ConfigError("rope_parameters", f"expected an object, got {type(params).__name__}")
        if params and all(isinstance(v, Mapping) for v in params.values()):
            raise UnsupportedConfigError(
                "rope_parameters", sorted(params), "one set of parameters for every layer"
            )
        theta = _float(params, "rope_theta", default=_DEFAULT_ROPE_THETA, prefix="rope_parameters")
        return theta, parse_rope_scaling(params, field="rope_parameters")
    theta = _float(raw, "rope_theta", default=_DEFAULT_ROPE_THETA)
    return theta, parse_rope_scaling(raw.get("rope_scaling"), field="rope_scaling")


_REQUIRED: Final = object()


def _get(raw: Mapping[str, Any], key: str, default: object, prefix: str) -> object:
    value = raw.get(key)
    if value is None:
        if default is _REQUIRED:
            raise MissingConfigFieldError(f"{prefix}.{key}" if prefix else key)
        return default
    return value


def _int(raw: Mapping[str, Any], key: str, *, default: object = _REQUIRED, prefix: str = "") -> int:
    value = _get(raw, key, default, prefix)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{prefix}.{key}" if prefix else key,
            f"expected an integer, got {value!r}",
        )
    return value


def _float(
    raw: Mapping[str, Any], key: str, *, default: object = _REQUIRED, prefix: str = ""
) -> float:
    value = _get(raw, key, default, prefix)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{prefix}.{key}" if prefix else key, f"expected a number, got {value!r}")
    return float(value)


def _bool(raw: Mapping[str, Any], key: str, *, default: bool) -> bool:
    value = _get(raw, key, default, "")
    if not isinstance(value, bool):
        raise ConfigError(key, f"expected true or false, got {value!r}")
    return value


def _optional_int(raw: Mapping[str, Any], key: str) -> int | None:
    return None if raw.get(key) is None else _int(raw, key)


def _token_ids(raw: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = raw.get(key)
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(key, f"expected an integer or a list of integers, got {value!r}")
    return tuple(values)


def model_config(arch: ArchConfig, *, dtype: DType = "float32") -> ModelConfig:
    """The model config of a loaded checkpoint's `ArchConfig`."""
    return ModelConfig(
        vocab_size=arch.vocab_size,
        d_model=arch.hidden_size,
        n_layers=arch.num_layers,
        n_heads=arch.num_heads,
        n_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        d_ff=arch.intermediate_size,
        max_seq_len=arch.max_position_embeddings,
        rope_theta=arch.rope_theta,
        rope_scaling=arch.rope_scaling,
        norm_eps=arch.rms_norm_eps,
        qkv_bias=arch.attention_bias,
        qk_norm=arch.qk_norm,
        tie_embeddings=arch.tie_word_embeddings,
        architecture=arch.architecture,
        dtype=dtype,
    )
