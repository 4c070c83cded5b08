from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.models import Model
from rl_core.trainer import TrainBatch, Trainer, TrainerConfig, learning_rate_schedule


def test_pack_pads_to_fixed_rows_and_a_power_of_two() -> None:
    batch = TrainBatch.pack(
        [[5, 6, 7], [8] * 40],
        [[0, 1, 1], [1] * 40],
        [[0, -1, -2], [-1] * 40],
        [1.0, -1.0],
        rows=4,
        min_length=32,
    )
    assert batch.tokens.shape == (4, 64) and batch.loss_mask.shape == (4, 64)
    assert batch.loss_mask[2:].sum() == 0 and batch.advantages.tolist() == [1.0, -1.0, 0.0, 0.0]
    assert batch.tokens[0, :3].tolist() == [5, 6, 7] and batch.tokens[0, 3:].sum() == 0


def test_schedule_warmup_then_cosine() -> None:
    cfg = TrainerConfig(learning_rate=1.0, warmup_steps=4, total_steps=14, lr_schedule="cosine")
    lr = learning_rate_schedule(cfg)
    assert [float(lr(s)) for s in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert float(lr(4)) == pytest.approx(1.0)
    assert float(lr(14)) == pytest.approx(0.1)
    const = learning_rate_schedule(TrainerConfig(learning_rate=0.5))
    assert float(const(0)) == float(const(1000)) == 0.5


def random_batch(trainer: Trainer, *, seed: int, advantages: list[float]) -> TrainBatch:
    """Random 12-token sequences whose last 6 tokens are the model's, sampled on-policy."""
    seqs = np.random.default_rng(seed).integers(3, 100, size=(len(advantages), 12))
    mask = np.zeros(seqs.shape)
    mask[:, 6:] = 1
    rows = len(advantages)
    blank = TrainBatch.pack(seqs.tolist(), mask.tolist(), mask.tolist(), advantages, rows=rows)
    behaviour = trainer.logprobs(blank.tokens) * blank.loss_mask  # the sampler agrees
    return dataclasses.replace(blank, logprobs=behaviour.astype(np.float32))


def test_a_step_raises_the_logprob_of_rewarded_tokens(tiny_model: Model) -> None:
    trainer = Trainer(tiny_model, TrainerConfig(learning_rate=1e-2, temperature=1.0))
    batch = random_batch(trainer, seed=0, advantages=[1.0, 1.0, -1.0, -1.0])
    before = trainer.logprobs(batch.tokens)
    metrics = trainer.train_step(batch)
    after = trainer.logprobs(batch.tokens)
    change = ((after - before) * batch.loss_mask).sum(axis=1)
    assert change[0] > 0 and change[1] > 0 and change[2] < 0 and change[3] < 0
    assert metrics["mismatch_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["clip_frac"] == 0.0  # a single update starts at ratio 1
    assert metrics["grad_norm"] > 0 and metrics["learning_rate"] == pytest.approx(1e-2)
    assert {"loss", "entropy", "kl", "importance_weight"} <= set(metrics)


def test_mini_batches_and_kl_to_the_initial_policy(tiny_model: Model) -> None:
    cfg = TrainerConfig(learning_rate=1e-2, mini_batches=2, grpo=GrpoConfig(kl_coef=0.1))
    trainer = Trainer(tiny_model, cfg)
    batch = random_batch(trainer, seed=1, advantages=[1.0, -1.0, 1.0, -1.0])
    first = trainer.train_step(batch)
    assert trainer.updates == 2
    second = trainer.train_step(batch)
    # The first mini-batch of all starts at the reference; by the second step it has moved.
    assert 0.0 <= first["kl"] < second["kl"]
