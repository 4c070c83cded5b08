"""The JAX engine serves grammars, penalties and top logprobs, with the tiny model on CPU.

What a client asks for changes the distribution a token is drawn from; the logprob recorded
must be that distribution's. The recomputation here runs the whole sequence through the model
at once and rebuilds each step's distribution on the host, with the grammar's mask replayed
by a fresh llguidance matcher, independently of the engine's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import jsonschema
import llguidance
import numpy as np
import pytest
from flax import nnx

from rl_core.errors import RolloutError
from rl_core.models import Model, ModelConfig
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import Completion, Grammar, GrammarError, SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine

SCHEMA = {
    "type": "object",
    "properties": {
        "guess": {"type": "integer", "minimum": 1, "maximum": 8},
        "why": {"enum": ["higher", "lower"]},
        "sure": {"type": "boolean"},
    },
    "required": ["guess", "why", "sure"],
    "additionalProperties": False,
    # Compact JSON: a random model would otherwise spend its tokens on whitespace.
    "x-guidance": {"whitespace_flexible": False},
}
JSON_GRAMMAR = Grammar("start: %json " + json.dumps(SCHEMA))
# Lark rules: a word, a space, one to three digits, optionally a "!".
LARK_GRAMMAR = Grammar('start: ("higher" | "lower") " " NUM "!"?\nNUM: /[0-9]{1,3}/')


@pytest.fixture(scope="module")
def served(tokenizer: BuiltinTokenizer, tiny_config: ModelConfig) -> Iterator[JaxEngine]:
    """An engine that knows the tokenizer (grammars need it); same weights as ``engine_model``."""
    stops = (tokenizer.eos_id, tokenizer.end_of_turn_id)
    eng = JaxEngine(
        Model(tiny_config, rngs=nnx.Rngs(0)),
        config=EngineConfig(stop_ids=stops, batch_buckets=(8,)),
        tokenizer=tokenizer,
    )
    yield eng
    eng.close()


def prompt(
    tokenizer: BuiltinTokenizer, text: str = "Guess the number between 1 and 8."
) -> list[int]:
    return tokenizer.render_messages([{"role": "user", "content": text}]) + (
        tokenizer.assistant_prefix()
    )


def body(c: Completion, tokenizer: BuiltinTokenizer) -> list[int]:
    """The completion's tokens without its stop token."""
    stops = {tokenizer.eos_id, tokenizer.end_of_turn_id}
    return c.tokens[:-1] if c.finish_reason == "stop" and c.tokens[-1] in stops else c.tokens


