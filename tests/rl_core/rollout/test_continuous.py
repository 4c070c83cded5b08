"""Continuous batching: requests join and leave a running batch between decode steps."""

from __future__ import annotations

import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.rollout import steps
from rl_core.rollout.base import Completion, SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine

GREEDY = SamplingParams(temperature=0.0)
WARM = SamplingParams(temperature=0.8, top_p=0.95)


def _prompt(n: int, offset: int = 0) -> list[int]:
    return [10 + (offset + 7 * i) % 80 for i in range(n)]


async def decode_steps(engine: JaxEngine, n: int) -> None:
    """Return once the engine's device thread has run ``n`` more decode steps."""
    start = engine.stats.decode_steps
    # A counter bumped by another thread: there is no event to await, so poll it.
    while engine.stats.decode_steps < start + n:  # noqa: ASYNC110
        await asyncio.sleep(0.001)


def test_a_request_joining_mid_flight_gets_the_tokens_it_gets_alone(engine: JaxEngine) -> None:
    long, short = _prompt(5), _prompt(11, offset=3)
    for sampling in (GREEDY, WARM):
        alone_long = engine.generate_batch([long], max_new_tokens=24, sampling=sampling, seeds=[4])
        alone_short = engine.generate_batch([short], max_new_tokens=6, sampling=sampling, seeds=[9])

        async def main(sampling: SamplingParams = sampling) -> tuple[Completion, Completion, int]:
            async with engine.serving():
                first = asyncio.create_task(
                    engine.generate([long], max_new_tokens=24, sampling=sampling, seeds=[4])
                )
                await decode_steps(engine, 4)  # the first request is decoding
                joined = await engine.generate(
                    [short], max_new_tokens=6, sampling=sampling, seeds=[9]
                )
                still_running = not first.done()
                return (await first)[0], joined[0], still_running

        a, b, overlapped = asyncio.run(main())
        assert overlapped  # the short request came and went while the long one decoded
        assert a.tokens == alone_long[0].tokens and b.tokens == alone_short[0].tokens
        np.testing.assert_allclose(a.logprobs, alone_long[0].logprobs, atol=1e-5)
        np.testing.assert_allclose(b.logprobs, alone_short[0].logprobs, atol=1e-5)


def test_finished_rows_free_their_slots_for_waiting_requests(
    tiny_config: ModelConfig,
) -> None:
    """Ten requests through a 2-slot engine: all served, each as it would be alone."""
    eng = JaxEngine(
        Model(tiny_config, rngs=nnx.Rngs(0)),
        config=EngineConfig(stop_ids=(1,), batch_buckets=(2,)),
    )
    prompts = [_prompt(3 + i, offset=i) for i in range(10)]
    limits = [2 + (i % 4) * 3 for i in range(10)]
    try:
        together = eng.generate_batch(
            prompts, max_new_tokens=limits, sampling=WARM, seeds=range(10)
        )
        assert eng.stats.prefill_calls > 5  # requests joined as slots came free
        for i in (0, 5, 9):
            alone = eng.generate_batch(
                [prompts[i]], max_new_tokens=limits[i], sampling=WARM, seeds=[i]
            )
            assert together[i].tokens == alone[0].tokens
    finally:
        eng.close()
    assert [len(c.tokens) <= m for c, m in zip(together, limits, strict=True)] == [True] * 10


def test_logprobs_are_the_tempered_log_softmax_at_the_sampled_token(
    engine: JaxEngine, engine_model: Model
) -> None:
    prompt, temperature = _prompt(6), 0.7
    out = engine.generate_batch(
        [prompt], max_new_tokens=10, sampling=SamplingParams(temperature=temperature), seeds=[3]
    )[0]
    seq = jnp.asarray([prompt + out.tokens], jnp.int32)
    logits, _ = engine_model(seq, jnp.arange(seq.shape[1])[None])
    steps_logits = logits[0, len(prompt) - 1 : -1] / temperature  # the logits each token came from
    want = jax.nn.log_softmax(steps_logits, axis=-1)[jnp.arange(len(out.tokens)), out.tokens]
    np.testing.assert_allclose(out.logprobs, np.asarray(want), atol=1e-5)


def test_prompt_lengths_within_a_bucket_compile_nothing_new(engine: JaxEngine) -> None:
    engine.generate_batch([_prompt(4)], max_new_tokens=5, sampling=WARM, seeds=[0])  # warm
    programs = engine._programs
    before = (programs.prefill._cache_size(), programs.decode._cache_size())
    for n in (3, 9, 12, 16):  # all in the 16-token prompt bucket and the 64-slot cache
        engine.generate_batch([_prompt(n)], max_new_tokens=5, sampling=WARM, seeds=[n])
    assert (programs.prefill._cache_size(), programs.decode._cache_size()) == before


