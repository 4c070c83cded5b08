"""The tensors an `ArchConfig` implies, under their Hugging Face names, and the check against them.

Names and shapes are transformers' (``torch.nn.Linear`` weights are ``[out, in]``)::

    model.embed_tokens.weight                      [V, D]
    model.layers.{i}.input_layernorm.weight        [D]
    model.layers.{i}.self_attn.q_proj.weight       [H * hd, D]     (+ .bias [H * hd]  *)
    model.layers.{i}.self_attn.k_proj.weight       [KV * hd, D]    (+ .bias [KV * hd] *)
    model.layers.{i}.self_attn.v_proj.weight       [KV * hd, D]    (+ .bias [KV * hd] *)
    model.layers.{i}.self_attn.o_proj.weight       [D, H * hd]
    model.layers.{i}.self_attn.q_norm.weight       [hd]            (if qk_norm)
    model.layers.{i}.self_attn.k_norm.weight       [hd]            (if qk_norm)
    model.layers.{i}.post_attention_layernorm.weight [D]
    model.layers.{i}.mlp.gate_proj.weight          [I, D]
    model.layers.{i}.mlp.up_proj.weight            [I, D]
    model.layers.{i}.mlp.down_proj.weight          [D, I]
    model.norm.weight                              [D]
    lm_head.weight                                 [V, D]          (absent if tie_word_embeddings)

(* the biases exist if ``attention_bias``, i.e. for Qwen2.)

The check runs on shapes alone, so it happens before any tensor data is read.
"""

from __future__ import annotations

from collections.abc import Mapping

from rl_core.pretrained.errors import MissingTensorError, TensorShapeError, UnexpectedTensorError
from rl_core.pretrained.hf_config import ArchConfig

Shape = tuple[int, ...]

LM_HEAD = "lm_head.weight"
EMBED = "model.embed_tokens.weight"

# Buffers some older checkpoints saved next to the parameters; they carry no information.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def expected_tensor_shapes(config: ArchConfig) -> dict[str, Shape]:
    """Every tensor a checkpoint of ``config`` holds, name -> shape, in model order."""
    d, v, i, hd = config.hidden_size, config.vocab_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    shapes: dict[str, Shape] = {EMBED: (v, d)}
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes[p + "self_attn.q_proj.weight"] = (q, d)
        shapes[p + "self_attn.k_proj.weight"] = (kv, d)
        shapes[p + "self_attn.v_proj.weight"] = (kv, d)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q,)
            shapes[p + "self_attn.k_proj.bias"] = (kv,)
            shapes[p + "self_attn.v_proj.bias"] = (kv,)
        shapes[p + "self_attn.o_proj.weight"] = (d, q)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (i, d)
        shapes[p + "mlp.up_proj.weight"] = (i, d)
        shapes[p + "mlp.down_proj.weight"] = (d, i)
    shapes["model.norm.weight"] = (d,)
    if not config.tie_word_embeddings:
        shapes[LM_HEAD] = (v, d)
    return shapes


def check_tensor_shapes(found: Mapping[str, Shape], config: ArchConfig, *, where: str) -> list[str]:
    """Check ``found`` (name -> shape) against ``config``; return the names to load.

    Tolerated and left out of the result: ``lm_head.weight`` of a tied model (some exporters
    write the shared matrix twice) and RoPE ``inv_freq`` buffers. Raises `MissingTensorError`,
    `UnexpectedTensorError` or `TensorShapeError` naming the first offending tensor.
    """
    expected = expected_tensor_shapes(config)
    missing = [name for name in expected if name not in found]
    if missing:
        raise MissingTensorError(missing[0], missing, where)
    ignored = {LM_HEAD} if config.tie_word_embeddings else set()
    unexpected = [
        name
        for name in found
        if name not in expected and name not in ignored and not name.endswith(_IGNORED_SUFFIXES)
    ]
    if unexpected:
        raise UnexpectedTensorError(sorted(unexpected)[0], sorted(unexpected), where)
    for name, shape in expected.items():
        if tuple(found[name]) != shape:
            raise TensorShapeError(name, shape, tuple(found[name]), where)
    return list(expected)
