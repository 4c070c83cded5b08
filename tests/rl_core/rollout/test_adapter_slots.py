"""The JAX engine with adapter slots: requests of several LoRA adapters and of the base share
one batch, and each samples exactly as the engine does with its adapter merged into the
base alone (`lora.merged_params`): greedy tokens equal, and at temperature 1 the same
tokens with logprobs within 1e-5 (float32; unmerged x W + s (x A) B and merged
x (W + s A B) differ only in rounding). Setting a slot compiles nothing; a parked prefix
is never continued under another adapter, nor under a slot's next adapter."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core.errors import RolloutError
from rl_core.models import Model, ModelConfig
from rl_core.models.lora import Adapters, LoraConfig, init_adapters, merged_params
from rl_core.rollout.adapter_policy import AdapterPolicyEngine
from rl_core.rollout.base import Completion, SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine

LORA = LoraConfig(rank=4, alpha=8.0, targets=("q", "v", "o", "up"))
GREEDY = SamplingParams(temperature=0.0)
WARM = SamplingParams(temperature=1.0)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [5, 6, 7, 8, 9], [20, 21, 22, 23, 24, 25], [30, 31]]
# Adapters 0, 1, 2 and the base (None, and -1 as the client may say it), mixed in one batch;
# prompts 0 and 2 are the same tokens under two adapters.
SLOTS: list[int | None] = [0, 1, 2, None, -1]
SEEDS = [1, 2, 3, 4, 5]


def _adapter(state: Any, seed: int) -> Adapters:
    # B != 0 and well away from the base: a fresh adapter is the identity and proves nothing.
    rng = np.random.default_rng(seed)
    fresh = init_adapters(state, LORA, jax.random.key(seed))
    return jax.tree.map(lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(x.dtype), fresh)


@pytest.fixture(scope="module")
def setup(tiny_config: ModelConfig) -> Iterator[tuple[JaxEngine, JaxEngine, list[Adapters]]]:
    """An engine with 3 adapter slots, and a plain one of the same base for the references."""
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    adapters = [_adapter(nnx.state(model), seed) for seed in (11, 12, 13)]
    config = EngineConfig(stop_ids=(1,), batch_buckets=(8,), prefix_pool_rows=4)
    slotted = dataclasses.replace(config, adapter_slots=3, lora=LORA)
    engine = JaxEngine(model, config=slotted)
    for slot, ad in enumerate(adapters):
        engine.set_adapter(slot, ad)
    plain = JaxEngine(Model(tiny_config, rngs=nnx.Rngs(0)), config=config)
    yield engine, plain, adapters
    engine.close()
    plain.close()


def _merged(plain: JaxEngine, adapters: Adapters | None, base: Any, version: list[int]) -> None:
    """``plain`` samples with ``adapters`` merged into ``base`` (or the base itself)."""
    version[0] += 1
    weights = base if adapters is None else merged_params(base, adapters, LORA)
    plain.update_weights(weights, version[0])


def _alone(
    plain: JaxEngine,
    base: Any,
    adapters: Sequence[Adapters],
    prompts: Sequence[list[int]],
    slots: Sequence[int | None],
    sampling: SamplingParams,
    seeds: Sequence[int],
    max_new: int = 8,
) -> list[Completion]:
    """Each request on ``plain`` with its own adapter merged, one adapter at a time."""
    version = [plain.policy_version]
    out = []
    for prompt, slot, seed in zip(prompts, slots, seeds, strict=True):
        _merged(plain, None if slot is None or slot < 0 else adapters[slot], base, version)
        (c,) = plain.generate_batch(
            [prompt], max_new_tokens=max_new, sampling=sampling, seeds=[seed]
        )
        out.append(c)
    _merged(plain, None, base, version)
    return out


async def hold_device_thread(engine: Any) -> threading.Event:
    """Block ``engine``'s device thread until the returned event is set; return once it
    is blocked (a decode loop still running from an earlier call has ended first)."""
    entered, gate = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        gate.wait(30)

    engine.executor.submit(hold)
    await asyncio.to_thread(entered.wait, 30)
    return gate


def _assert_same(got: Sequence[Completion], want: Sequence[Completion]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.tokens == w.tokens
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)


@pytest.mark.parametrize("sampling", [GREEDY, WARM], ids=["greedy", "sampled"])
def test_a_mixed_batch_samples_each_request_as_its_adapter_merged_alone(
    setup: tuple[JaxEngine, JaxEngine, list[Adapters]], sampling: SamplingParams
) -> None:
    engine, plain, adapters = setup
    base = plain.policy
    got = engine.generate_batch(
        PROMPTS, max_new_tokens=8, sampling=sampling, seeds=SEEDS, adapter_slot=SLOTS
    )
    want = _alone(plain, base, adapters, PROMPTS, SLOTS, sampling, SEEDS)
    _assert_same(got, want)
    # The adapters matter: the same prompt and seed under adapters 0 and 1 differ.
    (other,) = engine.generate_batch(
        [PROMPTS[0]], max_new_tokens=8, sampling=sampling, seeds=[SEEDS[0]], adapter_slot=1
    )
    assert (other.tokens, other.logprobs) != (got[0].tokens, got[0].logprobs)


def test_concurrent_calls_of_different_adapters_join_one_batch(
    setup: tuple[JaxEngine, JaxEngine, list[Adapters]],
) -> None:
    engine, plain, adapters = setup

    async def main() -> tuple[list[Completion], int]:
        async with engine.serving():
            before = engine.batches_run
            # The device thread waits while the five calls reach the engine: on a loaded
            # machine they may otherwise take longer than its 2 ms gathering window.
            gate = await hold_device_thread(engine)
            calls = asyncio.gather(
                *(
                    engine.generate(
                        [p], max_new_tokens=8, sampling=WARM, seeds=[s], adapter_slot=slot
                    )
                    for p, slot, s in zip(PROMPTS, SLOTS, SEEDS, strict=True)
                )
            )
            await asyncio.sleep(0.5)
            gate.set()
            answers = await calls
            return [c for (c,) in answers], engine.batches_run - before

    got, prefills = asyncio.run(main())
    assert prefills == 1  # five callers, three adapters and the base: one packed prefill
    _assert_same(got, _alone(plain, plain.policy, adapters, PROMPTS, SLOTS, WARM, SEEDS))


def test_setting_a_slot_compiles_nothing_and_its_next_requests_use_the_new_adapter(
    setup: tuple[JaxEngine, JaxEngine, list[Adapters]], tiny_config: ModelConfig
) -> None:
    engine, plain, adapters = setup
    engine.generate_batch(PROMPTS, max_new_tokens=8, sampling=WARM, seeds=SEEDS, adapter_slot=SLOTS)
    programs = engine._programs
    sizes = (programs.prefill._cache_size(), programs.decode._cache_size())
    replaced = _adapter(plain.policy, 99)
    engine.set_adapter(1, replaced)
    try:
        got = engine.generate_batch(
            PROMPTS, max_new_tokens=8, sampling=WARM, seeds=SEEDS, adapter_slot=SLOTS
        )
        assert (programs.prefill._cache_size(), programs.decode._cache_size()) == sizes
        now = [adapters[0], replaced, adapters[2]]
        _assert_same(got, _alone(plain, plain.policy, now, PROMPTS, SLOTS, WARM, SEEDS))
        engine.clear_adapter(1)  # an empty slot samples as the base
        (cleared,) = engine.generate_batch(
            [PROMPTS[1]], max_new_tokens=8, sampling=WARM, seeds=[2], adapter_slot=1
        )
        (base,) = plain.generate_batch([PROMPTS[1]], max_new_tokens=8, sampling=WARM, seeds=[2])
        _assert_same([cleared], [base])
    finally:
        engine.set_adapter(1, adapters[1])


def test_two_adapters_never_share_a_prefix_and_a_set_slot_forgets_its_own(
    setup: tuple[JaxEngine, JaxEngine, list[Adapters]],
) -> None:
    """Adapter 0 answers a 40-token prompt (its keys and values are parked); the same
    conversation continued under adapter 1 is prefilled afresh, under adapter 0 it
    continues the parked prefix; once slot 0 holds another adapter, it is prefilled afresh
    again. Every answer is that of its adapter merged alone."""
    engine, plain, adapters = setup
    prompt = [10 + (7 * i) % 80 for i in range(40)]
    replaced = _adapter(plain.policy, 77)

    async def main() -> tuple[list[int], list[tuple[Completion, int]]]:
        async def continued(slot: int) -> tuple[Completion, int]:
            hits = engine.stats.prefix_hits
            (c,) = await engine.generate(
                [follow], max_new_tokens=4, sampling=GREEDY, seeds=[1], adapter_slot=slot
            )
            return c, engine.stats.prefix_hits - hits

        async with engine.serving():
            (first,) = await engine.generate(
                [prompt], max_new_tokens=4, sampling=GREEDY, seeds=[0], adapter_slot=0
            )
            follow = [*prompt, *first.tokens, 3, 4, 5]
            under_1 = await continued(1)
            under_0 = await continued(0)
            engine.set_adapter(0, replaced)
            under_replaced = await continued(0)
        return follow, [under_1, under_0, under_replaced]

    try:
        follow, answers = asyncio.run(main())
    finally:
        engine.set_adapter(0, adapters[0])
    assert [hits for _, hits in answers] == [0, 1, 0]
    merged = [adapters[1], adapters[0], replaced]  # what each answer's slot held
    for (got, _), ad in zip(answers, merged, strict=True):
        want = _alone(plain, plain.policy, [ad], [follow], [0], GREEDY, [1], max_new=4)
        _assert_same([got], want)


def test_a_slot_in_use_and_adapters_of_another_layout_are_refused(
    setup: tuple[JaxEngine, JaxEngine, list[Adapters]], tiny_config: ModelConfig
) -> None:
    engine, plain, adapters = setup
    assert engine.adapters is not None
    held = engine.adapters.claim([2])
    try:
        with pytest.raises(RolloutError, match="slot 2 has 1 requests in flight"):
            engine.set_adapter(2, adapters[0])
    finally:
        engine.adapters.release([2])
    state = plain.policy
    other_rank = init_adapters(state, LoraConfig(rank=2, targets=LORA.targets), jax.random.key(0))
    with pytest.raises(RolloutError, match=r"\(rank 4\)"):
        engine.set_adapter(0, other_rank)
    other_targets = init_adapters(state, LoraConfig(rank=4, targets=("q",)), jax.random.key(0))
    with pytest.raises(RolloutError, match="not in the engine's layout"):
        engine.set_adapter(0, other_targets)
    with pytest.raises(RolloutError, match=r"slot 3 is not one of this engine's 0\.\.2"):
        engine.generate_batch(
            [[5, 6]], max_new_tokens=2, sampling=GREEDY, seeds=[0], adapter_slot=3
        )
    with pytest.raises(RolloutError, match="no adapter slots"):
        plain.generate_batch([[5, 6]], max_new_tokens=2, sampling=GREEDY, seeds=[0], adapter_slot=0)
    with pytest.raises(RolloutError, match="adapter_slots needs lora"):
        EngineConfig(stop_ids=(1,), adapter_slots=2)
    assert held == [(2, engine.adapters.versions[2])]
    assert engine.adapters.in_use(2) == 0


def test_a_run_on_a_shared_base_samples_with_its_adapters_swapped_in_flight(
    tiny_config: ModelConfig,
) -> None:
    """`AdapterPolicyEngine` (a job run on a base other runs share): its weight updates are
    adapters, sampled as if merged into the base, and an update made while a request
    holds the slot is taken (as `update_weights` is), not refused as `set_adapter` is;
    the requests after it run under the new adapter and version."""
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    config = EngineConfig(stop_ids=(1,), batch_buckets=(8,))
    slotted = dataclasses.replace(config, adapter_slots=1, lora=LORA)
    run = AdapterPolicyEngine(JaxEngine(model, config=slotted), slot=0)
    plain = JaxEngine(Model(tiny_config, rngs=nnx.Rngs(0)), config=config)
    base = plain.policy
    first, second = _adapter(base, 21), _adapter(base, 22)

    def merged_sampling(adapters: Adapters, version: int) -> list[Completion]:
        plain.update_weights(merged_params(base, adapters, LORA), version)
        return plain.generate_batch(PROMPTS, max_new_tokens=8, sampling=WARM, seeds=SEEDS)

    async def play() -> tuple[list[Completion], Completion, list[Completion]]:
        run.update_weights(first, version=3)
        async with run.serving():
            before = await run.generate(PROMPTS, max_new_tokens=8, sampling=WARM, seeds=SEEDS)
            gate = await hold_device_thread(run.engine)
            held = asyncio.create_task(
                run.generate([PROMPTS[0]], max_new_tokens=8, sampling=WARM, seeds=[9])
            )
            adapters = run.engine.adapters
            assert adapters is not None
            await asyncio.sleep(0)  # the request starts: it claims its slot, then waits
            assert adapters.in_use(0) == 1
            with pytest.raises(RolloutError, match="in flight"):
                run.engine.set_adapter(0, second)  # what a Tinker sampler slot does
            run.update_weights(second, version=4)  # what a run's weight sync does
            gate.set()
            (during,) = await held
            after = await run.generate(PROMPTS, max_new_tokens=8, sampling=WARM, seeds=SEEDS)
        return before, during, after

    try:
        before, during, after = asyncio.run(play())
        assert run.policy_version == 4
        _assert_same(before, merged_sampling(first, 3))
        _assert_same(after, merged_sampling(second, 4))
        assert during.policy_version == 4 and all(c.policy_version == 4 for c in after)
    finally:
        run.close()
        plain.close()
