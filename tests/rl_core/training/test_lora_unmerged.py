"""LoRA applied beside the frozen kernels trains exactly as LoRA merged into them.

The two paths are one function of the adapters; they differ in float32 rounding (the
merged path adds ``scale * A @ B`` to W before the matmul). Tolerances are those of the
chunked head's test (rtol 1e-4, atol 1e-6 on gradients). The adapters are moved off
their init (B = 0) first, so A has a gradient and the deltas are not zero. What the
unmerged path saves is work, measured by bench/p1_chunked_logits.py ``--lora-apply``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.algorithms.grpo import Counts, GrpoConfig
from rl_core.models import Model, ModelConfig
from rl_core.training import train_step as ts
from rl_core.training.lora import LoraConfig
from rl_core.training.lora_unmerged import lora_model
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

LORA = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6


@pytest.fixture(scope="module")
def model(tiny_config: ModelConfig) -> Model:
    return Model(dataclasses.replace(tiny_config, n_layers=2), rngs=nnx.Rngs(0))


def batch_of(rows: int, *, seed: int) -> TrainBatch:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 100, size=(rows, 12)).astype(np.int32)
    mask = np.zeros((rows, 12), np.float32)
    mask[:, 6:] = 1
    behaviour = (-rng.uniform(3.0, 6.0, size=(rows, 12)) * mask).astype(np.float32)
    advantages = rng.normal(size=(rows,)).astype(np.float32)
    return TrainBatch(tokens, mask, behaviour, advantages)


def moved(trainer: Trainer) -> Trainer:
    key = jax.random.key(1)
    leaves, tree = jax.tree.flatten(trainer.trainable)
    keys = jax.random.split(key, len(leaves))
    trainer.trainable = jax.tree.unflatten(
        tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    return trainer


def test_the_unmerged_model_computes_the_merged_one(model: Model) -> None:
    trainer = moved(Trainer(model, TrainerConfig(lora=LORA)))
    adapters = trainer.trainable["policy"]
    tokens = jnp.asarray(batch_of(3, seed=0).tokens)
    positions = jnp.broadcast_to(jnp.arange(12), tokens.shape)
    policy = trainer._merged(trainer.trainable, trainer._frozen)
    merged = nnx.merge(trainer._graphdef, policy, trainer._rest)
    beside = lora_model(trainer._graphdef, trainer._frozen["base"], trainer._rest, adapters, LORA)
    want = merged(tokens, positions)[0]
    got = beside(tokens, positions)[0]
    base = nnx.merge(trainer._graphdef, trainer._frozen["base"], trainer._rest)(tokens, positions)[
        0
    ]
    assert float(jnp.abs(want - base).max()) > 1e-2  # the adapters change the logits
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_equal_the_merged_paths(model: Model) -> None:
    grpo = GrpoConfig(entropy_coef=0.05, kl_coef=0.1)
    trainer = moved(Trainer(model, TrainerConfig(lora=LORA, grpo=grpo, temperature=0.7)))
    mb = trainer._prepare(batch_of(4, seed=1))
    counts = Counts.of(mb.mask)
    grads = {}
    for apply in ("merged", "unmerged"):
        cfg = dataclasses.replace(trainer._cfg, lora_apply=apply)

        def loss(t: ts.Trainable, cfg: ts.StepConfig = cfg) -> jax.Array:
            args = (trainer._frozen, trainer._rest, mb, counts)
            return ts.micro_loss(t, *args, graphdef=trainer._graphdef, cfg=cfg)[0]

        grads[apply] = jax.jit(jax.grad(loss))(trainer.trainable)
    merged, beside = jax.tree.leaves(grads["merged"]), jax.tree.leaves(grads["unmerged"])
    for a, b in zip(merged, beside, strict=True):
        assert float(jnp.abs(a).max()) > 0
        np.testing.assert_allclose(b, a, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_a_train_step_is_the_same_unmerged(model: Model) -> None:
    config = TrainerConfig(lora=LORA, learning_rate=1e-2, mini_batches=2, micro_batches=2)
    batch = batch_of(4, seed=2)
    results = []
    for apply in ("merged", "unmerged"):
        trainer = moved(Trainer(model, dataclasses.replace(config, lora_apply=apply)))
        start = trainer.trainable
        metrics = trainer.train_step(batch)
        results.append((metrics, jax.tree.map(jnp.subtract, trainer.trainable, start)))
    (merged_m, merged_step), (beside_m, beside_step) = results
    assert set(merged_m) == set(beside_m)
    for name, value in merged_m.items():
        assert beside_m[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    # Leaf by leaf, as the chunked head's test does (Adam scales each element alone).
    for a, b in zip(jax.tree.leaves(merged_step), jax.tree.leaves(beside_step), strict=True):
        assert float(jnp.linalg.norm(a)) > 0
        assert float(jnp.linalg.norm(b - a)) <= 1e-3 * float(jnp.linalg.norm(a))
