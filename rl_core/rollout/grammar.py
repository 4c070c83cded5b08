"""Grammars on the host: the run's tokenizer as llguidance reads it, and per request a matcher
that says which tokens may come next.

A `Grammar` is llguidance's Lark dialect (``%json {schema}`` embeds a JSON schema). We use
llguidance rather than xgrammar or outlines because: it needs no torch (a Rust core in one
small wheel; the worker runs JAX), one grammar holds both Lark rules and JSON schemas, a
token mask costs tens of microseconds, and vLLM's ``guidance`` structured-output backend is
llguidance, so both engines read the same grammar language.

The engine samples, the host keeps each constrained request's `Constraint`: after every
token it advances the matcher and writes the next token bitmask, which the device applies as
-inf before sampling (`rl_core.rollout.sampling.constrain`). Stop tokens follow the grammar:
masked while it cannot end, allowed once it can, and the only tokens left once it is
finished, so a finished grammar ends its completion on the run's own stop token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llguidance
import numpy as np

from rl_core.errors import RolloutError
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pretrained.chat_tokenizer import ChatTokenizer
from rl_core.pretrained.tokenizers_io import CheckpointTokenizer
from rl_core.rollout.base import Grammar, GrammarError


def words(vocab: int) -> int:
    """32-bit words of a token bitmask over ``vocab`` tokens."""
    return -(-vocab // 32)


class GrammarTokenizer:
    """A run's tokenizer for llguidance, with the engine's stop tokens and the model's vocabulary.

    ``vocab`` is the model's (its logits' width), which may exceed the tokenizer's
    (padded embeddings): tokens past the tokenizer's are never allowed under a grammar.
    Building one costs about half a second for a 49k vocabulary: once per engine.
    """

    def __init__(self, tokenizer: Any, *, vocab: int, stop_ids: Sequence[int]) -> None:
        self.ll = _ll_tokenizer(tokenizer, stop_ids)
        if self.ll.vocab_size > vocab:
            raise RolloutError(
                f"the tokenizer has {self.ll.vocab_size} tokens, more than the model's "
                f"{vocab} logits"
            )
        self.vocab = vocab
        self.words = words(vocab)
        self._ll_bytes = words(self.ll.vocab_size) * 4
        self.stop_ids = tuple(t for t in stop_ids if 0 <= t < vocab)
        # Bits the host sets or clears itself: the run's stop tokens, and llguidance's own
        # end-of-sequence tokens (allowed by it when the grammar accepts; only ours stop).
        self._stop_words = np.asarray([t // 32 for t in self.stop_ids], np.intp)
        self._stop_bits = np.asarray([1 << (t % 32) for t in self.stop_ids], np.int64)
        eos = [t for t in self.ll.eos_tokens if 0 <= t < vocab]
        self._eos_words = np.asarray([t // 32 for t in eos], np.intp)
        self._eos_bits = np.asarray([1 << (t % 32) for t in eos], np.int64)

    def compile(self, grammar: Grammar) -> Constraint:
        """A fresh matcher for ``grammar``; `GrammarError` with llguidance's reason if invalid."""
        matcher = llguidance.LLMatcher(
            self.ll, llguidance.LLMatcher.grammar_from_lark(grammar.lark), log_level=0
        )
        if matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {matcher.get_error()}")
        return Constraint(self, matcher)

    def _write_mask(self, matcher: Any, row: np.ndarray) -> None:
        row[:] = 0
        matcher.unsafe_compute_mask_ptr(row.ctypes.data, self._ll_bytes)
        as_int = row.view(np.uint32)
        for w, b in zip(self._eos_words, self._eos_bits, strict=True):
            as_int[w] &= np.uint32(~int(b) & 0xFFFFFFFF)
        if matcher.is_accepting():
            for w, b in zip(self._stop_words, self._stop_bits, strict=True):
                as_int[w] |= np.uint32(b)


class Constraint:
    """One request's grammar state: which tokens may come next, advanced token by token."""

    def __init__(self, tokenizer: GrammarTokenizer, matcher: Any) -> None:
        self._tok = tokenizer
        self._matcher = matcher

    def mask_into(self, row: np.ndarray) -> None:  # row [words(vocab)] int32, C-contiguous
        """Write the bitmask of the tokens allowed next (stop tokens once the grammar accepts)."""
        self._tok._write_mask(self._matcher, row)

    def advance(self, token: int) -> bool:
        """Take a sampled token (not a stop token); True when the grammar is finished.

        A token outside the mask is an engine bug, not the client's: it fails the call.
        """
        if not self._matcher.consume_token(int(token)):
            raise RolloutError(
                f"the engine sampled token {token}, which the grammar forbids: "
                f"{self._matcher.get_error()}"
            )
        return bool(self._matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self._matcher.is_accepting())


def _ll_tokenizer(tokenizer: Any, stop_ids: Sequence[int]) -> Any:
    """llguidance's view of a `Tokenizer`: the ``tokenizers`` JSON of a checkpoint's
    tokenizer, or the builtin vocabulary's pieces."""
    inner = tokenizer.tokenizer if isinstance(tokenizer, ChatTokenizer) else tokenizer
    if isinstance(inner, CheckpointTokenizer):
        vocab = inner.vocab_size
        eos = [t for t in stop_ids if 0 <= t < vocab] or [inner.eos_id]
        return llguidance.LLTokenizer(inner.backend.to_str(), n_vocab=vocab, eos_token=eos)
    if isinstance(inner, BuiltinTokenizer):
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_BuiltinPieces(inner, stop_ids)))
    raise RolloutError(
        f"grammars need a tokenizer llguidance can read (a checkpoint's or the builtin one), "
        f"not {type(tokenizer).__name__}"
    )


class _BuiltinPieces:
    """The builtin vocabulary in the shape `llguidance.TokenizerWrapper` reads: every token's
    bytes, which are special (never allowed by a grammar), and an encoder."""

    def __init__(self, tokenizer: BuiltinTokenizer, stop_ids: Sequence[int]) -> None:
        n = tokenizer.vocab_size
        self.tokens = [tokenizer.decode([i], skip_special=False).encode() for i in range(n)]
        # A special token decodes to nothing when specials are skipped.
        self.special_token_ids = [i for i in range(n) if not tokenizer.decode([i])]
        stops = [t for t in stop_ids if 0 <= t < n]
        self.eos_token_id = stops[0] if stops else tokenizer.eos_id
        self.bos_token_id = None
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text)
