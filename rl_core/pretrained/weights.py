"""Map Hugging Face tensor names onto the NNX model's parameters, both ways.

Names follow `rl_core.pretrained.layout`; ``torch.nn.Linear`` stores ``[out, in]`` and
``nnx.Linear`` ``[in, out]``, so projection matrices are transposed on the way. A model is
built abstractly (`nnx.eval_shape`: no random init is computed), every parameter is checked
against the tensors by name and shape first, and only then is anything copied to the
device: a checkpoint that does not fit fails before compute is spent.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.models.config import ModelConfig
from rl_core.models.decoder import Model
from rl_core.pretrained.errors import (
    MissingTensorError,
    TensorShapeError,
    UnexpectedTensorError,
)

_BLOCK_NAMES: dict[tuple[str, ...], tuple[str, bool]] = {
    ("attn_norm", "scale"): ("input_layernorm.weight", False),
    ("attn", "q", "kernel"): ("self_attn.q_proj.weight", True),
    ("attn", "k", "kernel"): ("self_attn.k_proj.weight", True),
    ("attn", "v", "kernel"): ("self_attn.v_proj.weight", True),
    ("attn", "o", "kernel"): ("self_attn.o_proj.weight", True),
    ("attn", "q", "bias"): ("self_attn.q_proj.bias", False),
    ("attn", "k", "bias"): ("self_attn.k_proj.bias", False),
    ("attn", "v", "bias"): ("self_attn.v_proj.bias", False),
    ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight", False),
    ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight", False),
    ("mlp_norm", "scale"): ("post_attention_layernorm.weight", False),
    ("mlp", "gate", "kernel"): ("mlp.gate_proj.weight", True),
    ("mlp", "up", "kernel"): ("mlp.up_proj.weight", True),
    ("mlp", "down", "kernel"): ("mlp.down_proj.weight", True),
}
_TOP_NAMES: dict[tuple[str, ...], tuple[str, bool]] = {
    ("embed", "embedding"): ("model.embed_tokens.weight", False),
    ("final_norm", "scale"): ("model.norm.weight", False),
    ("lm_head", "kernel"): ("lm_head.weight", True),
}


def hf_name(path: tuple[object, ...]) -> tuple[str, bool]:
    """The HF tensor name of an NNX parameter path, and whether the matrix is transposed."""
    if path and path[0] == "blocks":
        name, transpose = _BLOCK_NAMES[tuple(str(p) for p in path[2:])]
        return f"model.layers.{path[1]}.{name}", transpose
    return _TOP_NAMES[tuple(str(p) for p in path)]


def model_from_tensors(
    config: ModelConfig, tensors: Mapping[str, np.ndarray], *, where: str = "checkpoint"
) -> Model:
    """A `Model` of ``config`` holding ``tensors`` (HF names); raises naming the bad tensor."""
    abstract = nnx.eval_shape(lambda: Model(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    flat = list(nnx.to_flat_state(state))
    plan = []
    for path, var in flat:
        name, transpose = hf_name(path)
        if name not in tensors:
            missing = [hf_name(p)[0] for p, _ in flat if hf_name(p)[0] not in tensors]
            raise MissingTensorError(name, missing, where)
        array = tensors[name]
        want = tuple(var.shape)
        got = tuple(array.shape[::-1]) if transpose else tuple(array.shape)
        if got != want:
            hf_shape = want[::-1] if transpose else want
            raise TensorShapeError(name, hf_shape, tuple(array.shape), where)
        plan.append((path, var, array, transpose))
    used = {hf_name(p)[0] for p, _ in flat}
    # A tied model may carry a copy of the embedding as lm_head (some exporters write it).
    extra = sorted(n for n in tensors if n not in used and not _ignorable(n, config))
    if extra:
        raise UnexpectedTensorError(extra[0], extra, where)
    loaded = [
        (path, var.replace(jnp.asarray(array.T if transpose else array, var.dtype)))
        for path, var, array, transpose in plan
    ]
    return nnx.merge(graphdef, nnx.from_flat_state(loaded))


def _ignorable(name: str, config: ModelConfig) -> bool:
    return name.endswith("rotary_emb.inv_freq") or (
        config.tie_embeddings and name == "lm_head.weight"
    )


def model_to_tensors(model: Model) -> dict[str, np.ndarray]:
    """The model's parameters under HF names and layouts (float32 numpy), in model order."""
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, transpose = hf_name(path)
        array = np.asarray(var.get_value(), np.float32)
        out[name] = np.ascontiguousarray(array.T if transpose else array)
    return out