def ll_tokenizer(tokenizer: BuiltinTokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of the builtin vocabulary, built here from its public API."""

    class Pieces:
        tokens = [
            tokenizer.decode([i], skip_special=False).encode() for i in range(tokenizer.vocab_size)
        ]
        special_token_ids = [i for i in range(tokenizer.vocab_size) if not tokenizer.decode([i])]
        eos_token_id = tokenizer.end_of_turn_id
        bos_token_id = None

        def __call__(self, text: str) -> list[int]:
            return tokenizer.encode(text)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Pieces()))


def replay_masks(
    ll: llguidance.LLTokenizer, grammar: Grammar, tokens: list[int], stops: set[int], vocab: int
) -> list[np.ndarray]:
    """The allowed set before each token, from a fresh matcher: the grammar's bitmask, with
    the stop tokens allowed exactly when the grammar accepts."""
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar.lark))
    assert not matcher.is_error(), matcher.get_error()
    masks = []
    for t in tokens:
        bits = np.frombuffer(matcher.compute_bitmask(), np.uint32)
        allowed = ((bits[:, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(-1)
        allowed = allowed[:vocab].astype(bool).copy()
        for s in stops | set(ll.eos_tokens):
            allowed[s] = s in stops and matcher.is_accepting()
        masks.append(allowed)
        assert allowed[t], f"token {t} was sampled outside the grammar"
        if t not in stops:
            assert matcher.consume_token(t), matcher.get_error()
    return masks


@nnx.jit
def _logits(model: Model, tokens: jax.Array) -> jax.Array:  # [1, T] -> [1, T, V]
    out, _ = model(tokens, jnp.arange(tokens.shape[1])[None])
    return out


def full_logits(model: Model, ids: list[int], pad: int = 128) -> np.ndarray:  # [T, V]
    """One causal forward pass over ``ids``, padded at the end to one compiled length."""
    assert len(ids) <= pad
    tokens = jnp.asarray([ids + [0] * (pad - len(ids))], jnp.int32)
    return np.asarray(_logits(model, tokens)[0, : len(ids)], np.float64)


def recompute(
    model: Model,
    prompt_ids: list[int],
    c: Completion,
    sampling: SamplingParams,
    masks: list[np.ndarray] | None,
) -> tuple[np.ndarray, list[np.ndarray]]:  # logprobs [T], each step's distribution [T, V]
    """Each sampled token's logprob under penalties, mask and temperature, from one forward
    pass over the whole sequence (no cache, no engine)."""
    steps = full_logits(model, prompt_ids + c.tokens)[len(prompt_ids) - 1 : -1]  # [T, V]
    counts = np.zeros(steps.shape[1])
    out, dists = [], []
    for i, t in enumerate(c.tokens):
        x = (
            steps[i]
            - sampling.frequency_penalty * counts
            - sampling.presence_penalty * (counts > 0)
        )
        if masks is not None:
            x = np.where(masks[i], x, -np.inf)
        x = x / sampling.temperature
        logp = x - np.logaddexp.reduce(x[np.isfinite(x)])
        out.append(logp[t])
        dists.append(logp)
        counts[t] += 1
    return np.asarray(out), dists


def test_json_schema_completions_parse_and_validate(
    served: JaxEngine, tokenizer: BuiltinTokenizer
) -> None:
    n = 16
    out = served.generate_batch(
        [prompt(tokenizer)] * n,
        max_new_tokens=48,
        sampling=SamplingParams(temperature=1.0),
        seeds=list(range(n)),
        grammars=[JSON_GRAMMAR] * n,
    )
    for c in out:
        assert c.finish_reason == "stop"
        assert c.tokens[-1] in (tokenizer.eos_id, tokenizer.end_of_turn_id)
        value = json.loads(tokenizer.decode(body(c, tokenizer)))
        jsonschema.validate(value, SCHEMA)
    assert len({json.dumps(json.loads(tokenizer.decode(c.tokens))) for c in out}) > 1


def test_sampled_tokens_never_leave_the_grammar(
    served: JaxEngine, tokenizer: BuiltinTokenizer
) -> None:
    """A hot, top-k-filtered random model under Lark rules: every token, replayed through a
    fresh matcher, was allowed when it was drawn, a stop token only once the grammar could
    end; free rows in the same batch are untouched by the other rows' masks."""
    sampling = SamplingParams(temperature=1.5, top_k=40)
    n = 8
    grammars = [LARK_GRAMMAR] * 6 + [None] * 2
    out = served.generate_batch(
        [prompt(tokenizer, "lower")] * n,
        max_new_tokens=12,
        sampling=sampling,
        seeds=list(range(100, 100 + n)),
        grammars=grammars,
    )
    ll = ll_tokenizer(tokenizer)
    stops = {tokenizer.eos_id, tokenizer.end_of_turn_id}
    for c, g in zip(out, grammars, strict=True):
        if g is None:
            continue
        replay_masks(ll, g, c.tokens, stops, tokenizer.vocab_size)
        text = tokenizer.decode(body(c, tokenizer))
        if c.finish_reason == "stop":
            head, _, num = text.partition(" ")
            assert head in ("higher", "lower") and 1 <= len(num.rstrip("!")) <= 3
            assert num.rstrip("!").isdigit()
    # The other rows' masks do not reach the free rows: they sample what they sample alone.
    alone = served.generate_batch(
        [prompt(tokenizer, "lower")] * 2,
        max_new_tokens=12,
        sampling=sampling,
        seeds=list(range(106, 108)),
    )
    assert [c.tokens for c in alone] == [c.tokens for c in out[6:]]


def test_logprobs_are_those_of_the_masked_penalised_distribution(
    served: JaxEngine, engine_model: Model, tokenizer: BuiltinTokenizer
) -> None:
    """A constrained row and a free row, with penalties and a temperature: the recorded
    logprob of every token, and its top alternatives, equal the recomputation's."""
    sampling = SamplingParams(temperature=0.8, frequency_penalty=0.7, presence_penalty=0.4)
    p = prompt(tokenizer)
    grammars = [JSON_GRAMMAR, None, JSON_GRAMMAR]
    out = served.generate_batch(
        [p] * 3,
        max_new_tokens=24,
        sampling=sampling,
        seeds=[7, 8, 9],
        grammars=grammars,
        top_logprobs=5,
    )
    ll = ll_tokenizer(tokenizer)
    stops = {tokenizer.eos_id, tokenizer.end_of_turn_id}
    for c, g in zip(out, grammars, strict=True):
        masks = None if g is None else replay_masks(ll, g, c.tokens, stops, tokenizer.vocab_size)
        expected, dists = recompute(engine_model, p, c, sampling, masks)
        np.testing.assert_allclose(c.logprobs, expected, atol=1e-4)
        assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.tokens)
        for top, dist in zip(c.top_logprobs, dists, strict=True):
            finite = int(np.isfinite(dist).sum())
            assert len(top) == min(5, finite)
            ids = [i for i, _ in top]
            np.testing.assert_allclose([v for _, v in top], dist[ids], atol=1e-4)
            assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
            # No token left out is likelier than the last one listed.
            assert np.sort(dist)[::-1][len(top) - 1] <= top[-1][1] + 1e-4
    # Penalties at work: the free row's first token has none (nothing sampled before it),
    # each later one is drawn from a penalised distribution.
    plain = served.generate_batch(
        [p], max_new_tokens=24, sampling=SamplingParams(temperature=0.8), seeds=[8]
    )[0]
    assert plain.logprobs[0] == pytest.approx(out[1].logprobs[0], abs=1e-6)
    assert plain.tokens[:2] != out[1].tokens[:2] or plain.logprobs[1] != out[1].logprobs[1]


