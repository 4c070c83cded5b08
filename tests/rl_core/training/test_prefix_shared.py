"""Prefix-shared training computes the unshared path's logprobs, gradients and updates.

Batches are GRPO-shaped: groups whose members share a prompt of their own length, then
answers of different lengths. Among them a partial group (a straggler's or a dropped
member's place is a padding row), a group whose members share nothing, multi-turn rows
(answer, observation, answer) and answers that start with the same tokens (the shared
prefix must stop at the first trained position, not at the common one). Tolerances are
the chunked head's (tests/rl_core/training/test_chunked_logits.py): logprobs within
1e-5 nats, gradients rtol 1e-4 / atol 1e-6 (float32 sums taken in another order).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.algorithms.grpo import Counts, GrpoConfig
from rl_core.algorithms.ppo import PpoConfig
from rl_core.models import Model, ModelConfig
from rl_core.training import prefix_layout
from rl_core.training import train_step as ts
from rl_core.training.lora import LoraConfig
from rl_core.training.prefix_shared import scatter
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

LP_ATOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6
LORA = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))


@pytest.fixture(scope="module")
def model(tiny_config: ModelConfig) -> Model:
    return Model(dataclasses.replace(tiny_config, n_layers=2), rngs=nnx.Rngs(0))


def grpo_batch(seed: int, *, rows: int = 12) -> TrainBatch:
    """Three groups in ``rows`` rows: 5 members on a 21-token prompt (one masked out), 3 on
    a 17-token one (a partial group) with two-turn rows, and 2 members that share
    nothing; padding rows after."""
    rng = np.random.default_rng(seed)
    tokens: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    groups: list[int] = []

    def add(prompt: np.ndarray, turns: list[int], gaps: list[int], group: int) -> None:
        parts, trained = [prompt], [np.zeros(len(prompt))]
        for i, n in enumerate(turns):
            parts.append(rng.integers(3, 100, size=n))
            trained.append(np.ones(n))
            if i < len(gaps):  # an observation between two answers: not trained on
                parts.append(rng.integers(3, 100, size=gaps[i]))
                trained.append(np.zeros(gaps[i]))
        tokens.append(np.concatenate(parts))
        masks.append(np.concatenate(trained))
        groups.append(group)

    prompt = rng.integers(3, 100, size=21)
    for _ in range(5):
        add(prompt, [int(rng.integers(4, 12))], [], 0)
    masks[-1] = 0 * masks[-1]  # a member dropped from the loss (stale): trains on nothing
    prompt = rng.integers(3, 100, size=17)
    for _ in range(3):
        add(
            prompt, [int(rng.integers(3, 7)), int(rng.integers(3, 7))], [int(rng.integers(2, 5))], 1
        )
    for _ in range(2):
        add(rng.integers(3, 100, size=int(rng.integers(5, 9))), [int(rng.integers(4, 9))], [], 2)
    n = len(tokens)
    behaviour = [(-rng.uniform(3.0, 6.0, size=len(m)) * m) for m in masks]
    advantages = rng.normal(size=n).tolist()
    rewards = rng.uniform(size=n).tolist()
    return TrainBatch.pack(
        tokens, masks, behaviour, advantages, rows=rows, rewards=rewards, groups=groups
    )


def moved(trainer: Trainer) -> Trainer:
    # LoRA's B starts at 0 (no gradient for A): move every trainable leaf off its init.
    leaves, tree = jax.tree.flatten(trainer.trainable)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    trainer.trainable = jax.tree.unflatten(
        tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    return trainer


def shared_layout(trainer: Trainer, batch: TrainBatch) -> prefix_layout.Layout:
    groups = prefix_layout.row_groups(batch.tokens, batch.loss_mask[:, 1:], batch.groups, 0)
    (layout,) = trainer._layouts(batch, groups, None, 1)
    assert layout.prefix is not None  # the shared path, not the fallback
    return layout


@pytest.mark.parametrize("alibi", [False, True], ids=["rope", "rope+alibi"])
def test_logprobs_entropy_and_values_equal_the_unshared_forward(
    tiny_config: ModelConfig, alibi: bool
) -> None:
    # ALiBi (builtin:tiny-alibi) biases by distance: the suffix's slots must be positions.
    config = dataclasses.replace(tiny_config, n_layers=2, alibi_slope=1.0 if alibi else 0.0)
    model = Model(config, rngs=nnx.Rngs(0))
    trainer = Trainer(model, TrainerConfig(share_prefix=True, share_prefix_min=0))
    batch = grpo_batch(0)
    layout = shared_layout(trainer, batch)
    assert layout.prefix_lengths is not None
    assert sorted(set(layout.prefix_lengths.tolist()) - {0}) == [16, 20]  # first input trained
    full = trainer._prepare(batch)
    mb = prefix_layout.mini_batch(full, layout)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    forward = jax.jit(ts.forward, static_argnums=(0, 4), static_argnames="with_hidden")
    want = forward(graphdef, params, rest, full.tokens, 0.7, with_hidden=True)
    got = forward(graphdef, params, rest, mb.tokens, 0.7, with_hidden=True, prefix=mb.prefix)
    rows, offsets = jnp.asarray(layout.rows), jnp.asarray(layout.offsets)
    # Every position a suffix covers, trained or not, back in row layout.
    covered = scatter(jnp.ones_like(got[0]), rows, offsets, full.mask.shape[1], 0 * full.mask)
    assert float((covered * full.mask).sum()) == float(full.mask.sum()) > 0
    for a, b in ((want[0], got[0]), (want[1], got[1])):  # log pi(target), entropy
        back = scatter(b, rows, offsets, full.mask.shape[1], jnp.zeros_like(a))
        np.testing.assert_allclose(back * covered, a * covered, atol=LP_ATOL)
    assert want[2] is not None and got[2] is not None
    values = ts.init_value_head(model.config.d_model) | {"w": jnp.linspace(-1, 1, 64)}
    v_back = scatter(ts.values_of(values, got[2]), rows, offsets, full.mask.shape[1], 0 * full.mask)
    v_want = ts.values_of(values, want[2])
    np.testing.assert_allclose(v_back * covered, v_want * covered, atol=LP_ATOL)


@pytest.mark.parametrize(
    ("lora", "apply"),
    [(None, "merged"), (LORA, "merged"), (LORA, "unmerged")],
    ids=["full", "lora-merged", "lora-unmerged"],
)
def test_micro_loss_gradients_equal_the_unshared(
    model: Model, lora: LoraConfig | None, apply: ts.LoraApply
) -> None:
    # An entropy bonus and a KL term: every term of the loss has a gradient.
    grpo = GrpoConfig(entropy_coef=0.05, kl_coef=0.1)
    config = TrainerConfig(
        lora=lora,
        lora_apply=apply,
        grpo=grpo,
        temperature=0.7,
        share_prefix=True,
        share_prefix_min=0,
    )
    trainer = moved(Trainer(model, config))
    batch = grpo_batch(1)
    full = trainer._prepare(batch)
    shared = prefix_layout.mini_batch(full, shared_layout(trainer, batch))
    counts = Counts.of(full.mask)
    assert Counts.of(shared.mask) == counts  # the same trained tokens and rows
    grads, metrics = {}, {}
    for name, mb in (("plain", full), ("shared", shared)):

        def loss(t: ts.Trainable, mb: ts.MiniBatch = mb) -> tuple[jax.Array, dict[str, jax.Array]]:
            args = (trainer._frozen, trainer._rest, mb, counts)
            return ts.micro_loss(t, *args, graphdef=trainer._graphdef, cfg=trainer._cfg)

        grads[name], metrics[name] = jax.jit(jax.grad(loss, has_aux=True))(trainer.trainable)
    for key, value in metrics["plain"].items():
        assert float(metrics["shared"][key]) == pytest.approx(float(value), rel=1e-5, abs=1e-6)
    assert float(metrics["plain"]["kl"]) > 0
    for a, b in zip(jax.tree.leaves(grads["plain"]), jax.tree.leaves(grads["shared"]), strict=True):
        assert float(jnp.abs(a).max()) > 0
        np.testing.assert_allclose(b, a, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def step_of(model: Model, config: TrainerConfig, batch: TrainBatch) -> tuple[dict, object]:
    trainer = moved(Trainer(model, config))
    start = trainer.trainable
    metrics = trainer.train_step(batch)
    return metrics, jax.tree.map(jnp.subtract, trainer.trainable, start)


def assert_same_step(a: tuple[dict, object], b: tuple[dict, object]) -> None:
    (a_m, a_step), (b_m, b_step) = a, b
    assert set(a_m) == set(b_m)
    for name, value in a_m.items():
        assert b_m[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    # Leaf by leaf, as the chunked head's test does (Adam scales each element alone).
    for x, y in zip(jax.tree.leaves(a_step), jax.tree.leaves(b_step), strict=True):
        assert float(jnp.linalg.norm(x)) > 0
        assert float(jnp.linalg.norm(y - x)) <= 1e-3 * float(jnp.linalg.norm(x))


@pytest.mark.parametrize("algorithm", ["grpo-kl", "ppo"])
def test_a_train_step_in_two_mini_and_two_micro_batches_equals_the_unshared(
    model: Model, algorithm: str
) -> None:
    # pi_old (two mini-batches), pi_ref (KL) and V_old (PPO) are scored prefix-shared too.
    config = TrainerConfig(
        lora=LORA,
        learning_rate=1e-2,
        mini_batches=2,
        micro_batches=2,
        temperature=0.7,
        grpo=GrpoConfig(entropy_coef=0.01, kl_coef=0.1 if algorithm == "grpo-kl" else 0.0),
        ppo=PpoConfig() if algorithm == "ppo" else None,
        share_prefix=True,
    )
    batch = grpo_batch(2)
    # The same whole-group mini-batches (one RNG), the plain forward over them: sharing
    # saves no positions at all when it must save T-1 of them per row.
    unshared = step_of(model, dataclasses.replace(config, share_prefix_min=10**6), batch)
    shared = step_of(model, dataclasses.replace(config, share_prefix_min=0), batch)
    assert_same_step(unshared, shared)


def test_one_mini_batch_equals_the_trainer_without_sharing(model: Model) -> None:
    # With one mini-batch the rows' order is immaterial: the plain path is the reference.
    config = TrainerConfig(lora=LORA, learning_rate=1e-2, micro_batches=2, temperature=0.7)
    batch = grpo_batch(3)
    plain = step_of(model, dataclasses.replace(config, share_prefix=False, pack=False), batch)
    shared = step_of(
        model, dataclasses.replace(config, share_prefix=True, share_prefix_min=0), batch
    )
    assert_same_step(plain, shared)


# -- the host layout -----------------------------------------------------------------------


def rows_of(
    *lengths_and_firsts: tuple[int, int], prompt: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Rows on one ``prompt``-token prompt: (length, first trained position) each."""
    t = max(n for n, _ in lengths_and_firsts) + 1
    tokens = np.zeros((len(lengths_and_firsts), t), np.int32)
    mask = np.zeros((len(lengths_and_firsts), t - 1), np.float32)
    for i, (n, first) in enumerate(lengths_and_firsts):
        tokens[i, :prompt] = np.arange(1, prompt + 1)
        tokens[i, prompt:n] = 50 + i  # each answer its own
        mask[i, first : n - 1] = 1
    return tokens, mask


