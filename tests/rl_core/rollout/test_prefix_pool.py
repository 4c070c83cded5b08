"""The prefix pool: an agent's next turn prefills only what is new, and answers as if it
had prefilled everything."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from flax import nnx

from rl_core.models import Model, ModelConfig
from rl_core.rollout.base import Completion, SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine
from rl_core.rollout.prefix_pool import BLOCK, Hit, PrefixIndex
from rl_core.rollout.scheduler import Request, Scheduler, _extend_packs

GREEDY = SamplingParams(temperature=0.0)
WARM = SamplingParams(temperature=0.9, top_p=0.95)


def _tokens(n: int, offset: int = 0) -> list[int]:
    return [10 + (offset + 7 * i) % 80 for i in range(n)]


# The index alone ------------------------------------------------------------------------


def test_a_prompt_takes_the_longest_parked_prefix_at_a_block_boundary() -> None:
    index = PrefixIndex(rows=4)
    long = _tokens(3 * BLOCK + 5)
    a = index.park(long[: 2 * BLOCK + 3], version=0)
    b = index.park(long[: 3 * BLOCK + 1], version=0)
    assert a is not None and b is not None and a != b
    hit = index.take([*long, 1, 2], version=0, max_new=64)
    assert hit is not None and (hit.row, hit.start) == (b, 3 * BLOCK)
    # Taken rows leave the index; the shorter prefix is still there.
    hit = index.take([*long, 1, 2], version=0, max_new=64)
    assert hit is not None and (hit.row, hit.start) == (a, 2 * BLOCK)
    assert index.take([*long, 1, 2], version=0, max_new=64) is None


def test_an_entry_of_other_weights_never_hits_and_is_evicted_first() -> None:
    index = PrefixIndex(rows=2)
    old = index.park(_tokens(40, 1), version=3)
    new = index.park(_tokens(40, 2), version=4)
    assert index.take([*_tokens(40, 1), 5], version=4, max_new=64) is None
    assert len(index) == 1  # the old one was dropped when found useless
    index.park(_tokens(40, 1), version=3)
    third = index.park(_tokens(40, 3), version=4)  # full: the version-3 row goes first
    assert third == old
    assert index.take([*_tokens(40, 2), 5], version=4, max_new=64) is not None
    assert new is not None


def test_short_sequences_are_not_parked_and_a_long_tail_is_not_a_hit() -> None:
    index = PrefixIndex(rows=2)
    assert index.park(_tokens(BLOCK - 1), version=0) is None
    index.park(_tokens(BLOCK * 2), version=0)
    prompt = [*_tokens(BLOCK * 2), *_tokens(40, 9)]
    assert index.take(prompt, version=0, max_new=8) is None  # 40 new tokens > 8
    hit = index.take(prompt, version=0, max_new=64)
    assert hit is not None and hit.start == 2 * BLOCK


def test_a_hash_match_with_other_tokens_is_not_a_hit() -> None:
    index = PrefixIndex(rows=1)
    index.park(_tokens(BLOCK), version=0)
    entry = next(iter(index._entries.values()))
    entry.tokens[3] += 1  # as if another sequence had the same hash
    assert index.take([*_tokens(BLOCK), 1], version=0, max_new=64) is None


def test_a_prefix_parked_under_one_tag_is_not_a_hit_under_another() -> None:
    """Tags are whose weights computed the keys and values (an adapter slot and its
    version): the same tokens under another adapter, or under the slot's next adapter,
    do not hit; `retain` gives back the rows of tags that can no longer hit."""
    index = PrefixIndex(rows=4)
    tokens = _tokens(2 * BLOCK)
    for tag in (None, (0, 1), (1, 1)):
        assert index.park(tokens, version=0, tag=tag) is not None
    assert len(index) == 3  # the same tokens under three tags: three entries
    assert index.take([*tokens, 1], version=0, tag=(0, 2), max_new=64) is None
    index.retain(lambda tag: tag != (1, 1))
    assert len(index) == 2
    assert index.take([*tokens, 1], version=0, tag=(1, 1), max_new=64) is None
    for tag in ((0, 1), None):
        hit = index.take([*tokens, 1], version=0, tag=tag, max_new=64)
        assert hit is not None and hit.start == 2 * BLOCK
    assert len(index) == 0


# Through the engine ---------------------------------------------------------------------


def _engine(config: ModelConfig, *, pool: int | None, packed: int = 256) -> JaxEngine:
    return JaxEngine(
        Model(config, rngs=nnx.Rngs(0)),
        config=EngineConfig(
            stop_ids=(1,), batch_buckets=(8,), prefix_pool_rows=pool, max_packed_tokens=packed
        ),
    )


def _episodes(
    engine: JaxEngine, sampling: SamplingParams, turns: int = 4, n: int = 6
) -> list[list[Completion]]:
    """``n`` concurrent agents, each prompt its last prompt + answer + an observation."""

    async def agent(i: int) -> list[Completion]:
        prompt, out = _tokens(20 + 3 * i, offset=i), []
        for turn in range(turns):
            (c,) = await engine.generate(
                [prompt], max_new_tokens=6 + i % 3, sampling=sampling, seeds=[100 * i + turn]
            )
            out.append(c)
            prompt = [*prompt, *c.tokens, *_tokens(5 + turn, offset=7 * i + turn)]
        return out

    async def main() -> list[list[Completion]]:
        async with engine.serving():
            return list(await asyncio.gather(*(agent(i) for i in range(n))))

    return asyncio.run(main())


@pytest.mark.parametrize("sampling", [GREEDY, WARM], ids=["greedy", "sampled"])
def test_later_turns_reuse_the_episodes_keys_and_answer_as_a_full_prefill_does(
    tiny_config: ModelConfig, sampling: SamplingParams
) -> None:
    cold, warm = _engine(tiny_config, pool=0), _engine(tiny_config, pool=None)
    try:
        without = _episodes(cold, sampling)
        with_pool = _episodes(warm, sampling)
    finally:
        cold.close()
        warm.close()
    assert cold.stats.reused_tokens == 0 and cold.stats.extend_calls == 0
    for a, b in zip(without, with_pool, strict=True):
        assert [c.tokens for c in a] == [c.tokens for c in b]
        for ca, cb in zip(a, b, strict=True):
            np.testing.assert_allclose(ca.logprobs, cb.logprobs, atol=1e-4)
    # Every later turn of every agent continued its parked answer: 18 of 24 calls.
    assert warm.stats.prefix_hits == 18
    assert warm.stats.prefilled_tokens + warm.stats.reused_tokens == cold.stats.prefilled_tokens
    assert warm.stats.prefilled_tokens < cold.stats.prefilled_tokens / 2


@pytest.mark.parametrize("alibi", [False, True], ids=["rope", "alibi"])
def test_continuations_admitted_together_are_packed_and_answer_as_prefilled_alone(
    tiny_config: ModelConfig, alibi: bool
) -> None:
    """Seven continuations of parked sequences of different lengths join at once: their
    new tokens go end to end into extends (two calls: their ~100 new tokens overrun a
    packing budget of 64), and each answers as a cold engine that prefilled its whole
    prompt does. ALiBi's distances in the packed row are by position, not by slot."""
    config = ModelConfig.tiny_alibi(vocab_size=tiny_config.vocab_size) if alibi else tiny_config
    cold, warm = _engine(config, pool=0), _engine(config, pool=None, packed=64)
    firsts = [_tokens(17 + 9 * i, offset=i) for i in range(7)]
    seeds = list(range(7))

    async def together() -> tuple[list[list[int]], list[Completion]]:
        async with warm.serving():
            answers = await warm.generate(firsts, max_new_tokens=5, sampling=GREEDY, seeds=seeds)
            nexts = [
                [*f, *a.tokens, *_tokens(3 + 2 * i, offset=5 * i)]
                for i, (f, a) in enumerate(zip(firsts, answers, strict=True))
            ]
            return nexts, await warm.generate(nexts, max_new_tokens=6, sampling=WARM, seeds=seeds)

    try:
        nexts, with_pool = asyncio.run(together())
        alone = [
            cold.generate_batch([p], max_new_tokens=6, sampling=WARM, seeds=[s])[0]
            for p, s in zip(nexts, seeds, strict=True)
        ]
    finally:
        cold.close()
        warm.close()
    assert warm.stats.prefix_hits == 7
    assert warm.stats.extend_calls == 2
    for a, b in zip(alone, with_pool, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_an_extend_call_holds_a_budget_of_new_tokens_and_eight_of_keys() -> None:
    def hit(length: int, start: int) -> tuple[Request, Hit]:
        return Request([0] * length, 1, GREEDY, 0), Hit(row=0, start=start)

    by_new = [hit(40, 16), hit(40, 16), hit(40, 16)]  # 24 new tokens each
    assert [len(p) for p in _extend_packs(by_new, budget=64)] == [2, 1]
    by_keys = [hit(300, 288), hit(300, 288), hit(300, 288)]  # 12 new, 300 keys each
    assert [len(p) for p in _extend_packs(by_keys, budget=64)] == [1, 1, 1]  # 512 keys a call
    assert [len(p) for p in _extend_packs(by_keys, budget=128)] == [3]
    assert [len(p) for p in _extend_packs([hit(900, 16)], budget=64)] == [1]  # alone


def test_an_extend_runs_in_a_compiled_shape_that_holds_it_unless_that_costs_twice_its_own(
    tiny_config: ModelConfig,
) -> None:
    scheduler = Scheduler(
        None,
        tiny_config,
        policy=lambda: None,  # type: ignore[arg-type,return-value]
        stop_ids=(1,),
        pad_id=0,
        row_buckets=(8,),
        min_prompt_bucket=16,
        max_packed_tokens=256,
        min_cache_bucket=16,
        max_cache_len=1024,
    )
    shape = scheduler._extend_shape  # (hits, new tokens, prefix tokens) -> (K, N, L)
    assert shape(1, 20, 100) == (1, 20, 128)  # its own: compiled
    assert shape(1, 30, 90) == (1, 32, 128)  # (1, 20, 128) holds too few new tokens
    assert shape(1, 10, 60) == (1, 20, 128)  # its own (1, 16, 128) costs 0.8x: padded
    assert shape(3, 20, 100) == (4, 20, 128)  # more head rows: another program
    assert shape(1, 100, 900) == (1, 112, 1024)
    # Only (1, 112, 1024) holds (1, 40, 256), at six times the cost: its own is compiled.
    assert shape(1, 40, 200) == (1, 40, 256)
    assert scheduler._extend_shapes == {
        (1, 20, 128),
        (1, 32, 128),
        (4, 20, 128),
        (1, 112, 1024),
        (1, 40, 256),
    }


def test_after_a_weight_update_a_continuing_prompt_is_prefilled_afresh(
    tiny_config: ModelConfig,
) -> None:
    engine = _engine(tiny_config, pool=None)
    other = nnx.state(Model(tiny_config, rngs=nnx.Rngs(7)))
    fresh = _engine(tiny_config, pool=0)
    fresh.update_weights(other, version=1)
    prompt = _tokens(40)

    async def main() -> tuple[Completion, Completion]:
        async with engine.serving():
            (first,) = await engine.generate([prompt], max_new_tokens=4, sampling=GREEDY, seeds=[0])
            engine.update_weights(other, version=1)
            (second,) = await engine.generate(
                [[*prompt, *first.tokens, 3, 4, 5]], max_new_tokens=4, sampling=GREEDY, seeds=[1]
            )
            return first, second

    try:
        first, second = asyncio.run(main())
        (expected,) = fresh.generate_batch(
            [[*prompt, *first.tokens, 3, 4, 5]], max_new_tokens=4, sampling=GREEDY, seeds=[1]
        )
    finally:
        engine.close()
        fresh.close()
    assert engine.stats.reused_tokens == 0  # version 0's keys were not used by version 1
    assert second.policy_version == 1
    assert second.tokens == expected.tokens
