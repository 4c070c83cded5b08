"""transformers (PyTorch, CPU, float32) as the reference forward of a loaded checkpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.models import Model
from rl_core.pretrained import ArchConfig


def hf_model_from_tensors(config: ArchConfig, tensors: Mapping[str, np.ndarray]) -> Any:
    """A transformers model of ``config`` holding ``tensors`` (built on meta: no random init)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    assert config.rope_scaling is None, "only plain RoPE checkpoints are rebuilt here"
    hf_config = AutoConfig.for_model(
        config.architecture,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    # The RoPE frequencies are a buffer, not in the state dict: rebuild them off meta.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=hf_config)
    return model.eval()


def hf_logits(model: Any, ids: Sequence[int]) -> np.ndarray:  # [T] -> [T, V]
    import torch

    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), use_cache=False)
    return np.asarray(out.logits[0].float().numpy())


@nnx.jit
def _forward(model: Model, tokens: jax.Array) -> jax.Array:  # [B, T] -> [B, T, V]
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return model(tokens, positions)[0]


def our_logits(model: Model, prompts: Sequence[Sequence[int]], *, pad: int) -> list[np.ndarray]:
    """Logits of each prompt, [T_i, V]; one forward, right-padded to ``pad`` (causal: harmless)."""
    tokens = np.zeros((len(prompts), pad), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    out = np.asarray(_forward(model, jnp.asarray(tokens)))
    return [out[i, : len(p)] for i, p in enumerate(prompts)]