def test_update_weights_applies_from_the_next_decode_step(
    engine: JaxEngine, tiny_config: ModelConfig
) -> None:
    old_state, old_version = engine.policy, engine.policy_version
    new_state = nnx.state(Model(tiny_config, rngs=nnx.Rngs(99)))
    prompt = _prompt(5)

    async def main() -> Completion:
        async with engine.serving():
            task = asyncio.create_task(
                engine.generate([prompt], max_new_tokens=30, sampling=GREEDY, seeds=[0])
            )
            await decode_steps(engine, 3)
            engine.update_weights(new_state, version=old_version + 1)  # no pause, no drain
            return (await task)[0]

    try:
        mixed = asyncio.run(main())
        new = engine.generate_batch([prompt], max_new_tokens=30, sampling=GREEDY, seeds=[0])[0]
    finally:
        engine.update_weights(old_state, old_version)
    old = engine.generate_batch([prompt], max_new_tokens=30, sampling=GREEDY, seeds=[0])[0]
    assert mixed.policy_version == old_version  # the version that started the sequence
    assert mixed.tokens[:3] == old.tokens[:3]  # sampled before the swap
    assert mixed.tokens != old.tokens and new.policy_version == old_version + 1


def test_prompts_packed_into_several_prefill_rows_get_the_tokens_they_get_alone(
    engine: JaxEngine, engine_model: Model
) -> None:
    # Rows of at most 12 tokens: prompts of 5, 11, 7 and 3 tokens join as [5], [11], [7, 3].
    config = dataclasses.replace(engine.config, max_packed_tokens=12)
    packed = JaxEngine(engine_model, config=config)
    prompts = [_prompt(5), _prompt(11, offset=1), _prompt(7, offset=2), _prompt(3, offset=3)]
    try:
        together = packed.generate_batch(prompts, max_new_tokens=6, sampling=WARM, seeds=range(4))
        assert packed.stats.prefill_calls == 3
    finally:
        packed.close()
    for i, prompt in enumerate(prompts):
        alone = engine.generate_batch([prompt], max_new_tokens=6, sampling=WARM, seeds=[i])[0]
        assert together[i].tokens == alone.tokens
        np.testing.assert_allclose(together[i].logprobs, alone.logprobs, atol=1e-5)


def test_rows_that_stop_while_the_next_step_is_in_flight_lose_nothing_and_gain_nothing(
    engine_model: Model,
) -> None:
    """Decoding runs a step ahead of the host, so a row that samples a stop token has
    already been given one more step; that token must be dropped, and the slot reused
    as if it never was."""
    stops = tuple(range(2, 12))  # some rows stop early, some run to their limit
    eng = JaxEngine(engine_model, config=EngineConfig(stop_ids=stops, batch_buckets=(4,)))
    prompts = [_prompt(3 + i % 5, offset=i) for i in range(12)]
    try:
        together = eng.generate_batch(prompts, max_new_tokens=12, sampling=WARM, seeds=range(12))
        alone = [
            eng.generate_batch([p], max_new_tokens=12, sampling=WARM, seeds=[i])[0]
            for i, p in enumerate(prompts)
        ]
    finally:
        eng.close()
    reasons = {c.finish_reason for c in together}
    assert reasons == {"stop", "length"}  # both kinds of ending were exercised
    for got, want in zip(together, alone, strict=True):
        assert got.tokens == want.tokens and got.finish_reason == want.finish_reason
        ends = [i for i, t in enumerate(got.tokens) if t in stops]
        assert ends == ([len(got.tokens) - 1] if got.finish_reason == "stop" else [])
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


def test_a_batch_across_buckets_shrinks_late_compiles_one_resize_per_shape_pair_and_loses_nothing(
    engine_model: Model,
) -> None:
    """Rows stop at different steps, so the running count falls through every value from
    12 to 0 and crosses the 4-row bucket. The batch shrinks only after ``shrink_after``
    steps too big, resizes with one program per pair of shapes (not one per running
    count: a multi-turn run spent a quarter of its rollout compiling those), and every
    row gets the tokens it gets alone, shrinking at once or late."""
    stops = tuple(range(2, 40))  # most rows stop within a few tokens, at different steps
    prompts = [_prompt(3 + i % 5, offset=i) for i in range(12)]
    results: dict[int, int] = {}
    for shrink_after in (0, 6):
        config = EngineConfig(
            stop_ids=stops, batch_buckets=(4, 16), shrink_after_steps=shrink_after
        )
        eng = JaxEngine(engine_model, config=config)
        try:
            before = steps.resize._cache_size(), steps.insert._cache_size()
            together = eng.generate_batch(
                prompts, max_new_tokens=24, sampling=WARM, seeds=range(12)
            )
            compiled = steps.resize._cache_size() - before[0]
            # The moves are resize's: the old path inserted K running rows, a program per K.
            assert steps.insert._cache_size() == before[1]
            alone = [
                eng.generate_batch([p], max_new_tokens=24, sampling=WARM, seeds=[i])[0]
                for i, p in enumerate(prompts)
            ]
        finally:
            eng.close()
        lengths = sorted(len(c.tokens) for c in together)
        assert len(set(lengths)) >= 4, lengths  # the rows left at several different steps
        for got, want in zip(together, alone, strict=True):
            assert got.tokens == want.tokens and got.finish_reason == want.finish_reason
            np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
        assert compiled <= 1  # 16 rows to 4: one pair of shapes (none if cached already)
        results[shrink_after] = eng.stats.decoded_rows
    # Late: the 16-row cache was kept for (at most) 6 steps after 4 rows could hold the
    # batch, 12 empty rows each.
    assert 0 < results[6] - results[0] <= 6 * 12
