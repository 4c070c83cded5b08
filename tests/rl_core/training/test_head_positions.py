"""The output head at the trained positions only gives the all-positions path's numbers.

Rows as a GRPO batch has them: one prompt, answers of different lengths, two-turn rows
whose observation between the answers is masked out, a member trained on nothing (stale)
and padding rows. Tolerances are the chunked head's (tests/rl_core/training/
test_chunked_logits.py), float32 sums taken in another order (the head's matmul runs over
the gathered [B * K] states instead of [B * (T-1)], chunked differently): logprobs and
entropy within 1e-5 nats, gradients rtol 1e-4 / atol 1e-6, metrics rel 1e-5 / abs 1e-6,
a whole step's update within 1e-3 of its norm, leaf by leaf (Adam scales each element
by its own gradient's size, as the chunked head's step test says).
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
from rl_core.training.head_positions import trained_positions
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

CHUNK = 7  # does not divide the gathered positions: a padded last chunk would show
LP_ATOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6
LORA = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o"))


@pytest.fixture(scope="module")
def model(tiny_config: ModelConfig) -> Model:
    return Model(dataclasses.replace(tiny_config, n_layers=2), rngs=nnx.Rngs(0))


def grpo_batch(seed: int, *, rows: int = 12, answers: tuple[int, int] = (3, 10)) -> TrainBatch:
    """One group on a 13-token prompt: 5 one-turn members (answer lengths in ``answers``),
    2 two-turn members (answer, 3-token observation, answer), 1 trained on nothing; then
    padding rows."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, 100, size=13)
    tokens: list[np.ndarray] = []
    masks: list[np.ndarray] = []

    def add(*parts: tuple[int, int]) -> None:  # (length, trained) spans after the prompt
        tokens.append(np.concatenate([prompt, *(rng.integers(3, 100, size=n) for n, _ in parts)]))
        masks.append(np.concatenate([np.zeros(len(prompt)), *(np.full(n, t) for n, t in parts)]))

    for _ in range(5):
        add((int(rng.integers(*answers)), 1))
    for _ in range(2):
        add((int(rng.integers(3, 6)), 1), (3, 0), (int(rng.integers(3, 6)), 1))
    add((6, 0))  # a stale member: in the batch, off the loss
    n = len(tokens)
    behaviour = [-rng.uniform(3.0, 6.0, size=len(m)) * m for m in masks]
    return TrainBatch.pack(
        tokens,
        masks,
        behaviour,
        rng.normal(size=n).tolist(),
        rows=rows,
        rewards=rng.uniform(size=n).tolist(),
        groups=[0] * n,
    )