def test_greedy_top_logprobs_start_with_the_token_taken(
    served: JaxEngine, engine_model: Model, tokenizer: BuiltinTokenizer
) -> None:
    p = prompt(tokenizer)
    greedy = SamplingParams(temperature=0.0, presence_penalty=1.0)
    out = served.generate_batch(
        [p, p], max_new_tokens=10, sampling=greedy, seeds=[0, 1], top_logprobs=20
    )
    for c in out:
        assert c.logprobs == [0.0] * len(c.tokens)  # a point mass
        assert c.top_logprobs is not None
        _, dists = recompute(engine_model, p, c, SamplingParams(presence_penalty=1.0), None)
        for token, top, dist in zip(c.tokens, c.top_logprobs, dists, strict=True):
            assert len(top) == 20 and top[0][0] == token
            values = [v for _, v in top]
            assert values == sorted(values, reverse=True)
            np.testing.assert_allclose(values, dist[[i for i, _ in top]], atol=1e-4)
    assert out[0].tokens == out[1].tokens  # greedy ignores seeds, penalties included


def test_unconstrained_batches_stay_pipelined(
    served: JaxEngine, tokenizer: BuiltinTokenizer
) -> None:
    """Penalties and top logprobs keep the one-step-ahead decode; a grammar turns it off
    only while a constrained row runs."""
    p = prompt(tokenizer)
    stats = served.stats
    sampling = SamplingParams(temperature=1.0, frequency_penalty=0.5)
    before = (stats.decode_steps, stats.pipelined_steps, stats.constrained_steps)
    served.generate_batch([p] * 4, max_new_tokens=10, sampling=sampling, seeds=[1, 2, 3, 4])
    steps, pipelined, constrained = (
        stats.decode_steps - before[0],
        stats.pipelined_steps - before[1],
        stats.constrained_steps - before[2],
    )
    assert constrained == 0 and steps >= 2 and pipelined == steps - 1

    before = (stats.decode_steps, stats.pipelined_steps, stats.constrained_steps)
    served.generate_batch(
        [p] * 2, max_new_tokens=40, sampling=sampling, seeds=[1, 2], grammars=[JSON_GRAMMAR] * 2
    )
    assert stats.pipelined_steps == before[1]
    assert stats.constrained_steps - before[2] == stats.decode_steps - before[0] >= 5


