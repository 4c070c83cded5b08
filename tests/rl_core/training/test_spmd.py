"""A trainer over K = 2 real processes (jax.distributed, gloo) against the same trainer in
one process: the same global batches give the same weights and losses.

Tolerance: the two programs differ only in where the batch's gradient sum is reduced
(within one device, or partial sums on each process added over gloo), so each weight
differs by float32 rounding of reordered sums, amplified a little by Adam's division by
the root of the second moment (near 0 on a first step). 2e-5 absolute on weights of
order 0.1 after 4 updates at lr 1e-3 is ~1000x the float32 epsilon scale of one sum and
~50x smaller than one update (1e-3), so a lost or doubled row's gradient would fail it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from flax import nnx

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.models import Model, ModelConfig
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.training.local_hosts import LocalHosts
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig
from rl_core.training.trainer_group import TrainerGroup

CONFIG = TrainerConfig(
    learning_rate=1e-3, mini_batches=2, grpo=GrpoConfig(kl_coef=0.05), logits_chunk=None
)
ROWS, STEPS, WEIGHT_TOL = 8, 2, 2e-5


def tiny_model() -> Model:
    return Model(ModelConfig.tiny(vocab_size=BuiltinTokenizer().vocab_size), rngs=nnx.Rngs(0))


def make_trainer(config: TrainerConfig, mesh: Any) -> Trainer:
    """What each trainer process builds: the same initial model, replicated on the mesh."""
    from rl_core.training.spmd import replicated

    model = tiny_model()
    nnx.update(model, replicated(nnx.state(model), mesh))
    return Trainer(model, config)


def batches(trainer: Trainer) -> list[TrainBatch]:
    """Random sequences whose last half is trained, behaviour logprobs of the first policy."""
    out = []
    for seed in range(STEPS):
        rng = np.random.default_rng(seed)
        seqs = rng.integers(3, 100, size=(ROWS, 12))
        mask = np.zeros(seqs.shape)
        mask[:, 6:] = 1
        adv = rng.normal(size=ROWS).round(2).tolist()
        blank = TrainBatch.pack(seqs.tolist(), mask.tolist(), mask.tolist(), adv, rows=ROWS)
        lp = (trainer.logprobs(blank.tokens) * blank.loss_mask).astype(np.float32)
        out.append(TrainBatch(blank.tokens, blank.loss_mask, lp, blank.advantages))
    return out


def test_two_processes_train_the_weights_one_process_does() -> None:
    single = Trainer(tiny_model(), CONFIG)
    steps = batches(single)
    want = [single.train_step(b) for b in steps]
    want_params = jax.tree.leaves(single.params())

    group = TrainerGroup(LocalHosts(2, functools.partial(make_trainer, CONFIG)), CONFIG)
    try:
        got = [group.train_step(b) for b in steps]
        got_params = jax.tree.leaves(group.params())
        state = group.training_state()
    finally:
        group.close()

    for w, g in zip(want, got, strict=True):
        assert abs(w["loss"] - g["loss"]) < 1e-5, (w["loss"], g["loss"])
        assert g["optimizer_updates"] == w["optimizer_updates"]
    assert len(got_params) == len(want_params)
    moved = 0.0
    initial = jax.tree.leaves(nnx.state(tiny_model()))
    for w, g, first in zip(want_params, got_params, initial, strict=True):
        assert isinstance(g, np.ndarray) and g.shape == w.shape
        np.testing.assert_allclose(g, np.asarray(w), atol=WEIGHT_TOL, rtol=0)
        moved = max(moved, float(np.abs(np.asarray(w) - np.asarray(first)).max()))
    assert moved > 50 * WEIGHT_TOL  # the steps did move the weights well past the tolerance
    assert int(state["updates"]) == STEPS * CONFIG.mini_batches
