"""Sequence packing lays rows end to end and changes no number the loss reads.

Rows of very different lengths (6 to 120 tokens in a 128-token batch), as a long-tail
multi-turn batch has them: one-turn and multi-turn rows whose observations are masked
out, a row trained on nothing and padding rows. Tolerances, float32 throughout: the
packed forward runs the same matmuls over other shapes and sums the loss in another
order, so logprobs agree within 1e-5 nats, a step's metrics within rel 1e-4 / abs 1e-6
and its update within 1e-3 of its norm, leaf by leaf (Adam divides each element by its
own gradient's size, so a near-zero gradient's rounding shows in its update: the bound
the head-positions and chunked-head step tests use).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.algorithms.ppo import PpoConfig
from rl_core.models import Model, ModelConfig
from rl_core.training import packing
from rl_core.training import train_step as ts
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import SHARE_OVER_PACK, TrainBatch, Trainer, TrainerConfig

LP_ATOL = 1e-5
LORA = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o"))


@pytest.fixture(scope="module")
def model(tiny_config: ModelConfig) -> Model:
    return Model(dataclasses.replace(tiny_config, n_layers=2), rngs=nnx.Rngs(0))


def long_tail_batch(
    seed: int, *, rows: int = 16, real: int = 13, turns: tuple[int, int] = (1, 12)
) -> TrainBatch:
    """``real`` rows on an 8-token prompt, each 1 to 11 turns of a 3-5-token answer
    (trained) and a 4-token observation (not); one of them trained on nothing; a lag per
    token; then padding rows. Lengths from about 12 to 110 tokens: a 128 bucket."""
    rng = np.random.default_rng(seed)
    tokens, masks, lags = [], [], []
    for i in range(real):
        parts = [(rng.integers(3, 100, size=8), 0)]
        for _ in range(int(rng.integers(*turns))):
            parts.append((rng.integers(3, 100, size=int(rng.integers(3, 6))), 1))
            parts.append((rng.integers(3, 100, size=4), 0))
        tok = np.concatenate([p for p, _ in parts])
        mask = np.concatenate([np.full(len(p), t) for p, t in parts])
        if i == 3:
            mask[:] = 0  # stale: in the batch, off the loss
        tokens.append(tok)
        masks.append(mask)
        lags.append(np.full(len(tok), i % 2))
    behaviour = [-rng.uniform(3.0, 6.0, size=len(m)) * m for m in masks]
    return TrainBatch.pack(
        tokens,
        masks,
        behaviour,
        rng.normal(size=real).tolist(),
        rows=rows,
        lags=lags,
    )


def test_first_fit_decreasing_fills_bins_longest_first() -> None:
    lengths = np.asarray([50, 0, 70, 30, 60, 40, 20, 10])
    bins = packing.first_fit_decreasing(range(8), lengths, 100)
    assert bins == [[2, 3], [4, 5], [0, 6, 7]]  # row 1 (nothing trained) in none
    assert all(lengths[b].sum() <= 100 for b in bins)
    with pytest.raises(ValueError, match="more than a bin"):
        packing.first_fit_decreasing([0], np.asarray([101]), 100)
    # Counts: a multiple of the micro-batches, half octaves of it, at most the rows.
    got = [packing.bin_count(n, 2, 16) for n in (0, 1, 3, 5, 7, 9, 13, 16)]
    assert got == [2, 2, 4, 6, 8, 12, 16, 16]
    assert [packing.bin_count(n, 1, 64) for n in (3, 5, 7, 9, 13, 17, 25)] == [
        3,
        6,
        8,
        12,
        16,
        24,
        32,
    ]
    assert packing.bin_count(9, 4, 16) == 12


def test_a_packed_layout_holds_every_trained_token_once_at_its_own_position() -> None:
    batch = long_tail_batch(0)
    mask = batch.loss_mask[:, 1:]
    rows = np.arange(16)
    layout = packing.plan(rows, mask, multiple=2, min_saving=0.25)
    assert layout is not None
    bins, length = layout.rows.shape
    assert length == batch.tokens.shape[1] and bins % 2 == 0 and bins < 12
    lengths = packing.row_lengths(mask)
    trained_rows = {r for r in rows if mask[r].any()}
    assert set(np.unique(layout.rows[layout.rows >= 0])) == trained_rows
    for r in trained_rows:  # each row whole up to its cut, in one bin, positions from 0
        (where_bin,) = np.unique(np.nonzero(layout.rows == r)[0])
        cols = layout.cols[where_bin][layout.rows[where_bin] == r]
        assert cols.tolist() == list(range(lengths[r]))
        segs = np.unique(layout.segments[where_bin][layout.rows[where_bin] == r])
        assert len(segs) == 1 and segs[0] >= 0
    assert (layout.segments[layout.rows < 0] == -1).all()  # padding: its own segment
    assert layout.sequences.sum() == len(trained_rows)
    # Tokens and per-target arrays: the same values, and back again (round trip).
    packed = packing.packed_tokens(batch.tokens, layout)
    real = layout.rows >= 0
    np.testing.assert_array_equal(packed[real], batch.tokens[layout.rows[real], layout.cols[real]])
    got = packing.gather_targets(mask, layout)
    assert got.sum() == mask.sum()  # no trained token lost, none twice
    # A segment's first token is no one's target: masked off, whatever the row said.
    first = (layout.cols[:, 1:] == 0) & (layout.rows[:, 1:] >= 0)
    assert first.any() and not got[first].any()
    values = np.random.default_rng(1).normal(size=mask.shape).astype(np.float32)
    back = packing.scatter_targets(packing.gather_targets(values, layout), layout, 16)
    held = np.arange(mask.shape[1])[None, :] < (lengths[:, None] - 1)
    np.testing.assert_array_equal(back[held], values[held])
    assert not back[~held].any()
    # Rows that barely pack (each bin holds one) are not packed.
    assert packing.plan(rows[:4], mask, multiple=4, min_saving=0.25) is None


def test_the_packed_forward_gives_each_row_its_own_logprobs(model: Model) -> None:
    batch = long_tail_batch(2)
    mask = batch.loss_mask[:, 1:]
    layout = packing.plan(np.arange(16), mask, multiple=1, min_saving=0.0)
    assert layout is not None
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    forward = jax.jit(ts.forward, static_argnums=(0, 4))
    want_lp, want_ent, _ = forward(graphdef, params, rest, jnp.asarray(batch.tokens), 0.7)
    got_lp, got_ent, _ = forward(
        graphdef,
        params,
        rest,
        jnp.asarray(packing.packed_tokens(batch.tokens, layout)),
        0.7,
        positions=jnp.asarray(layout.positions),
        segments=jnp.asarray(layout.segments),
    )
    on = packing.gather_targets(mask, layout) > 0
    for want, got in ((want_lp, got_lp), (want_ent, got_ent)):
        want_packed = packing.gather_targets(np.asarray(want), layout)
        np.testing.assert_allclose(np.asarray(got)[on], want_packed[on], atol=LP_ATOL)
    # Without the segments a row would see the rows before it in its bin: not the same.
    leaked, _, _ = forward(
        graphdef,
        params,
        rest,
        jnp.asarray(packing.packed_tokens(batch.tokens, layout)),
        0.7,
        positions=jnp.asarray(layout.positions),
        segments=jnp.zeros_like(jnp.asarray(layout.segments)),
    )
    assert np.abs(np.asarray(leaked)[on] - np.asarray(got)[on]).max() > 1e-3


def step_of(model: Model, config: TrainerConfig, batch: TrainBatch) -> tuple[dict, object, dict]:
    trainer = Trainer(model, config)
    leaves, tree = jax.tree.flatten(trainer.trainable)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    # Off the init: LoRA's B = 0 would give A no gradient.
    trainer.trainable = jax.tree.unflatten(
        tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    start = trainer.trainable
    metrics = trainer.train_step(batch)
    return metrics, jax.tree.map(jnp.subtract, trainer.trainable, start), trainer.last_layout


def assert_same_step(config: TrainerConfig, model: Model, batch: TrainBatch) -> dict:
    # Packing against the plain path: prefix sharing (the other layout a step may take)
    # is off in both.
    (want_m, want_step, plain), (got_m, got_step, packed) = (
        step_of(model, dataclasses.replace(config, pack=p, share_prefix=False), batch)
        for p in (False, True)
    )
    assert plain["packed"] == 0
    assert set(got_m) == set(want_m)
    for name, value in want_m.items():
        assert got_m[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for a, b in zip(jax.tree.leaves(want_step), jax.tree.leaves(got_step), strict=True):
        assert float(jnp.linalg.norm(a)) > 0
        assert float(jnp.linalg.norm(b - a)) <= 1e-3 * float(jnp.linalg.norm(a))
    return packed


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "token_sum_norm"])
def test_a_packed_train_step_equals_the_plain_one(
    model: Model, aggregation: str, lora: LoraConfig | None
) -> None:
    # Two mini-batches of two micro-batches, two epochs: pi_old and pi_ref (KL) scored
    # packed before the updates; an entropy bonus under a floor; lags split the mismatch.
    config = TrainerConfig(
        lora=lora,
        learning_rate=1e-2,
        mini_batches=2,
        micro_batches=2,
        epochs=2,
        temperature=0.7,
        grpo=GrpoConfig(
            entropy_coef=0.01,
            entropy_floor=4.0,
            kl_coef=0.1,
            aggregation=aggregation,  # type: ignore[arg-type]
            norm_tokens=64,
        ),
    )
    packed = assert_same_step(config, model, long_tail_batch(3))
    assert packed["packed"] == 4 and packed["plain"] == 0  # every update packed
    assert packed["positions"] <= 0.75 * packed["plain_positions"]


def test_the_head_at_every_position_packs_too(model: Model) -> None:
    config = TrainerConfig(
        mini_batches=2,
        temperature=0.7,
        learning_rate=1e-2,
        head_positions="all",
        logits_chunk=None,
        grpo=GrpoConfig(kl_coef=0.1),
    )
    assert assert_same_step(config, model, long_tail_batch(4))["packed"] == 2


def test_the_plain_path_where_packing_does_not_apply(model: Model) -> None:
    batch = long_tail_batch(5)
    base = TrainerConfig(mini_batches=2, learning_rate=1e-2)
    cases = {
        "ppo": dataclasses.replace(base, ppo=PpoConfig()),
        "off": dataclasses.replace(base, pack=False),
    }
    for name, config in cases.items():
        trainer = Trainer(model, config)
        trainer.train_step(dataclasses.replace(batch, rewards=np.ones(16, np.float32)))
        assert trainer.last_layout["packed"] == 0, name
    # Rows of one length and no padding rows save nothing: the mini-batches run plain,
    # with the same numbers.
    even = long_tail_batch(6, real=16, turns=(11, 12))
    layout = assert_same_step(dataclasses.replace(base, grpo=GrpoConfig(kl_coef=0.1)), model, even)
    assert layout["packed"] == 0 and layout["plain"] == 2
    assert layout["positions"] == layout["plain_positions"]
    with pytest.raises(ValueError, match="pack_min_saving"):
        TrainerConfig(pack_min_saving=1.0)


def prompt_heavy_batch(seed: int, prompt_len: int = 48, answers: int = 12) -> TrainBatch:
    """Two GRPO groups of 8 on a ``prompt_len``-token prompt each, one 4-``answers``-token
    answer a row: a group's prompt is most of each row (the tool-use spec's shape)."""
    rng = np.random.default_rng(seed)
    tokens, masks, groups = [], [], []
    for group in range(2):
        prompt = rng.integers(3, 100, size=prompt_len)
        for _ in range(8):
            answer = rng.integers(3, 100, size=int(rng.integers(4, answers + 1)))
            tokens.append(np.concatenate([prompt, answer]))
            masks.append(np.concatenate([np.zeros(prompt_len), np.ones(len(answer))]))
            groups.append(group)
    behaviour = [-rng.uniform(3.0, 6.0, size=len(m)) * m for m in masks]
    advantages = rng.normal(size=16).tolist()
    return TrainBatch.pack(tokens, masks, behaviour, advantages, rows=16, groups=groups)


def test_with_sharing_and_packing_on_a_step_shares_only_where_that_computes_far_less(
    model: Model,
) -> None:
    # No minimum saving for either: both always apply, and the step must choose.
    base = TrainerConfig(
        lora=LORA,
        mini_batches=2,
        learning_rate=1e-2,
        temperature=0.7,
        share_prefix_min=0,
        pack_min_saving=0.0,
    )
    modes = {"shared": (True, False), "packed": (False, True), "both": (True, True)}
    cases = (
        (long_tail_batch(7), "packed"),  # sharing saves nothing against plain
        (prompt_heavy_batch(8), "shared"),  # at most half packing's positions
        # Fewer positions than packing, but not half: a shared position costs more.
        (prompt_heavy_batch(8, prompt_len=40, answers=30), "packed"),
    )
    for batch, best in cases:
        runs = {
            name: step_of(model, dataclasses.replace(base, share_prefix=s, pack=p), batch)
            for name, (s, p) in modes.items()
        }
        layouts = {name: run[2] for name, run in runs.items()}
        assert layouts["both"][best] == 2, (best, layouts)
        assert layouts["both"]["positions"] == layouts[best]["positions"]
        shared, packed = layouts["shared"]["positions"], layouts["packed"]["positions"]
        if best == "shared":
            assert shared <= SHARE_OVER_PACK * packed
        else:  # sharing saves too little against packing
            assert shared > SHARE_OVER_PACK * packed
        # The same step as the layout it took, to the bit: the same shuffle, the same sums.
        (want_m, want_step, _), (got_m, got_step, _) = runs[best], runs["both"]
        assert got_m == want_m
        for a, b in zip(jax.tree.leaves(want_step), jax.tree.leaves(got_step), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_batches_of_other_lengths_share_few_compiled_steps(model: Model) -> None:
    trainer = Trainer(model, TrainerConfig(mini_batches=2, micro_batches=2, temperature=0.7))
    for seed in range(6):
        batch = long_tail_batch(10 + seed, real=int(8 + seed))
        assert batch.tokens.shape[1] == 128
        trainer.train_step(batch)
        assert trainer.last_layout["packed"] == 2
    # One bin count a step (half octaves of the micro-batches), one head width a step.
    assert trainer._update._cache_size() <= 3
    assert trainer._score._cache_size() <= 3
