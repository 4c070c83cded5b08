"""A step whose shape is new runs in a compiled shape that holds it, until the padding
paid for would have paid the compile; and a step so run computes its own numbers.

The ledger's arithmetic is checked with prices fed through `record` (its only input:
a step's wall time), the trainer's with real steps of a small model, compared with a
trainer that never pads (`fit_compiled=False`) on the same batches from the same
weights. Tolerances are test_packing's: the same matmuls over other shapes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.models import Model, ModelConfig
from rl_core.training.shape_ledger import ShapeLedger, StepShape
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

BIG = StepShape("packed", 512, 8, 64)
SMALL = StepShape("packed", 512, 6, 32)


def warmed(per_position: float, compile_s: float) -> ShapeLedger:
    """A ledger that compiled BIG (``compile_s`` over its compute) and ran it twice more."""
    ledger = ShapeLedger(updates=1)
    first = ledger.choose([BIG])
    assert first.run == BIG  # nothing compiled yet: its own shape
    work = per_position * BIG.positions(1)
    ledger.record(first, work + compile_s)
    for _ in range(2):
        again = ledger.choose([BIG])
        assert again.run == BIG
        ledger.record(again, work)
    assert ledger.prices() == pytest.approx((per_position, compile_s))
    return ledger


def test_a_new_shape_is_rented_until_the_padding_paid_would_pay_a_compile() -> None:
    per, compile_s = 1e-4, 1.0
    ledger = warmed(per, compile_s)
    extra = per * (BIG.positions(1) - SMALL.positions(1))
    assert extra > 0
    rented = 0
    while True:
        choice = ledger.choose([SMALL])
        if choice.run == SMALL:
            break
        assert choice.run == BIG and choice.natural == SMALL
        ledger.record(choice, per * BIG.positions(1))
        rented += 1
        assert rented < 1000
    # Ski rental: bought at the step whose rent would reach the price, not before.
    assert rented * extra < compile_s <= (rented + 1) * extra
    assert ledger.padded_steps == rented
    ledger.record(choice, per * SMALL.positions(1) + compile_s)
    assert SMALL in ledger.compiled and ledger.rent == 0.0
    assert ledger.choose([SMALL]).run == SMALL  # bought: its own from now on


def test_the_padding_of_many_shapes_pays_one_compile_together() -> None:
    # A long tail meets many shapes a few times each: rent kept per shape would never
    # buy any while the padding, summed over them, grew without bound.
    per, compile_s = 2e-5, 1.0
    ledger = warmed(per, compile_s)
    shapes = [StepShape("packed", 512, bins, head) for bins in (2, 4, 6) for head in (16, 32)]
    paid, steps = 0.0, 0
    while True:
        natural = shapes[steps % len(shapes)]
        choice = ledger.choose([natural])
        if choice.run == natural:
            break
        paid += per * (BIG.positions(1) - natural.positions(1))
        ledger.record(choice, per * BIG.positions(1))
        steps += 1
        assert steps < 1000  # a ledger that never buys fails here rather than hangs
    assert steps > len(shapes)  # each shape rented, none often enough to buy alone
    assert paid < compile_s <= paid + per * (BIG.positions(1) - natural.positions(1))


def test_before_the_prices_are_measured_a_new_shape_compiles() -> None:
    ledger = ShapeLedger(updates=1)
    choice = ledger.choose([BIG])
    ledger.record(choice, 2.0)  # a compile, but no step without one to price a position
    assert ledger.prices() is None
    assert ledger.choose([SMALL]).run == SMALL


def test_only_a_shape_of_the_same_layout_and_length_holding_every_width_is_rented() -> None:
    ledger = warmed(1e-4, 100.0)  # a compile worth any padding
    for other in (
        StepShape("plain", 512, 6, 32),  # another layout
        StepShape("packed", 384, 6, 32),  # another length (the trainer pads the batch
        # to a longer compiled one itself and offers its shape there: below)
        StepShape("packed", 512, 12, 32),  # more bins than the compiled shape has
        StepShape("packed", 512, 6, 128),  # a wider head
        dataclasses.replace(SMALL, score_rows=4),  # a scoring pass BIG has not
    ):
        choice = ledger.choose([other])  # compiled, wide enough to hold BIG too where it
        # can: the same layout and length (the next test)
        same = (other.kind, other.length) == (BIG.kind, BIG.length)
        assert choice.run.holds(other) and choice.run.holds(BIG) == same, other
        assert choice.run not in ledger.compiled, other
    # Offered at a longer compiled length too, the step runs there.
    own = StepShape("packed", 384, 8, 64)
    choice = ledger.choose([own, StepShape("packed", 512, 6, 64)])
    assert choice.run == BIG and choice.own == own


@pytest.fixture(scope="module")
def model(tiny_config: ModelConfig) -> Model:
    return Model(dataclasses.replace(tiny_config, n_layers=2), rngs=nnx.Rngs(0))


def batch_of(seed: int, longest: int) -> TrainBatch:
    """16 rows up to ``longest`` tokens: an 8-token prompt, then 4-token answers
    (trained) and 4-token observations (not); a quarter-octave length, as a run pads."""
    rng = np.random.default_rng(seed)
    tokens, masks = [], []
    for i in range(16):
        n = longest if i == 0 else int(rng.integers(12, longest))
        mask = np.zeros(n, np.float32)
        for at in range(8, n, 8):
            mask[at : at + 4] = 1.0
        tokens.append(rng.integers(3, 100, size=n))
        masks.append(mask)
    behaviour = [-rng.uniform(3.0, 6.0, size=len(m)) * m for m in masks]
    return TrainBatch.pack(
        tokens, masks, behaviour, rng.normal(size=16).tolist(), rows=16, bucket=lambda n, _: n
    )


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "plain"])
def test_a_step_run_in_a_bigger_compiled_shape_computes_its_own_numbers(
    model: Model, pack: bool
) -> None:
    # Two mini-batches, two epochs and a KL term: pi_old and pi_ref scored too (packed
    # when the step packs), so every program of the step runs in the bigger shape.
    config = TrainerConfig(
        learning_rate=0.003,
        mini_batches=2,
        epochs=2,
        temperature=0.7,
        pack=pack,
        share_prefix=False,
        grpo=GrpoConfig(kl_coef=0.05, entropy_coef=0.05, entropy_floor=0.15),
    )
    fitted = Trainer(model, config)
    own = Trainer(model, dataclasses.replace(config, fit_compiled=False))
    assert fitted.shapes is not None and own.shapes is None
    short_one = batch_of(1, 64)
    for batch in (batch_of(0, 96), batch_of(0, 96), batch_of(0, 96)):  # compile, then price
        fitted.train_step(batch)
        own.train_step(batch)
    assert fitted.shapes.prices() is not None
    programs, own_programs = fitted._update._cache_size(), own._update._cache_size()
    got = fitted.train_step(short_one)
    want = own.train_step(short_one)
    # Run at 96 tokens in a program compiled before: no new one, where its own length
    # (64) made the other trainer compile one.
    assert fitted.shapes.padded_steps == 1
    assert fitted._update._cache_size() == programs
    assert own._update._cache_size() == own_programs + 1
    if pack:
        assert fitted.last_layout["packed"] == 4
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for a, b in zip(jax.tree.leaves(own.trainable), jax.tree.leaves(fitted.trainable), strict=True):
        assert float(jnp.abs(a - b).max()) <= 1e-5


def test_a_shape_nothing_holds_compiles_wide_enough_to_hold_what_came_before() -> None:
    first, more_bins = StepShape("packed", 512, 6, 128), StepShape("packed", 512, 12, 32)
    ledger = ShapeLedger(updates=1)
    ledger.record(ledger.choose([first]), 2.0)
    ledger.record(ledger.choose([first]), 0.1)  # priced: compiles cost 1.9 s
    ledger.record(ledger.choose([StepShape("packed", 384, 16, 16)]), 2.0)  # another length
    # More bins than the first, a narrower head: held by nothing. Compiled as the widest
    # of its length and layout, so that neither mix needs another program.
    choice = ledger.choose([more_bins])
    assert choice.natural == more_bins and choice.run == StepShape("packed", 512, 12, 128)
    ledger.record(choice, 2.0)
    between = ledger.choose([StepShape("packed", 512, 8, 64)])
    assert between.run == choice.run  # rented, not compiled
    # A shape of a layout nothing compiled is its own.
    plain = StepShape("plain", 512, 8, 64)
    assert ledger.choose([plain]).run == plain
