"""Exported folders load in transformers and in our own loader, with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.pretrained import load_checkpoint
from rl_core.pretrained.export import export_hf, hf_config, write_tensors
from rl_core.pretrained.sources import load_pretrained
from rl_core.pretrained.weights import model_to_tensors
from tests.rl_core.models.hf_reference import hf_logits, our_logits
from tests.rl_core.pretrained.conftest import VARIED_TEXT, TinyModel
from tests.rl_core.pretrained.conftest import tiny_models as tiny_models


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_export_round_trips_through_transformers(
    arch: str, tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = load_pretrained(f"hf:{tiny_models[arch].path}")
    out = export_hf(model, tmp_path / "export", tokenizer=tokenizer)  # type: ignore[arg-type]
    ids = tokenizer.encode(VARIED_TEXT[:50])
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(
        our_logits(model, [ids], pad=64)[0], hf_logits(theirs, ids), atol=1e-4
    )
    assert AutoTokenizer.from_pretrained(out).encode(VARIED_TEXT) == tokenizer.encode(VARIED_TEXT)
    again = load_checkpoint(f"hf:{out}")  # and our own loader reads it back, bit for bit
    assert again.chat_template == load_checkpoint(f"hf:{tiny_models[arch].path}").chat_template
    for name, value in model_to_tensors(model).items():
        np.testing.assert_array_equal(again.tensors[name], value, err_msg=name)


def test_a_random_init_preset_exports_without_a_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = Model(ModelConfig.tiny(vocab_size=97, tie_embeddings=False), rngs=nnx.Rngs(1))
    out = export_hf(model, tmp_path)
    assert not (out / "tokenizer.json").exists()
    ids = [3, 14, 15, 92, 65, 35]
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(
        our_logits(model, [ids], pad=8)[0], hf_logits(theirs, ids), atol=1e-5
    )


def test_configs_transformers_cannot_express_are_refused() -> None:
    with pytest.raises(ValueError, match="qwen2"):
        hf_config(ModelConfig.tiny(vocab_size=10, qkv_bias=True))
    with pytest.raises(ValueError, match="qk_norm"):
        hf_config(ModelConfig.tiny(vocab_size=10, qk_norm=True))


def test_untie_writes_a_tied_model_as_an_untied_one_of_the_same_function(tmp_path: Path) -> None:
    """What vLLM serves: its in-place weight reload skips a tied LM head."""
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    model = Model(ModelConfig.tiny(vocab_size=97), rngs=nnx.Rngs(2))
    out = export_hf(model, tmp_path, untie=True)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    tensors = load_file(str(out / "model.safetensors"))
    np.testing.assert_array_equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    ids = [3, 14, 15, 92, 65, 35]
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(
        our_logits(model, [ids], pad=8)[0], hf_logits(theirs, ids), atol=1e-5
    )


def test_an_alibi_model_is_refused_with_the_reason(tmp_path: Path) -> None:
    """No Hugging Face family adds ALiBi to RoPE: a file that dropped it would load as a
    different model, so export refuses instead (and with it a vLLM server for the run)."""
    config = ModelConfig.tiny_alibi()
    with pytest.raises(ValueError, match="ALiBi"):
        hf_config(config)
    with pytest.raises(ValueError, match="tiny-alibi"):
        export_hf(Model(config, rngs=nnx.Rngs(0)), tmp_path / "out")
    assert not (tmp_path / "out" / "config.json").exists()


def test_a_fortran_ordered_tensor_is_written_as_its_values_not_its_buffer(tmp_path: Path) -> None:
    """numpy lays ``W + delta.T`` out in Fortran order for some sizes (a LoRA merge of
    SmolLM2's 576 x 576 projections did); safetensors writes the buffer as it lies."""
    from safetensors.numpy import load_file

    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = write_tensors({"w": np.asfortranarray(value)}, tmp_path, untie=False)
    np.testing.assert_array_equal(load_file(str(path))["w"], value)
