"""Tokenizers: ids equal transformers' for the SmolLM2 GGUF and for a tokenizer.json folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_core.pretrained import Checkpoint, TokenizerError, load_checkpoint
from tests.rl_core.pretrained.conftest import VARIED_TEXT, TinyModel, write_tiny_gguf


def _samples() -> list[str]:
    return [VARIED_TEXT, *VARIED_TEXT.splitlines(keepends=True), "", " ", "  \n\n  x", "00042"]


def test_smollm2_ids_equal_transformers(smollm2: Checkpoint, hf_smollm2_tokenizer: Any) -> None:
    ours, theirs = smollm2.tokenizer, hf_smollm2_tokenizer
    for text in _samples():
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text), text
        assert ours.decode(ids, skip_special=False) == theirs.decode(ids) == text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert len(ours.encode(VARIED_TEXT)) > 100


def test_smollm2_special_tokens_equal_transformers(
    smollm2: Checkpoint, hf_smollm2_tokenizer: Any
) -> None:
    ours, theirs = smollm2.tokenizer, hf_smollm2_tokenizer
    assert ours.vocab_size == len(theirs) == 49152
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (1, 2, 2)
    assert ours.bos_id == theirs.bos_token_id and ours.eos_id == theirs.eos_token_id
    assert ours.pad_id == theirs.pad_token_id and ours.unk_id == theirs.unk_token_id
    assert ours.token_to_id("<|im_start|>") == 1 and ours.token_to_id("no such token") is None
    assert ours.encode("<|im_start|>user") == [1, ours.token_to_id("user")]


def test_tokenizer_json_ids_equal_transformers(tiny_models: dict[str, TinyModel]) -> None:
    from transformers import AutoTokenizer

    path = tiny_models["qwen2"].path
    ours = load_checkpoint(f"hf:{path}").tokenizer
    theirs = AutoTokenizer.from_pretrained(path)
    for text in _samples():
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
    assert ours.eos_id == theirs.eos_token_id == 2
    assert ours.pad_id == theirs.pad_token_id == 0
    assert ours.bos_id == theirs.bos_token_id == 0
    assert ours.special_tokens["eos_token"] == "<|im_end|>"


def test_unknown_gguf_pre_tokenizer_fails_naming_it(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    path = write_tiny_gguf(tmp_path / "odd.gguf", tiny_models["qwen2"], pre="mystery-bpe")
    with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.pre = 'mystery-bpe'"):
        load_checkpoint(f"gguf:{path}")


def test_missing_tokenizer_json_fails(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    import shutil

    target = tmp_path / "m"
    shutil.copytree(tiny_models["qwen3"].path, target)
    (target / "tokenizer.json").unlink()
    with pytest.raises(TokenizerError, match=r"tokenizer\.json"):
        load_checkpoint(f"hf:{target}")
