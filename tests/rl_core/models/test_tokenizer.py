from __future__ import annotations

import random

import pytest

from rl_core.models.tokenizer import _CHARS, _WORDS, BuiltinTokenizer, Tokenizer


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


def greedy_reference(tokenizer: BuiltinTokenizer, text: str) -> list[int]:
    """The definition: at each position the longest game word that starts there, else the
    character (or <unk>)."""
    words = sorted(_WORDS, key=len, reverse=True)
    ids, i = [], 0
    while i < len(text):
        word = next((w for w in words if text.startswith(w, i)), None)
        piece = word or text[i]
        ids.append(tokenizer.token_id(piece) if piece in _WORDS or piece in _CHARS else -1)
        ids[-1] = tokenizer.unk_id if ids[-1] < 0 else ids[-1]
        i += len(piece)
    return ids


def test_encoding_is_the_greedy_longest_match_on_random_text(tokenizer: BuiltinTokenizer) -> None:
    rng = random.Random(0)
    alphabet = [*_WORDS, *_WORDS, " th", "numb", "é", "\n", *"aeh nrt12.\n"]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert tokenizer.encode(text) == greedy_reference(tokenizer, text), text


def test_an_encoding_is_the_callers_to_change(tokenizer: BuiltinTokenizer) -> None:
    ids = tokenizer.encode("Guess 12")
    ids.append(0)
    assert tokenizer.encode("Guess 12") == ids[:-1]


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
