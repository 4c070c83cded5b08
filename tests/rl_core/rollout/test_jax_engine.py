from __future__ import annotations

import asyncio
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.errors import RolloutError
from rl_core.models import Model, ModelConfig
from rl_core.models.buckets import next_bucket
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import RolloutEngine, SamplingParams
from rl_core.rollout.jax_engine import EngineConfig, JaxEngine
from rl_core.rollout.scheduler import packed_bucket
from rl_core.training.trainer import Trainer, TrainerConfig


def prompts(tokenizer: BuiltinTokenizer) -> list[list[int]]:
    texts = ["Guess the number between 1 and 8.", "lower", "Answer with a number, 3 or 4?"]
    return [
        tokenizer.render_messages([{"role": "user", "content": t}]) + tokenizer.assistant_prefix()
        for t in texts
    ]


def test_is_a_rollout_engine(engine: JaxEngine) -> None:
    assert isinstance(engine, RolloutEngine)


def test_buckets_are_powers_of_two() -> None:
    assert [next_bucket(n, 8) for n in (1, 8, 9, 33)] == [8, 8, 16, 64]


def test_packed_rows_take_four_sizes_per_doubling() -> None:
    sizes = [packed_bucket(n, 16) for n in (1, 16, 17, 21, 25, 33, 260, 300, 449, 1000)]
    assert sizes == [16, 16, 20, 24, 28, 40, 320, 320, 512, 1024]
    assert packed_bucket(20, 128) == 128  # the minimum wins, even where 80 would hold it


def test_sampler_logprobs_match_trainer_at_temperature_one(
    engine: JaxEngine, engine_model: Model, tokenizer: BuiltinTokenizer
) -> None:
    ps = prompts(tokenizer)
    out = engine.generate_batch(
        ps, max_new_tokens=8, sampling=SamplingParams(temperature=1.0), seeds=[1, 2, 3]
    )
    trainer = Trainer(engine_model, TrainerConfig(temperature=1.0))
    for prompt, completion in zip(ps, out, strict=True):
        assert len(completion.tokens) == len(completion.logprobs) >= 1
        seq = np.asarray([prompt + completion.tokens], np.int32)
        recomputed = trainer.logprobs(seq)[0, len(prompt) :]
        np.testing.assert_allclose(recomputed, completion.logprobs, atol=1e-4)


def test_greedy_and_top_k_one_agree_with_argmax(
    engine: JaxEngine, engine_model: Model, tokenizer: BuiltinTokenizer
) -> None:
    ps = prompts(tokenizer)
    greedy = engine.generate_batch(
        ps, max_new_tokens=6, sampling=SamplingParams(temperature=0.0), seeds=[0, 1, 2]
    )
    top1 = engine.generate_batch(
        ps, max_new_tokens=6, sampling=SamplingParams(temperature=1.3, top_k=1), seeds=[7, 8, 9]
    )
    forward = nnx.jit(lambda m, t: m(t, jnp.arange(t.shape[1])[None])[0])
    for prompt, g, t in zip(ps, greedy, top1, strict=True):
        assert g.tokens == t.tokens
        assert g.logprobs == [0.0] * len(g.tokens)
        np.testing.assert_allclose(t.logprobs, 0.0, atol=1e-6)  # log 1: one token left
        # Causal: one forward over prompt + completion shows each step's argmax.
        seq = np.zeros((1, 64), np.int32)
        seq[0, : len(prompt) + len(g.tokens)] = prompt + g.tokens
        logits = forward(engine_model, jnp.asarray(seq))
        steps = logits[0, len(prompt) - 1 : len(prompt) - 1 + len(g.tokens)]
        assert g.tokens == [int(x) for x in jnp.argmax(steps, axis=-1)]


def test_seeds_make_sampling_reproducible(engine: JaxEngine, tokenizer: BuiltinTokenizer) -> None:
    ps = prompts(tokenizer)
    sampling = SamplingParams(temperature=1.0, top_p=0.9)
    a = engine.generate_batch(ps, max_new_tokens=8, sampling=sampling, seeds=[5, 6, 7])
    b = engine.generate_batch(ps, max_new_tokens=8, sampling=sampling, seeds=[5, 6, 7])
    c = engine.generate_batch(ps, max_new_tokens=8, sampling=sampling, seeds=[50, 60, 70])
    assert [x.tokens for x in a] == [x.tokens for x in b]
    assert [x.tokens for x in a] != [x.tokens for x in c]


