"""Loading a GGUF file (llama.cpp's format) into the same form as a Hugging Face checkpoint.

What comes out equals what transformers gets from ``from_pretrained(dir, gguf_file=...)``:

- every tensor dequantised to float32 with ``gguf.quants.dequantize``, in numpy axis order
  (GGUF stores dims innermost-first; ``reversed(tensor.shape)`` is the torch/numpy shape);
- GGUF names (``token_embd.weight``, ``blk.N.attn_q.weight``, ...) renamed to HF names;
- for the Llama architecture, the Q/K row permutation undone (see `unpermute_rope_rows`);
- an `ArchConfig` rebuilt from the ``{arch}.*`` metadata keys.

Architectures: ``llama``, ``qwen2``, ``qwen3`` (``general.architecture``). Shapes are checked
against the config before anything is dequantised.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

from rl_core.models.config import ARCHITECTURES, Architecture, RopeScaling
from rl_core.pretrained.errors import (
    CheckpointSourceError,
    ConfigError,
    CorruptFileError,
    MissingConfigFieldError,
    TensorDTypeError,
    UnexpectedTensorError,
    UnsupportedConfigError,
)
from rl_core.pretrained.hf_config import ArchConfig
from rl_core.pretrained.layout import Shape, check_tensor_shapes

_TOP_LEVEL: Final[dict[str, str]] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK: Final[dict[str, str]] = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME: Final = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_HF_BLOCK_NAME: Final = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def gguf_to_hf_name(name: str) -> str | None:
    """The HF name of a GGUF tensor name, or None for a name outside the Llama-family map."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    match = _BLOCK_NAME.match(name)
    if match is None or match.group(2) not in _BLOCK:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK[part]}.{kind}"