def test_concurrent_callers_mix_grammars_and_free_text(
    served: JaxEngine, tokenizer: BuiltinTokenizer
) -> None:
    async def run() -> tuple[list[Completion], list[Completion]]:
        async with served.serving():
            sampling = SamplingParams(temperature=1.0)
            free = served.generate(
                [prompt(tokenizer)] * 3, max_new_tokens=30, sampling=sampling, seeds=[1, 2, 3]
            )
            json_ = served.generate(
                [prompt(tokenizer)] * 3,
                max_new_tokens=48,
                sampling=sampling,
                seeds=[4, 5, 6],
                grammars=[JSON_GRAMMAR] * 3,
            )
            return await asyncio.gather(free, json_)

    free, constrained = asyncio.run(run())
    assert len(free) == 3
    for c in constrained:
        jsonschema.validate(json.loads(tokenizer.decode(body(c, tokenizer))), SCHEMA)


def test_a_grammar_that_does_not_compile_names_the_reason(
    served: JaxEngine, tokenizer: BuiltinTokenizer
) -> None:
    with pytest.raises(GrammarError, match=r"does not compile.*unknown name"):
        served.generate_batch(
            [prompt(tokenizer)],
            max_new_tokens=4,
            sampling=SamplingParams(),
            seeds=[0],
            grammars=[Grammar("start: missing_rule")],
        )
    with pytest.raises(RolloutError, match="top_logprobs"):
        served.generate_batch(
            [prompt(tokenizer)],
            max_new_tokens=4,
            sampling=SamplingParams(),
            seeds=[0],
            top_logprobs=21,
        )


def test_an_engine_without_the_tokenizer_refuses_grammars_only(
    engine: JaxEngine, tokenizer: BuiltinTokenizer
) -> None:
    p = prompt(tokenizer)
    with pytest.raises(RolloutError, match="without the run's tokenizer"):
        engine.generate_batch(
            [p], max_new_tokens=4, sampling=SamplingParams(), seeds=[0], grammars=[JSON_GRAMMAR]
        )
    out = engine.generate_batch(
        [p], max_new_tokens=4, sampling=SamplingParams(), seeds=[0], grammars=[None]
    )
    assert len(out[0].tokens) >= 1


def test_greedy_constrained_decoding_is_the_masked_argmax(
    served: JaxEngine, engine_model: Model, tokenizer: BuiltinTokenizer
) -> None:
    p = prompt(tokenizer)
    c = served.generate_batch(
        [p],
        max_new_tokens=48,
        sampling=SamplingParams(temperature=0.0),
        seeds=[0],
        grammars=[JSON_GRAMMAR],
    )[0]
    masks = replay_masks(
        ll_tokenizer(tokenizer),
        JSON_GRAMMAR,
        c.tokens,
        {tokenizer.eos_id, tokenizer.end_of_turn_id},
        tokenizer.vocab_size,
    )
    logits = full_logits(engine_model, p + c.tokens)
    for i, t in enumerate(c.tokens):
        row = np.where(masks[i], logits[len(p) - 1 + i], -np.inf)
        assert t == int(np.argmax(row))
