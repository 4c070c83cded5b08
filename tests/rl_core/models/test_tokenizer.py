from __future__ import annotations

import pytest

from rl_core.models.tokenizer import BuiltinTokenizer, Tokenizer


def test_is_a_tokenizer(tokenizer: BuiltinTokenizer) -> None:
    assert isinstance(tokenizer, Tokenizer)
    assert len({tokenizer.pad_id, tokenizer.eos_id, tokenizer.end_of_turn_id}) == 3


@pytest.mark.parametrize("text", ["Guess the number between 1 and 8.", "lower", "a{b}\n 42!", ""])
def test_round_trip(tokenizer: BuiltinTokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


def test_game_words_are_single_tokens_and_digits_are_not_merged(
    tokenizer: BuiltinTokenizer,
) -> None:
    assert len(tokenizer.encode("higher")) == 1
    assert tokenizer.encode("12") == tokenizer.encode("1") + tokenizer.encode("2")


def test_unknown_characters_become_unk(tokenizer: BuiltinTokenizer) -> None:
    assert tokenizer.encode("é") == [tokenizer.unk_id]


def test_chat_rendering(tokenizer: BuiltinTokenizer) -> None:
    ids = tokenizer.render_messages([{"role": "user", "content": "hi"}])
    assert ids == [
        tokenizer.token_id("<|user|>"),
        *tokenizer.encode("hi"),
        tokenizer.end_of_turn_id,
    ]
    assert tokenizer.decode(ids, skip_special=False) == "<|user|>hi<|end|>"
    assert tokenizer.assistant_prefix() == [tokenizer.token_id("<|assistant|>")]
    with pytest.raises(ValueError, match="role"):
        tokenizer.render_messages([{"role": "narrator", "content": "x"}])
