from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.algorithms.ppo import PpoConfig
from rl_core.models import Model, ModelConfig
from rl_core.pipeline.configs import trainer_config
from rl_core.spec import parse_spec
from rl_core.training import train_step as ts
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import (
    TrainBatch,
    Trainer,
    TrainerConfig,
    learning_rate_schedule,
)


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
    assert metrics["grad_norm"] > 0 and metrics["lr"] == pytest.approx(1e-2)
    assert metrics["learning_rate"] == metrics["lr"]
    assert {"loss", "pg_loss", "entropy", "kl", "importance_weight"} <= set(metrics)


def test_mini_batches_and_kl_to_the_initial_policy(tiny_model: Model) -> None:
    cfg = TrainerConfig(learning_rate=1e-2, mini_batches=2, grpo=GrpoConfig(kl_coef=0.1))
    trainer = Trainer(tiny_model, cfg)
    batch = random_batch(trainer, seed=1, advantages=[1.0, -1.0, 1.0, -1.0])
    first = trainer.train_step(batch)
    assert trainer.updates == 2
    second = trainer.train_step(batch)
    # The first mini-batch of all starts at the reference; by the second step it has moved.
    assert 0.0 <= first["kl"] < second["kl"]


def test_epochs_pass_over_the_batch_again_against_the_steps_starting_policy(
    tiny_model: Model,
) -> None:
    cfg = TrainerConfig(learning_rate=5e-2, epochs=3, grpo=GrpoConfig(clip_eps=0.05))
    trainer = Trainer(tiny_model, cfg)
    batch = random_batch(trainer, seed=2, advantages=[1.0, 1.0, -1.0, -1.0])
    before = trainer.logprobs(batch.tokens)
    metrics = trainer.train_step(batch)
    assert trainer.updates == 3
    # Later passes see ratios away from 1 (pi_old is the step's start), and clip them.
    assert metrics["clip_frac"] > 0 and metrics["ratio"] != pytest.approx(1.0)
    once = Trainer(tiny_model, dataclasses.replace(cfg, epochs=1))
    once.train_step(batch)
    moved = ((trainer.logprobs(batch.tokens) - before) * batch.loss_mask).sum(axis=1)
    moved_once = ((once.logprobs(batch.tokens) - before) * batch.loss_mask).sum(axis=1)
    assert moved[0] > moved_once[0] > 0 and moved[2] < moved_once[2] < 0


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(
    tiny_model: Model, aggregation: str
) -> None:
    trainer = Trainer(tiny_model, TrainerConfig(grpo=GrpoConfig(aggregation=aggregation)))  # type: ignore[arg-type]
    batch = random_batch(trainer, seed=3, advantages=[1.0, -0.5, 0.25, -1.0])
    # Ragged masks: micro-batches with different token counts must still add up exactly.
    mask = batch.loss_mask.copy()
    mask[1, 6:9] = 0
    mask[3, 6:] = 0
    batch = dataclasses.replace(batch, loss_mask=mask, logprobs=batch.logprobs * mask)
    mb = trainer._prepare(batch)
    results = []
    for micro in (1, 4):
        cfg = dataclasses.replace(trainer._cfg, micro_batches=micro)
        grads, metrics = jax.jit(
            lambda t, mb, cfg=cfg: ts.accumulated_grads(
                t, {}, trainer._rest, mb, graphdef=trainer._graphdef, cfg=cfg
            )
        )(trainer.trainable, mb)
        results.append((grads, metrics))
    (full, full_m), *parts = results
    assert float(optax.tree.norm(full)) > 0
    for grads, metrics in parts:
        for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(grads), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)  # float32 sums, reordered
        for name in ("loss", "pg_loss", "entropy", "mismatch_kl", "clip_frac"):
            assert float(metrics[name]) == pytest.approx(float(full_m[name]), rel=1e-5, abs=1e-8)
        # A max over the slices, not their sum (float32 noise only: the sampler agrees).
        assert float(metrics["mismatch_max"]) == pytest.approx(
            float(full_m["mismatch_max"]), abs=1e-5
        )


def test_train_step_with_micro_batches_reports_the_same_metrics(tiny_config: ModelConfig) -> None:
    def run(micro: int) -> dict[str, float]:
        trainer = Trainer(Model(tiny_config, rngs=nnx.Rngs(0)), TrainerConfig(micro_batches=micro))
        return trainer.train_step(random_batch(trainer, seed=4, advantages=[1.0, -1.0] * 2))

    one, two = run(1), run(2)
    for name in ("loss", "grad_norm", "entropy", "lr", "kl", "mismatch_kl"):
        assert two[name] == pytest.approx(one[name], rel=1e-5, abs=1e-6)
    assert two["mismatch_max"] == pytest.approx(one["mismatch_max"], abs=1e-5)