def moved(trainer: Trainer, like: Trainer | None = None) -> Trainer:
    """Every trainable leaf moved off its init (LoRA's B = 0 gives A no gradient), or
    ``like``'s weights: two trainers on one policy."""
    if like is not None:
        trainer.trainable = like.trainable
        return trainer
    leaves, tree = jax.tree.flatten(trainer.trainable)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    trainer.trainable = jax.tree.unflatten(
        tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    return trainer


def test_trained_positions_are_packed_in_order_and_bucketed() -> None:
    mask = np.zeros((3, 40), np.float32)
    mask[0, 5:8] = mask[0, 20:25] = 1  # two turns: 8 positions
    mask[2, 30:40] = 1  # 10 positions; row 1 trains on nothing
    got = np.asarray(trained_positions(mask))
    assert got.shape == (3, 16) and got.dtype == np.int32  # 10, bucketed to 16
    assert got[0].tolist() == [5, 6, 7, 20, 21, 22, 23, 24] + [-1] * 8
    assert got[1].tolist() == [-1] * 16
    assert got[2].tolist() == list(range(30, 40)) + [-1] * 6
    assert trained_positions(mask, minimum=4).shape == (3, 16)
    assert trained_positions(mask[:, :12]).shape == (3, 12)  # never wider than the row
    mask[2, :] = 1
    assert trained_positions(mask).shape == (3, 40)  # a row trained whole: indexed whole
    with pytest.raises(ValueError, match="head_positions"):
        TrainerConfig(head_positions="some")  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", [None, CHUNK], ids=["unchunked", "chunked"])
def test_logprobs_and_entropy_at_the_trained_positions_equal_every_positions(
    model: Model, chunk: int | None
) -> None:
    batch = grpo_batch(0)
    mask = batch.loss_mask[:, 1:]
    positions = trained_positions(mask)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    forward = jax.jit(ts.forward, static_argnums=(0, 4), static_argnames=("logits_chunk",))
    tokens = jnp.asarray(batch.tokens)
    want = forward(graphdef, params, rest, tokens, 0.7, logits_chunk=chunk)
    got = forward(graphdef, params, rest, tokens, 0.7, logits_chunk=chunk, trained_at=positions)
    on = mask > 0
    assert on.sum() > 0 and (~on).sum() > 0
    for a, b in ((want[0], got[0]), (want[1], got[1])):  # log pi(target), entropy
        np.testing.assert_allclose(np.asarray(b)[on], np.asarray(a)[on], atol=LP_ATOL)
        assert float(jnp.abs(b).max()) > 0
        assert not np.asarray(b)[~on].any()  # the head ran nowhere else


@pytest.mark.parametrize("shared", [False, True], ids=["rows", "prefix-shared"])
@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_loss_metrics_and_gradients_equal_the_all_positions_path(
    model: Model, lora: LoraConfig | None, shared: bool
) -> None:
    # An entropy bonus and a KL term (pi_ref scored on the trained positions only): every
    # term of the loss has a gradient through the head.
    config = TrainerConfig(
        lora=lora,
        grpo=GrpoConfig(entropy_coef=0.05, kl_coef=0.1),
        temperature=0.7,
        logits_chunk=CHUNK,
        share_prefix=shared,
        share_prefix_min=0,
    )
    reference = moved(Trainer(model, dataclasses.replace(config, head_positions="all")))
    trainer = moved(Trainer(model, config), like=reference)
    batch = grpo_batch(1)
    want_mb = reference._prepare(batch)
    got_mb = trainer._prepare(batch)
    assert want_mb.trained_at is None and got_mb.trained_at is not None
    assert got_mb.trained_at.shape == (12, 16)  # 13 trained tokens at most, bucketed
    if shared:
        groups = prefix_layout.row_groups(batch.tokens, batch.loss_mask[:, 1:], batch.groups, 0)
        (layout,) = trainer._layouts(batch, groups, None, 1)
        assert layout.prefix is not None  # the shared forward, not its fallback
        got_mb = prefix_layout.mini_batch(got_mb, layout)
    counts = Counts.of(want_mb.mask)
    results = []
    for t, mb in ((reference, want_mb), (trainer, got_mb)):

        def loss(
            w: ts.Trainable, t: Trainer = t, mb: ts.MiniBatch = mb
        ) -> tuple[jax.Array, dict[str, jax.Array]]:
            return ts.micro_loss(
                w, t._frozen, t._rest, mb, counts, graphdef=t._graphdef, cfg=t._cfg
            )

        results.append(jax.jit(jax.grad(loss, has_aux=True))(t.trainable))
    (want_g, want_m), (got_g, got_m) = results
    assert float(want_m["kl"]) > 0 and float(want_m["entropy"]) > 0
    assert set(got_m) == set(want_m)
    for key, value in want_m.items():
        assert float(got_m[key]) == pytest.approx(float(value), rel=1e-5, abs=1e-6), key
    for a, b in zip(jax.tree.leaves(want_g), jax.tree.leaves(got_g), strict=True):
        assert float(jnp.abs(a).max()) > 0
        np.testing.assert_allclose(b, a, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def step_of(model: Model, config: TrainerConfig, batch: TrainBatch) -> tuple[dict, object]:
    trainer = moved(Trainer(model, config))
    start = trainer.trainable
    metrics = trainer.train_step(batch)
    return metrics, jax.tree.map(jnp.subtract, trainer.trainable, start)


@pytest.mark.parametrize("algorithm", ["ppo", "grpo-kl-shared"])
def test_a_train_step_in_mini_and_micro_batches_equals_the_all_positions_path(
    model: Model, algorithm: str
) -> None:
    # Two mini-batches: pi_old (and PPO's V_old, from every position's hidden state) is
    # scored before the updates; with KL pi_ref too, prefix-shared in the second case.
    ppo = algorithm == "ppo"
    config = TrainerConfig(
        lora=None if ppo else LORA,
        learning_rate=1e-2,
        mini_batches=2,
        micro_batches=2,
        temperature=0.7,
        grpo=GrpoConfig(entropy_coef=0.01, kl_coef=0.0 if ppo else 0.1),
        ppo=PpoConfig() if ppo else None,
        share_prefix=not ppo,
        share_prefix_min=0,
    )
    batch = grpo_batch(2)
    (want_m, want_step), (got_m, got_step) = (
        step_of(model, dataclasses.replace(config, head_positions=h), batch)
        for h in ("all", "trained")
    )
    assert set(got_m) == set(want_m)
    for name, value in want_m.items():
        assert got_m[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for a, b in zip(jax.tree.leaves(want_step), jax.tree.leaves(got_step), strict=True):
        assert float(jnp.linalg.norm(a)) > 0
        assert float(jnp.linalg.norm(b - a)) <= 1e-3 * float(jnp.linalg.norm(a))


def test_batches_of_different_trained_counts_share_a_compiled_step(model: Model) -> None:
    # The plain layout's rows: packed bins have shapes of their own (test_packing.py).
    trainer = Trainer(model, TrainerConfig(temperature=0.7, learning_rate=1e-3, pack=False))
    shapes = set()
    # The longest row is at most 13 + 18 = 31 tokens: one length bucket (32) throughout.
    for seed, answers in enumerate([(3, 5), (6, 9), (9, 12), (17, 19)]):
        batch = grpo_batch(seed, answers=answers)
        positions = trained_positions(batch.loss_mask[:, 1:])
        shapes.add((batch.tokens.shape, positions.shape))
        trainer.train_step(batch)
    # Trained counts of 3 to 18 a row: K = 16 for the first three; 32, capped at the
    # rows' 31 positions, for the last.
    assert sorted(k for (_, (_, k)) in shapes) == [16, 31]
    assert trainer._update._cache_size() == len(shapes) == 2
