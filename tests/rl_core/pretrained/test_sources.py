"""Spec sources to (model, tokenizer), and checkpoints that do not fit the model fail early."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rl_core.errors import UnsupportedModelSource
from rl_core.models import Model
from rl_core.models.tokenizer import Tokenizer
from rl_core.pretrained import (
    MissingTensorError,
    TensorShapeError,
    UnexpectedTensorError,
    UnsupportedConfigError,
    load_checkpoint,
    render_chat_template,
)
from rl_core.pretrained.chat_tokenizer import ChatTokenizer
from rl_core.pretrained.hf_config import model_config
from rl_core.pretrained.sources import load_model
from rl_core.pretrained.weights import model_from_tensors, model_to_tensors
from rl_core.spec import ModelSpec
from tests.rl_core.pretrained.conftest import TinyModel


def test_hf_source_gives_the_model_and_a_chat_tokenizer(tiny_models: dict[str, TinyModel]) -> None:
    tiny = tiny_models["qwen3"]
    model, tokenizer = load_model(ModelSpec(source=f"hf:{tiny.path}"), seed=0)
    assert isinstance(model, Model) and isinstance(tokenizer, Tokenizer)
    c = model.config
    assert (c.architecture, c.qk_norm, c.qkv_bias, c.tie_embeddings) == ("qwen3", True, False, True)
    assert c.head_dim == 16 and c.d_model == 32  # head_dim is not d_model / n_heads here
    ours = model_to_tensors(model)
    assert set(ours) == set(tiny.tensors)
    for name, value in tiny.tensors.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def test_chat_tokenizer_turns_concatenate_to_the_whole_conversation(
    tiny_models: dict[str, TinyModel],
) -> None:
    ckpt = load_checkpoint(f"hf:{tiny_models['qwen2'].path}")
    tok = ChatTokenizer(ckpt.tokenizer, ckpt.chat_template)
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "What is 2 + 2?"}
    answer = {"role": "assistant", "content": "4"}
    follow = {"role": "user", "content": "And 3 + 3?"}
    assert ckpt.chat_template is not None
    whole = render_chat_template(
        ckpt.chat_template,
        [system, user, answer, follow],
        add_generation_prompt=True,
        special_tokens=ckpt.tokenizer.special_tokens,
    )
    # What the agent writes: a prompt, the model's turn, an observation, then the prefix.
    ledger = (
        tok.render_messages([system, user])
        + tok.assistant_prefix()
        + tok.encode("4")
        + [tok.end_of_turn_id]
        + tok.encode("\n")
        + tok.render_messages([follow])
        + tok.assistant_prefix()
    )
    assert tok.decode(ledger, skip_special=False) == whole
    assert tok.end_of_turn_id == ckpt.tokenizer.token_to_id("<|im_end|>")


def test_missing_tensor_fails_naming_it(tiny_models: dict[str, TinyModel]) -> None:
    tensors = dict(tiny_models["qwen2"].tensors)
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    config = model_config(load_checkpoint(f"hf:{tiny_models['qwen2'].path}").config)
    with pytest.raises(MissingTensorError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        model_from_tensors(config, tensors)


def test_wrong_shape_and_unexpected_tensors_fail_naming_them(
    tiny_models: dict[str, TinyModel],
) -> None:
    config = model_config(load_checkpoint(f"hf:{tiny_models['llama'].path}").config)
    tensors = dict(tiny_models["llama"].tensors)
    tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((64, 31), np.float32)
    with pytest.raises(TensorShapeError, match=r"model\.layers\.0\.mlp\.up_proj\.weight"):
        model_from_tensors(config, tensors)
    tensors = dict(tiny_models["llama"].tensors, **{"model.extra.weight": np.zeros(3)})
    with pytest.raises(UnexpectedTensorError, match=r"model\.extra\.weight"):
        model_from_tensors(config, tensors)


def test_unsupported_architecture_fails_before_loading(
    copy_model_dir: Path,
) -> None:
    raw = json.loads((copy_model_dir / "config.json").read_text())
    raw["model_type"] = "gpt2"
    (copy_model_dir / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedConfigError, match="model_type"):
        load_model(ModelSpec(source=f"hf:{copy_model_dir}"), seed=0)


def test_unknown_builtin_preset_fails() -> None:
    with pytest.raises(UnsupportedModelSource, match="presets are"):
        load_model(ModelSpec(source="builtin:huge"), seed=0)