def test_uneven_split_is_refused(tiny_model: Model) -> None:
    trainer = Trainer(tiny_model, TrainerConfig(mini_batches=2, micro_batches=2))
    with pytest.raises(ValueError, match="micro-batches"):
        trainer.train_step(random_batch(trainer, seed=0, advantages=[1.0, 1.0, -1.0, 0, 0, 0]))


def test_lora_trains_the_adapters_and_leaves_the_base_frozen(tiny_model: Model) -> None:
    initial = jax.tree.map(np.asarray, nnx.state(tiny_model, nnx.Param))
    cfg = TrainerConfig(learning_rate=3e-2, lora=LoraConfig(rank=4, targets=("q", "v", "up")))
    trainer = Trainer(tiny_model, cfg)
    assert set(trainer.trainable["policy"]) == {
        f"blocks.{i}.{m}" for i in range(2) for m in ("attn.q", "attn.v", "mlp.up")
    }
    batch = random_batch(trainer, seed=5, advantages=[1.0, 1.0, -1.0, -1.0])
    before = trainer.logprobs(batch.tokens)
    metrics = trainer.train_step(batch)
    change = ((trainer.logprobs(batch.tokens) - before) * batch.loss_mask).sum(axis=1)
    assert change[0] > 0 and change[1] > 0 and change[2] < 0 and change[3] < 0
    assert metrics["kl"] == 0.0 and metrics["grad_norm"] > 0
    # The frozen base is bit-for-bit the initial weights; params() merges the adapters.
    for a, b in zip(
        jax.tree.leaves(initial), jax.tree.leaves(trainer._frozen["base"]), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    merged = trainer.params()
    for i in range(2):
        block, init_block = merged["blocks"][i], initial["blocks"][i]
        assert not np.array_equal(
            block["attn"]["q"]["kernel"][...], init_block["attn"]["q"]["kernel"][...]
        )
        np.testing.assert_array_equal(
            block["attn"]["k"]["kernel"][...], init_block["attn"]["k"]["kernel"][...]
        )
        np.testing.assert_array_equal(
            block["mlp"]["down"]["kernel"][...], init_block["mlp"]["down"]["kernel"][...]
        )
    # The merged model computes what the trainer trains.
    forward = trainer.policy_model()
    logits, _ = forward(
        jnp.asarray(batch.tokens[:, :-1]), jnp.arange(batch.tokens.shape[1] - 1)[None]
    )
    lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), batch.tokens[:, 1:, None], -1)
    np.testing.assert_allclose(lp[..., 0], trainer.logprobs(batch.tokens)[:, 1:], atol=1e-5)


def test_ppo_fits_its_value_head_and_follows_the_reward(tiny_model: Model) -> None:
    cfg = TrainerConfig(
        learning_rate=1e-2, mini_batches=2, ppo=PpoConfig(gamma=1.0, gae_lambda=0.95)
    )
    trainer = Trainer(tiny_model, cfg)
    batch = random_batch(trainer, seed=6, advantages=[0.0] * 4)
    batch = dataclasses.replace(batch, rewards=np.array([1.0, 1.0, 0.0, 0.0], np.float32))
    before = trainer.logprobs(batch.tokens)
    losses = [trainer.train_step(batch)["value_loss"] for _ in range(4)]
    assert losses[-1] < losses[0]
    change = ((trainer.logprobs(batch.tokens) - before) * batch.loss_mask).sum(axis=1)
    assert min(change[:2]) > max(change[2:])  # rewarded rows gained relative to the others
    without = dataclasses.replace(batch, rewards=None)
    with pytest.raises(ValueError, match="rewards"):
        trainer.train_step(without)


def test_config_from_spec_maps_every_algorithm_field() -> None:
    spec = parse_spec(
        {
            "environment": {"name": "guess_number"},
            "model": {"lora": {"rank": 4, "targets": ["q", "up"]}},
            "algorithm": {
                "name": "ppo",
                "mini_batches": 2,
                "micro_batches": 2,
                "warmup_steps": 3,
                "kl_coef": 0.1,
                "kl_estimator": "k2",
                "gae_lambda": 0.9,
            },
            "rollout": {"sampling": {"temperature": 0.0}},
            "train": {"steps": 10, "seed": 5},
        }
    )
    cfg = trainer_config(spec)
    assert (cfg.mini_batches, cfg.micro_batches, cfg.warmup_steps, cfg.total_steps) == (2, 2, 6, 20)
    assert cfg.temperature == 1.0 and cfg.seed == 5 and cfg.grpo.kl_estimator == "k2"
    assert cfg.ppo is not None and cfg.ppo.gae_lambda == 0.9
    assert cfg.lora == LoraConfig(rank=4, targets=("q", "up"))