def test_the_prefix_stops_at_the_first_trained_position() -> None:
    tokens, mask = rows_of((20, 9), (18, 9))
    tokens[:, 10:13] = 7  # both answers open alike: common to 13, trained from 9
    first, end = prefix_layout.trained_spans(mask)
    assert first.tolist() == [9, 9] and end.tolist() == [19, 17]
    assert prefix_layout.shared_length(tokens, first) == 9
    # A member that trains on an observation's next token earlier caps the block there.
    mask[1, 4] = 1
    first, _ = prefix_layout.trained_spans(mask)
    assert prefix_layout.shared_length(tokens, first) == 4


def test_rows_that_train_on_nothing_are_left_out_and_groups_inferred() -> None:
    tokens, mask = rows_of((20, 9), (18, 9), (19, 9), (16, 9))
    tokens[2:, :10] += 100  # rows 2 and 3 on another prompt
    mask[1] = 0  # a member whose tokens are all masked (stale, or a padding row)
    named = prefix_layout.row_groups(tokens, mask, np.asarray([0, 0, 1, 1]), 64)
    assert [g.tolist() for g in named] == [[0], [2, 3]]
    unnamed = prefix_layout.row_groups(tokens, mask, np.asarray([0, 0, -1, 1]), 64)
    assert [g.tolist() for g in unnamed] == [[0], [2], [3]]  # trained, so kept, alone
    inferred = prefix_layout.row_groups(tokens, mask, None, 8)  # consecutive, >= 8 shared
    assert [g.tolist() for g in inferred] == [[0], [2, 3]]
    alone = prefix_layout.row_groups(tokens, mask, None, 10)  # 9 shared < 10: no group
    assert [g.tolist() for g in alone] == [[0], [2], [3]]