def hf_to_gguf_name(name: str) -> str:
    """The inverse of `gguf_to_hf_name` (for writing test files); KeyError if it has none."""
    for gguf_name, hf_name in _TOP_LEVEL.items():
        if name == hf_name:
            return gguf_name
    match = _HF_BLOCK_NAME.match(name)
    if match is not None:
        layer, part, kind = match.groups()
        for gguf_part, hf_part in _BLOCK.items():
            if part == hf_part:
                return f"blk.{layer}.{gguf_part}.{kind}"
    raise KeyError(name)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's row interleave of a Llama q/k projection (weight ``[n_heads*hd, D]``).

    transformers' Llama applies RoPE to the half-split pairs ``(x[j], x[j + hd/2])`` of each
    head; llama.cpp's (non-NeoX) RoPE rotates adjacent pairs ``(x[2j], x[2j+1])``. Its
    converter therefore reorders every head's rows so that GGUF row ``h*hd + 2j + s`` holds HF
    row ``h*hd + s*hd/2 + j`` (``s`` in {0, 1}, ``j < hd/2``). Reading it back: view the rows
    as ``[n_heads, hd/2, 2]`` and swap the last two axes to get ``[n_heads, 2, hd/2]``.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of even size")
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's interleave (HF -> GGUF), the inverse of `unpermute_rope_rows`."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFFile:
    """One open GGUF file: its metadata, its `ArchConfig`, its tensors under HF names.

    Opening parses the header and metadata (for a 49k-token vocabulary, a few seconds);
    tensor data stays memory-mapped until `tensors` dequantises it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointSourceError(str(self.path), "GGUF file does not exist")
        try:
            self._reader = GGUFReader(self.path)
        except Exception as err:  # the reader raises bare ValueError / struct / numpy errors
            raise CorruptFileError(str(self.path), f"not a readable GGUF file ({err!r})") from err
        self._tensors: dict[str, ReaderTensor] = {t.name: t for t in self._reader.tensors}

    # metadata ---------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return key in self._reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python (str, int, float, bool or list), or ``default``."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as err:
            raise CorruptFileError(str(self.path), f"metadata {key!r} is unreadable") from err

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise MissingConfigFieldError(key, f"the GGUF metadata of {self.path.name}")
        return value

    @property
    def architecture(self) -> Architecture:
        arch = self.require("general.architecture")
        if arch not in ARCHITECTURES:
            raise UnsupportedConfigError("general.architecture", arch, ARCHITECTURES)
        return cast(Architecture, arch)

    @property
    def chat_template(self) -> str | None:
        value = self.get("tokenizer.chat_template")
        return value if isinstance(value, str) else None

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor_shape(self, name: str) -> Shape:
        """The numpy/torch shape of a GGUF tensor (GGUF lists its dims innermost first)."""
        return tuple(int(n) for n in reversed(self._tensors[name].shape))

    def arch_config(self) -> ArchConfig:
        """The `ArchConfig` the metadata describes (the same values transformers derives)."""
        arch = self.architecture

        def key(suffix: str) -> str:
            return f"{arch}.{suffix}"

        def int_field(suffix: str, default: int | None = None) -> int:
            value = self.get(key(suffix), default)
            if value is None:
                raise MissingConfigFieldError(key(suffix), f"the GGUF metadata of {self.path.name}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(key(suffix), f"expected an integer, got {value!r}")
            return value

        def float_field(suffix: str, default: float | None = None) -> float:
            value = self.get(key(suffix), default)
            if value is None:
                raise MissingConfigFieldError(key(suffix), f"the GGUF metadata of {self.path.name}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(key(suffix), f"expected a number, got {value!r}")
            return float(value)

        if "rope_freqs.weight" in self._tensors:
            raise UnsupportedConfigError(
                "rope_freqs.weight",
                "per-frequency RoPE factors (llama3-style scaling stored as a tensor)",
                "files without it; load the Hugging Face safetensors folder instead",
            )
        if "blk.0.attn_output.bias" in self._tensors:
            raise UnsupportedConfigError("blk.0.attn_output.bias", "present", "no o_proj bias")

        hidden = int_field("embedding_length")
        heads = int_field("attention.head_count")
        embed = self._tensors.get("token_embd.weight")
        vocab_default = self.tensor_shape("token_embd.weight")[0] if embed is not None else None
        eos = self.get("tokenizer.ggml.eos_token_id")
        return ArchConfig(
            architecture=arch,
            vocab_size=int_field("vocab_size", vocab_default),
            hidden_size=hidden,
            intermediate_size=int_field("feed_forward_length"),
            num_layers=int_field("block_count"),
            num_heads=heads,
            num_kv_heads=int_field("attention.head_count_kv", heads),
            head_dim=int_field("attention.key_length", hidden // heads if heads else 0),
            rms_norm_eps=float_field("attention.layer_norm_rms_epsilon"),
            rope_theta=float_field("rope.freq_base", 10000.0),
            rope_scaling=self._rope_scaling(arch),
            max_position_embeddings=int_field("context_length"),
            # llama.cpp writes output.weight only when it differs from the embedding
            tie_word_embeddings="output.weight" not in self._tensors,
            attention_bias="blk.0.attn_q.bias" in self._tensors,
            qk_norm="blk.0.attn_q_norm.weight" in self._tensors,
            bos_token_id=self.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
            pad_token_id=self.get("tokenizer.ggml.padding_token_id"),
        )

    def _rope_scaling(self, arch: str) -> RopeScaling | None:
        kind = self.get(f"{arch}.rope.scaling.type", "none")
        if kind == "none":
            return None
        if kind not in ("linear", "yarn"):
            raise UnsupportedConfigError(
                f"{arch}.rope.scaling.type", kind, ("none", "linear", "yarn")
            )
        factor = self.get(f"{arch}.rope.scaling.factor")
        if factor is None:
            raise MissingConfigFieldError(f"{arch}.rope.scaling.factor", "the GGUF metadata")
        original = self.get(f"{arch}.rope.scaling.original_context_length")
        beta_fast = self.get(f"{arch}.rope.scaling.yarn_beta_fast")
        beta_slow = self.get(f"{arch}.rope.scaling.yarn_beta_slow")
        return RopeScaling(
            kind="linear" if kind == "linear" else "yarn",
            factor=float(factor),
            original_max_position_embeddings=None if original is None else int(original),
            beta_fast=None if beta_fast is None else float(beta_fast),
            beta_slow=None if beta_slow is None else float(beta_slow),
        )

    # tensors ----------------------------------------------------------------------------

    def tensors(self, config: ArchConfig | None = None) -> dict[str, np.ndarray]:
        """Every tensor as float32 under its HF name, checked against ``config`` first."""
        config = config or self.arch_config()
        where = self.path.name
        hf_of: dict[str, str] = {}
        unknown = []
        for name in self._tensors:
            hf_name = gguf_to_hf_name(name)
            if hf_name is None:
                unknown.append(name)
            else:
                hf_of[hf_name] = name
        if unknown:
            raise UnexpectedTensorError(unknown[0], unknown, where)
        shapes = {hf: self.tensor_shape(g) for hf, g in hf_of.items()}
        names = check_tensor_shapes(shapes, config, where=where)

        out: dict[str, np.ndarray] = {}
        for hf_name in names:
            gguf_name = hf_of[hf_name]
            w = self._dequantize(self._tensors[gguf_name], shapes[hf_name])
            if config.architecture == "llama":
                if gguf_name.endswith(".attn_q.weight"):
                    w = unpermute_rope_rows(w, config.num_heads)
                elif gguf_name.endswith(".attn_k.weight"):
                    w = unpermute_rope_rows(w, config.num_kv_heads)
            out[hf_name] = w
        return out

    def _dequantize(self, tensor: ReaderTensor, shape: Shape) -> np.ndarray:
        qtype = GGMLQuantizationType(tensor.tensor_type)
        try:
            values = dequantize(np.asarray(tensor.data), qtype)
        except NotImplementedError as err:
            raise TensorDTypeError(
                tensor.name, qtype.name, self.path.name, ["F32", "F16", "BF16", "Q*/K/IQ quants"]
            ) from err
        if values.size != int(np.prod(shape)):
            raise CorruptFileError(
                str(self.path),
                f"tensor {tensor.name!r} holds {values.size} values, its shape {list(shape)} "
                f"needs {int(np.prod(shape))}",
            )
        # A fresh, writable float32 array: nothing keeps the file's memory map alive.
        return np.array(values.reshape(shape), dtype=np.float32, copy=True)


def load_gguf(path: str | Path) -> tuple[ArchConfig, dict[str, np.ndarray]]:
    """The `ArchConfig` and float32 HF-named tensors of one GGUF file."""
    file = GGUFFile(path)
    config = file.arch_config()
    return config, file.tensors(config)
