"""GGUF: the shipped SmolLM2 file against transformers, and tiny files written with GGUFWriter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rl_core.pretrained import (
    Checkpoint,
    CheckpointSourceError,
    CorruptFileError,
    MissingTensorError,
    UnsupportedConfigError,
    load_checkpoint,
)
from rl_core.pretrained.gguf import GGUFFile, load_gguf, permute_rope_rows, unpermute_rope_rows
from tests.rl_core.pretrained.conftest import VARIED_TEXT, TinyModel, write_tiny_gguf


def test_smollm2_tensors_equal_transformers_state_dict(
    smollm2: Checkpoint, hf_smollm2_model: Any
) -> None:
    theirs = {k: v.detach().numpy() for k, v in hf_smollm2_model.state_dict().items()}
    # transformers lists the tied lm_head under its own name; it is the embedding matrix.
    assert np.array_equal(theirs["lm_head.weight"], theirs["model.embed_tokens.weight"])
    assert set(smollm2.tensors) == set(theirs) - {"lm_head.weight"}
    assert len(smollm2.tensors) == 272
    for name, value in smollm2.tensors.items():
        assert value.dtype == np.float32, name
        assert value.shape == theirs[name].shape, name
        assert float(np.max(np.abs(value - theirs[name]))) <= 1e-6, name


def test_smollm2_config_equals_transformers(smollm2: Checkpoint, hf_smollm2_model: Any) -> None:
    ours, theirs = smollm2.config, hf_smollm2_model.config
    assert ours.architecture == theirs.model_type == "llama"
    assert ours.vocab_size == theirs.vocab_size == 49152
    assert ours.hidden_size == theirs.hidden_size == 576
    assert ours.intermediate_size == theirs.intermediate_size == 1536
    assert ours.num_layers == theirs.num_hidden_layers == 30
    assert ours.num_heads == theirs.num_attention_heads == 9
    assert ours.num_kv_heads == theirs.num_key_value_heads == 3
    assert ours.head_dim == theirs.head_dim == 64
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 100000.0
    assert ours.rope_scaling is None and theirs.rope_parameters["rope_type"] == "default"
    assert ours.max_position_embeddings == theirs.max_position_embeddings == 8192
    assert ours.tie_word_embeddings is theirs.tie_word_embeddings is True
    assert ours.attention_bias is theirs.attention_bias is False
    assert ours.qk_norm is False
    assert ours.bos_token_id == theirs.bos_token_id == 1
    assert ours.eos_token_id == theirs.eos_token_id == 2
    assert ours.pad_token_id == theirs.pad_token_id == 2


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3 * 8, 5)).astype(np.float32)  # 3 heads of head_dim 8
    permuted = permute_rope_rows(w, 3)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(unpermute_rope_rows(permuted, 3), w)
    # GGUF row h*hd + 2j + s holds HF row h*hd + s*hd/2 + j (here h=1, j=1, s=1)
    assert np.array_equal(permuted[8 + 2 * 1 + 1], w[8 + 4 + 1])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_round_trips_to_the_hf_tensors(
    arch: str, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    model = tiny_models[arch]
    half = "model.layers.1.mlp.up_proj.weight"
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", model, f16=(half,))
    config, tensors = load_gguf(path)
    assert config.architecture == arch
    assert config.tie_word_embeddings is (arch != "llama")
    assert config.attention_bias is (arch == "qwen2")
    assert config.qk_norm is (arch == "qwen3")
    assert config.head_dim == (16 if arch == "qwen3" else 8)
    assert set(tensors) == set(model.tensors)
    for name, value in model.tensors.items():
        want = value.astype(np.float16).astype(np.float32) if name == half else value
        assert tensors[name].dtype == np.float32
        assert np.array_equal(tensors[name], want), name


def test_gguf_tokenizer_matches_the_tokenizer_json(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    model = tiny_models["qwen2"]
    from_gguf = load_checkpoint(f"gguf:{write_tiny_gguf(tmp_path / 'q.gguf', model)}")
    from_dir = load_checkpoint(f"hf:{model.path}")
    assert from_gguf.tokenizer.encode(VARIED_TEXT) == from_dir.tokenizer.encode(VARIED_TEXT)
    assert from_gguf.tokenizer.eos_id == from_dir.tokenizer.eos_id == 2
    assert from_gguf.chat_template == from_dir.chat_template


def test_truncated_gguf_fails_naming_the_file(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_models["llama"])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CorruptFileError, match=r"tiny\.gguf"):
        load_gguf(path)


def test_gguf_of_another_architecture_fails_naming_the_field(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    path = write_tiny_gguf(tmp_path / "falcon.gguf", tiny_models["llama"], arch="falcon")
    with pytest.raises(UnsupportedConfigError, match=r"general\.architecture") as info:
        load_gguf(path)
    assert info.value.field == "general.architecture"


def test_gguf_missing_a_tensor_fails_naming_it(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    name = "model.layers.1.self_attn.v_proj.weight"
    path = write_tiny_gguf(tmp_path / "holey.gguf", tiny_models["qwen2"], drop=(name,))
    with pytest.raises(MissingTensorError, match=name.replace(".", r"\.")):
        load_gguf(path)


def test_missing_gguf_file_fails() -> None:
    with pytest.raises(CheckpointSourceError, match="does not exist"):
        GGUFFile("/nonexistent/model.gguf")