def test_cuts_run_through_groups_and_each_piece_shares_its_prompt() -> None:
    # A partial group of 5, a full one of 8; 2 mini-batches of 2 micro-batches.
    groups = [np.arange(5), np.arange(5, 13)]
    minis = prefix_layout.plan(groups, np.asarray([1, 0]), 2, 2)
    blocks = [[b.tolist() for b in bs] for ms in minis for bs in ms]
    assert blocks == [
        [[5, 6, 7, 8]],
        [[9, 10, 11]],
        [[12], [0, 1]],
        [[2, 3, 4]],
    ]
    tokens, mask = rows_of(*[(40, 9)] * 13)
    layouts, shared = prefix_layout.layouts(tokens, mask, minis, rows_per_micro=4, min_saving=0)
    assert shared
    third = layouts[1]  # micro-batches [[12], [0, 1]] and [[2, 3, 4]], 2 prefix slots each
    assert third.rows.tolist() == [12, 0, 1, -1, 2, 3, 4, -1]
    assert third.owner is not None and third.owner.tolist() == [0, 1, 1, 0, 0, 0, 0, 0]
    assert third.prefix_lengths is not None and third.prefix_lengths.tolist() == [9, 9, 9, 0]
    assert third.offsets.tolist() == [9, 9, 9, 0, 9, 9, 9, 0]
    assert third.width == 32  # 39 - 9 = 30 positions, bucketed


def test_sharing_that_saves_too_little_runs_the_plain_forward_over_the_same_rows() -> None:
    # A 40-token prompt trained from position 39 on, 20 positions each (bucket 32): T-1 = 60
    # against a prefix of 40 per 2 rows plus a suffix of 32: 8 positions saved per row.
    tokens, mask = rows_of((60, 39), (60, 39), prompt=40)
    minis = prefix_layout.plan([np.arange(2)], None, 1, 1)
    (layout,), shared = prefix_layout.layouts(tokens, mask, minis, rows_per_micro=2, min_saving=8)
    assert shared and layout.width == 32
    assert layout.prefix is not None and layout.prefix.shape == (1, 40)
    (layout,), shared = prefix_layout.layouts(tokens, mask, minis, rows_per_micro=2, min_saving=9)
    assert not shared and layout.prefix is None and layout.owner is None
    assert layout.rows.tolist() == [0, 1] and layout.offsets.tolist() == [0, 0]
    assert layout.width == 60  # whole rows: T-1
