"""config.json parsing: transformers' own configs, both RoPE layouts, and the errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rl_core.pretrained import (
    ConfigError,
    MissingConfigFieldError,
    RopeScaling,
    UnsupportedConfigError,
    parse_hf_config,
)
from tests.rl_core.pretrained.conftest import TinyModel

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _base(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "model_type": "llama",
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1024,
        "eos_token_id": [5, 6],
    }
    raw.update(over)
    return {k: v for k, v in raw.items() if v is not None}


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_tiny_configs_equal_transformers_values(
    arch: str, tiny_models: dict[str, TinyModel]
) -> None:
    from transformers import AutoConfig

    path = tiny_models[arch].path
    ours = parse_hf_config(json.loads((path / "config.json").read_text()))
    theirs = AutoConfig.from_pretrained(path)
    assert ours.architecture == theirs.model_type == arch
    assert ours.vocab_size == theirs.vocab_size
    assert ours.hidden_size == theirs.hidden_size
    assert ours.intermediate_size == theirs.intermediate_size
    assert ours.num_layers == theirs.num_hidden_layers
    assert ours.num_heads == theirs.num_attention_heads
    assert ours.num_kv_heads == theirs.num_key_value_heads
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert ours.head_dim == head_dim == (16 if arch == "qwen3" else 8)
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings
    assert ours.attention_bias is (arch == "qwen2")
    assert ours.qk_norm is (arch == "qwen3")
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
    if arch == "llama":
        params = theirs.rope_parameters
        assert ours.rope_scaling == RopeScaling(
            kind="llama3",
            factor=params["factor"],
            low_freq_factor=params["low_freq_factor"],
            high_freq_factor=params["high_freq_factor"],
            original_max_position_embeddings=params["original_max_position_embeddings"],
        )
    else:
        assert ours.rope_scaling is None


@pytest.mark.parametrize("scaling", [None, LLAMA3_ROPE, {"type": "linear", "factor": 2.0}])
def test_old_and_new_rope_layouts_parse_the_same(scaling: dict[str, Any] | None) -> None:
    old = _base(rope_theta=500000.0, rope_scaling=scaling)
    new_params = {"rope_theta": 500000.0, **(scaling or {"rope_type": "default"})}
    if "type" in new_params:
        new_params["rope_type"] = new_params.pop("type")
    new = _base(rope_parameters=new_params)
    assert parse_hf_config(old) == parse_hf_config(new)
    config = parse_hf_config(new)
    assert config.rope_theta == 500000.0
    assert config.eos_token_ids == (5, 6) and config.eos_token_id == 5
    if scaling is None:
        assert config.rope_scaling is None
    else:
        assert config.rope_scaling is not None
        assert config.rope_scaling.kind == new_params["rope_type"]


def test_yarn_and_dynamic_scaling_parse() -> None:
    yarn = parse_hf_config(
        _base(
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
                "beta_fast": 32,
            }
        )
    ).rope_scaling
    assert yarn == RopeScaling(
        kind="yarn", factor=4.0, original_max_position_embeddings=32768, beta_fast=32.0
    )
    dynamic = parse_hf_config(_base(rope_scaling={"type": "dynamic", "factor": 2})).rope_scaling
    assert dynamic == RopeScaling(kind="dynamic", factor=2.0)


def test_defaults_follow_transformers() -> None:
    config = parse_hf_config(
        _base(num_key_value_heads=None, rms_norm_eps=None, max_position_embeddings=None)
    )
    assert config.num_kv_heads == 4
    assert config.rms_norm_eps == 1e-6
    assert config.rope_theta == 10000.0
    assert config.max_position_embeddings == 2048
    assert config.tie_word_embeddings is False


def test_architectures_list_is_used_without_model_type() -> None:
    config = parse_hf_config(_base(model_type=None, architectures=["Qwen3ForCausalLM"]))
    assert config.architecture == "qwen3" and config.qk_norm


@pytest.mark.parametrize(
    ("raw", "error", "field"),
    [
        (_base(hidden_size=None), MissingConfigFieldError, "hidden_size"),
        (_base(num_hidden_layers=None), MissingConfigFieldError, "num_hidden_layers"),
        (_base(model_type="gpt2"), UnsupportedConfigError, "model_type"),
        (_base(model_type=None), MissingConfigFieldError, "model_type"),
        (_base(hidden_size="64"), ConfigError, "hidden_size"),
        (_base(num_key_value_heads=3), ConfigError, "num_key_value_heads"),
        (_base(attention_bias=True), UnsupportedConfigError, "attention_bias"),
        (_base(hidden_act="gelu"), UnsupportedConfigError, "hidden_act"),
        (
            _base(rope_scaling={"rope_type": "longrope", "factor": 2.0}),
            UnsupportedConfigError,
            "rope_scaling.rope_type",
        ),
        (
            _base(rope_parameters={**LLAMA3_ROPE, "low_freq_factor": None}),
            MissingConfigFieldError,
            "rope_parameters.low_freq_factor",
        ),
    ],
)
def test_bad_configs_fail_naming_the_field(
    raw: dict[str, Any], error: type[ConfigError], field: str
) -> None:
    with pytest.raises(error) as info:
        parse_hf_config(raw)
    assert info.value.field == field
    assert repr(field) in str(info.value)