def test_stop_tokens_end_a_sequence(
    engine: JaxEngine, tiny_config: ModelConfig, tokenizer: BuiltinTokenizer
) -> None:
    ps = prompts(tokenizer)
    free = engine.generate_batch(
        ps, max_new_tokens=8, sampling=SamplingParams(temperature=0.0), seeds=[0, 0, 0]
    )
    assert all(c.finish_reason == "length" and len(c.tokens) == 8 for c in free)
    # Make the 3rd greedy token of the first prompt a stop token: that row ends there.
    stop = free[0].tokens[2]
    stopping = JaxEngine(
        Model(tiny_config, rngs=nnx.Rngs(0)),
        config=EngineConfig(stop_ids=(stop, tokenizer.eos_id), batch_buckets=(8,)),
    )
    try:
        out = stopping.generate_batch(
            ps, max_new_tokens=8, sampling=SamplingParams(temperature=0.0), seeds=[0, 0, 0]
        )
    finally:
        stopping.close()
    first = free[0].tokens.index(stop)
    assert out[0].tokens == free[0].tokens[: first + 1]
    assert out[0].finish_reason == "stop"
    for o, f in zip(out[1:], free[1:], strict=True):  # other rows: cut at their own stop, if any
        n = f.tokens.index(stop) + 1 if stop in f.tokens else len(f.tokens)
        assert o.tokens == f.tokens[:n]


def test_per_row_token_limits(engine: JaxEngine, tokenizer: BuiltinTokenizer) -> None:
    out = engine.generate_batch(
        prompts(tokenizer),
        max_new_tokens=[1, 3, 5],
        sampling=SamplingParams(temperature=0.0),
        seeds=[0, 0, 0],
    )
    assert [len(c.tokens) for c in out] == [1, 3, 5]


def test_update_weights_changes_policy_and_version(
    engine: JaxEngine, tiny_config: ModelConfig, tokenizer: BuiltinTokenizer
) -> None:
    ps, greedy = prompts(tokenizer), SamplingParams(temperature=0.0)
    before = engine.generate_batch(ps, max_new_tokens=6, sampling=greedy, seeds=[0, 0, 0])
    old_state, old_version = engine.policy, engine.policy_version
    try:
        engine.update_weights(nnx.state(Model(tiny_config, rngs=nnx.Rngs(123))), version=7)
        after = engine.generate_batch(ps, max_new_tokens=6, sampling=greedy, seeds=[0, 0, 0])
    finally:
        engine.update_weights(old_state, old_version)
    assert engine.policy_version == old_version
    assert all(c.policy_version == 7 for c in after)
    assert [c.tokens for c in after] != [c.tokens for c in before]


def test_async_generate_batches_concurrent_callers(
    engine: JaxEngine, tokenizer: BuiltinTokenizer
) -> None:
    ps = prompts(tokenizer) * 2  # 6 callers fit one 8-row batch
    sampling = SamplingParams(temperature=0.0)

    async def main() -> list[list[int]]:
        async with engine.serving():
            before = engine.batches_run
            outs = await asyncio.gather(
                *(
                    engine.generate([p], max_new_tokens=4, sampling=sampling, seeds=[i])
                    for i, p in enumerate(ps)
                )
            )
            assert engine.batches_run - before == 1
        return [o[0].tokens for o in outs]

    tokens = asyncio.run(main())
    direct = engine.generate_batch(ps, max_new_tokens=4, sampling=sampling, seeds=[0] * 6)
    assert tokens == [c.tokens for c in direct]


def test_rejects_empty_prompts_and_bad_limits(engine: JaxEngine) -> None:
    with pytest.raises(RolloutError, match="empty prompt"):
        engine.generate_batch([[]], max_new_tokens=2, sampling=SamplingParams(), seeds=[0])
    with pytest.raises(RolloutError, match="at least 1"):
        engine.generate_batch([[3]], max_new_tokens=0, sampling=SamplingParams(), seeds=[0])


def test_update_weights_refuses_another_model_structure(
    engine: JaxEngine, tiny_config: ModelConfig
) -> None:
    other = dataclasses.replace(tiny_config, n_layers=tiny_config.n_layers + 1)
    with pytest.raises(RolloutError, match="another structure"):
        engine.update_weights(nnx.state(Model(other, rngs=nnx.Rngs(0))), version=1)
    assert engine.policy_version == 0  # the engine kept its policy
