"""Tokenizers: the `Tokenizer` protocol and the builtin vocabulary of random-init models.

The chat format is the same for every tokenizer the agent sees::

    <|user|>Guess the number between 1 and 8.<|end|><|assistant|>5<|end|><|user|>lower<|end|>...

A turn is a role marker, the content, and ``<|end|>``. The model ends its own
turn by emitting ``<|end|>`` (or ``<eos>``), so that token is model-produced and
trained on; everything else in the ledger comes from `render_messages` and
`assistant_prefix`.

Pure Python: importing this module does not start JAX.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

Message = Mapping[str, Any]  # {"role": "system|user|assistant|tool", "content": str, ...}

ROLES = ("system", "user", "assistant", "tool")


@runtime_checkable
class Tokenizer(Protocol):
    """What the agent, the engine and the trainer need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def pad_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    @property
    def end_of_turn_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str: ...

    def render_messages(self, messages: Sequence[Message]) -> list[int]:
        """Whole turns (role marker, content, end of turn), for a prompt or an observation."""
        ...

    def assistant_prefix(self) -> list[int]:
        """The tokens that open the assistant's turn; the model continues from here."""
        ...


_SPECIALS = (
    "<pad>",
    "<eos>",
    "<unk>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|end|>",
)
# Whole words of the built-in game's text: they make prompts and observations a
# few tokens long instead of dozens, which is most of what a tiny model has to
# read. No word holds a digit, so numbers are always spelled digit by digit.
_WORDS = (
    "Guess",
    " the",
    " number",
    " between",
    " and",
    " from",
    " to",
    "Answer",
    " with",
    " a",
    "higher",
    "lower",
    "correct",
)
_CHARS = tuple(string.digits + string.ascii_letters + string.punctuation + " \n")


class BuiltinTokenizer:
    """A small, fixed, file-free vocabulary: specials, a few game words, then characters.

    Encoding is greedy longest match over the words, falling back to single
    characters and ``<unk>``; it is deterministic and needs no files, which is
    what ``builtin:*`` models need (about 120 tokens).
    """

    def __init__(self) -> None:
        self._pieces: tuple[str, ...] = _SPECIALS + _WORDS + _CHARS
        self._ids = {piece: i for i, piece in enumerate(self._pieces)}
        self._n_special = len(_SPECIALS)
        self._role_ids = {role: self._ids[f"<|{role}|>"] for role in ROLES}
        # Greedy longest match in one compiled scan: at each position the regex tries the
        # words longest first, then any single character (a Python loop over the words at
        # every position was most of the collector's event loop, bench B1).
        words = sorted(_WORDS, key=len, reverse=True)
        self._scanner = re.compile("|".join(map(re.escape, words)) + "|.", re.DOTALL)
        # The agent renders the whole conversation again every turn, so most texts it
        # encodes (the prompt, earlier observations and answers) were encoded before.
        self._encode_cached = functools.lru_cache(maxsize=8192)(self._encode_text)

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def pieces(self) -> tuple[str, ...]:
        """Every token's text, by id."""
        return self._pieces

    @property
    def special_pieces(self) -> tuple[str, ...]:
        return _SPECIALS

    @property
    def words(self) -> tuple[str, ...]:
        """The whole words a text is cut into before single characters (the longest that fits)."""
        return _WORDS

    @property
    def pad_id(self) -> int:
        return self._ids["<pad>"]

    @property
    def eos_id(self) -> int:
        return self._ids["<eos>"]

    @property
    def unk_id(self) -> int:
        return self._ids["<unk>"]

    @property
    def end_of_turn_id(self) -> int:
        return self._ids["<|end|>"]

    def token_id(self, piece: str) -> int:
        return self._ids[piece]

    def encode(self, text: str) -> list[int]:
        return list(self._encode_cached(text))

    def _encode_text(self, text: str) -> tuple[int, ...]:
        ids, unk = self._ids, self.unk_id
        return tuple(ids.get(piece, unk) for piece in self._scanner.findall(text))

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self._pieces):
                raise ValueError(f"token id {i} is outside the vocabulary of {self.vocab_size}")
            if skip_special and i < self._n_special:
                continue
            out.append(self._pieces[i])
        return "".join(out)

    def render_messages(self, messages: Sequence[Message]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            role = message.get("role")
            if role not in self._role_ids:
                raise ValueError(f"message role {role!r} is not one of {ROLES}")
            ids.append(self._role_ids[role])
            ids.extend(self.encode(str(message.get("content") or "")))
            ids.append(self.end_of_turn_id)
        return ids

    def assistant_prefix(self) -> list[int]:
        return [self._role_ids["assistant"]]
