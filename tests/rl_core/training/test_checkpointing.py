"""Checkpoints: a resumed trainer continues bit-for-bit; half-written ones are never picked up."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.models import Model, ModelConfig
from rl_core.training.checkpointing import (
    CheckpointError,
    checkpoint_dir,
    latest_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

# Everything that carries state across steps: two shuffled mini-batches (RNG),
# a warm-up + cosine schedule (update count), a KL reference, AdamW moments.
CONFIG = TrainerConfig(
    learning_rate=3e-3,
    lr_schedule="cosine",
    warmup_steps=2,
    total_steps=8,
    mini_batches=2,
    weight_decay=0.01,
    grpo=GrpoConfig(kl_coef=0.05),
    seed=7,
)


def batch(step: int) -> TrainBatch:
    rng = np.random.default_rng(step)
    tokens = rng.integers(3, 100, size=(4, 10))
    mask = np.zeros(tokens.shape)
    mask[:, 5:] = 1
    behaviour = -rng.uniform(0.5, 3.0, size=tokens.shape) * mask
    return TrainBatch.pack(
        tokens.tolist(), mask.tolist(), behaviour.tolist(), [1.0, -1.0, 0.5, -0.5], rows=4
    )


def fresh(config: ModelConfig, trainer_config: TrainerConfig = CONFIG) -> Trainer:
    return Trainer(Model(config, rngs=nnx.Rngs(0)), trainer_config)


def assert_same_state(a: Trainer, b: Trainer) -> None:
    left, right = a.training_state(), b.training_state()
    assert jax.tree.structure(left) == jax.tree.structure(right)
    for x, y in zip(jax.tree.leaves(left), jax.tree.leaves(right), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_resumed_run_matches_an_uninterrupted_one_bit_for_bit(
    tmp_path: Path, tiny_config: ModelConfig
) -> None:
    straight = fresh(tiny_config)
    straight_metrics = [straight.train_step(batch(s)) for s in range(4)]

    first = fresh(tiny_config)
    for s in range(2):
        first.train_step(batch(s))
    record = save_checkpoint(
        checkpoint_dir(tmp_path, 2), step=2, trainer=first, extra={"collector": {"next": 9}}
    )
    assert record.step == 2 and record.size_bytes and Path(record.uri).is_dir()

    resumed = fresh(tiny_config)
    step, extra = restore_checkpoint(record.uri, trainer=resumed)
    assert (step, extra) == (2, {"collector": {"next": 9}})
    assert resumed.updates == 4
    resumed_metrics = [resumed.train_step(batch(s)) for s in range(2, 4)]

    assert_same_state(straight, resumed)
    assert resumed_metrics == straight_metrics[2:]
    for x, y in zip(
        jax.tree.leaves(straight.params()), jax.tree.leaves(resumed.params()), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_latest_checkpoint_skips_half_written_folders(
    tmp_path: Path, tiny_config: ModelConfig
) -> None:
    assert latest_checkpoint(tmp_path) is None
    trainer = fresh(tiny_config)
    save_checkpoint(checkpoint_dir(tmp_path, 3), step=3, trainer=trainer, extra={})
    root = tmp_path / "checkpoints"
    # A crash mid-write leaves a temporary folder; a folder without a marker is not done either.
    (root / ".tmp-step-00000007-deadbeef" / "state").mkdir(parents=True)
    (root / ".tmp-step-00000007-deadbeef" / "rlaas_checkpoint.json").write_text(
        json.dumps({"format": 1, "step": 7, "layout": {}})
    )
    (root / "step-00000005" / "state").mkdir(parents=True)
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.step == 3 and latest.uri.endswith("step-00000003")
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        restore_checkpoint(str(root / "step-00000005"), trainer=trainer)
    # The next save at step 7 clears the leftovers of the crashed attempt.
    save_checkpoint(checkpoint_dir(tmp_path, 7), step=7, trainer=trainer, extra={"a": 1})
    assert not list(root.glob(".tmp-*"))
    assert latest_checkpoint(tmp_path).step == 7  # type: ignore[union-attr]


def test_saving_the_same_step_again_replaces_it(tmp_path: Path, tiny_config: ModelConfig) -> None:
    trainer = fresh(tiny_config)
    save_checkpoint(checkpoint_dir(tmp_path, 1), step=1, trainer=trainer, extra={"v": 1})
    trainer.train_step(batch(0))
    record = save_checkpoint(checkpoint_dir(tmp_path, 1), step=1, trainer=trainer, extra={"v": 2})
    other = fresh(tiny_config)
    assert restore_checkpoint("file://" + record.uri, trainer=other) == (1, {"v": 2})
    assert_same_state(trainer, other)


def test_restore_into_a_different_trainer_names_what_differs(
    tmp_path: Path, tiny_config: ModelConfig
) -> None:
    record = save_checkpoint(
        checkpoint_dir(tmp_path, 1), step=1, trainer=fresh(tiny_config), extra={}
    )
    lora = dataclasses.replace(CONFIG, lora=LoraConfig(rank=2))
    with pytest.raises(CheckpointError, match=r"layout .*model\.lora"):
        restore_checkpoint(record.uri, trainer=fresh(tiny_config, lora))
    wider = dataclasses.replace(tiny_config, d_ff=256)
    with pytest.raises(CheckpointError, match=r"mlp\..*kernel"):
        restore_checkpoint(record.uri, trainer=fresh(wider))


def test_extra_must_be_json(tmp_path: Path, tiny_config: ModelConfig) -> None:
    with pytest.raises(CheckpointError, match="JSON"):
        save_checkpoint(
            checkpoint_dir(tmp_path, 1), step=1, trainer=fresh(tiny_config), extra={"x": object()}
        )
    assert not (tmp_path / "checkpoints" / "step-00000001").exists()


def test_lora_checkpoint_holds_only_the_adapters(tmp_path: Path, tiny_config: ModelConfig) -> None:
    cfg = dataclasses.replace(CONFIG, lora=LoraConfig(rank=2, targets=("q", "v")))
    trainer = fresh(tiny_config, cfg)
    trainer.train_step(batch(0))
    full = save_checkpoint(
        checkpoint_dir(tmp_path / "full", 1), step=1, trainer=fresh(tiny_config), extra={}
    )
    small = save_checkpoint(checkpoint_dir(tmp_path, 1), step=1, trainer=trainer, extra={})
    assert small.size_bytes is not None and full.size_bytes is not None
    assert small.size_bytes < full.size_bytes / 2
    resumed = fresh(tiny_config, cfg)
    restore_checkpoint(small.uri, trainer=resumed)
    assert_same_state(trainer, resumed)
