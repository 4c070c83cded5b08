"""Logits of the NNX model on real and tiny random checkpoints vs transformers (float32, CPU).

SmolLM2: our GGUF load is already proven equal to transformers' own reading of the file
(tests/rl_core/pretrained/test_gguf.py), so the reference here is transformers' Llama
holding those same tensors: it tests the forward pass without paying ~35 s for
transformers to parse the GGUF a second time. The tiny models are loaded by transformers
from their own folders.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rl_core.pretrained import Checkpoint, load_checkpoint
from rl_core.pretrained.hf_config import model_config
from rl_core.pretrained.weights import model_from_tensors
from tests.rl_core.models.hf_reference import hf_logits, hf_model_from_tensors, our_logits
from tests.rl_core.pretrained.conftest import VARIED_TEXT, TinyModel

PROMPTS = [
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
    VARIED_TEXT[:60],
    "def add(a, b):\n    return",
]


def assert_parity(ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    for o, t in zip(ours, theirs, strict=True):
        assert o.shape == t.shape
        assert float(np.max(np.abs(o - t))) <= 1e-3
        assert np.array_equal(np.argmax(o, axis=-1), np.argmax(t, axis=-1))


def test_smollm2_logits_equal_transformers(smollm2: Checkpoint) -> None:
    prompts = [smollm2.tokenizer.encode(p) for p in PROMPTS]
    assert all(2 <= len(p) <= 48 for p in prompts)
    model = model_from_tensors(model_config(smollm2.config), smollm2.tensors)
    ours = our_logits(model, prompts, pad=48)
    reference = hf_model_from_tensors(smollm2.config, smollm2.tensors)
    assert_parity(ours, [hf_logits(reference, p) for p in prompts])


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_tiny_random_models_equal_transformers(
    arch: str, tiny_models: dict[str, TinyModel]
) -> None:
    from transformers import AutoModelForCausalLM

    tiny = tiny_models[arch]
    ckpt = load_checkpoint(f"hf:{tiny.path}")
    model = model_from_tensors(model_config(ckpt.config), ckpt.tensors)
    prompts = [ckpt.tokenizer.encode(p) for p in PROMPTS]
    reference = AutoModelForCausalLM.from_pretrained(tiny.path).eval()
    assert_parity(our_logits(model, prompts, pad=64), [hf_logits(reference, p) for p in prompts])


def _rope_variant_dir(tmp_path: Any, rope: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tests.rl_core.pretrained.conftest import _build_tokenizer

    config = LlamaConfig(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,  # the prompts run past it: dynamic scaling kicks in
        bos_token_id=0,
        eos_token_id=2,
        rope_parameters={"rope_theta": 10000.0, **rope},
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    _build_tokenizer(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
        {"rope_type": "yarn", "factor": 2.0, "beta_fast": 16.0, "attention_factor": 1.3},
    ],
    ids=["linear", "dynamic", "yarn", "yarn-explicit"],
)
def test_rope_scaling_variants_equal_transformers(tmp_path: Any, rope: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM

    path = _rope_variant_dir(tmp_path, rope)
    ckpt = load_checkpoint(f"hf:{path}")
    assert ckpt.config.rope_scaling is not None
    model = model_from_tensors(model_config(ckpt.config), ckpt.tensors)
    reference = AutoModelForCausalLM.from_pretrained(path).eval()
    # One unpadded prompt past max_position_embeddings: dynamic NTK depends on the length.
    ids = ckpt.tokenizer.encode(VARIED_TEXT[:60])
    assert len(ids) > 16
    assert_parity(our_logits(model, [ids], pad=len(ids)), [hf_logits(reference, ids)])
