"""The trainer's chunked output head computes the full path's logprobs, entropy and gradients.

Chunks of 7 positions over batches of 3 x 11 = 33 positions: the last chunk is padded,
so padding that leaked into a result would show. Tolerances are float32 reordering: the
chunked path runs the same `token_logprobs` on each chunk, but XLA may fuse and order the
head's matmul and the reductions differently (measured: logprob and entropy differ by
at most 2e-6 nats on this model). Gradients are held to the bound the trainer's
micro-batch test uses for float32 sums taken in another order (rtol 1e-4, atol 1e-6).
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
from rl_core.training import train_step as ts
from rl_core.training.chunked_logits import chunked_token_logprobs
from rl_core.training.lora import LoraConfig
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

CHUNK = 7  # does not divide 3 rows x 11 positions
LP_ATOL = 1e-5  # nats, on logprobs of about -5 and entropies of about 5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6


def one_layer(tiny_config: ModelConfig, *, tied: bool) -> Model:
    # One block: the head is what differs between the paths, and compiles stay short.
    config = dataclasses.replace(tiny_config, n_layers=1, tie_embeddings=tied)
    return Model(config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "lm_head"])
def model(request: pytest.FixtureRequest, tiny_config: ModelConfig) -> Model:
    return one_layer(tiny_config, tied=request.param)


@pytest.fixture(scope="module")
def tied(tiny_config: ModelConfig) -> Model:
    return one_layer(tiny_config, tied=True)


def batch_of(rows: int, *, seed: int) -> TrainBatch:
    """Random 12-token rows, the last 6 trained on; behaviour logprobs made up (off-policy)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 100, size=(rows, 12)).astype(np.int32)
    mask = np.zeros((rows, 12), np.float32)
    mask[:, 6:] = 1
    behaviour = (-rng.uniform(3.0, 6.0, size=(rows, 12)) * mask).astype(np.float32)
    advantages = rng.normal(size=(rows,)).astype(np.float32)
    rewards = rng.uniform(size=(rows,)).astype(np.float32)
    return TrainBatch(tokens, mask, behaviour, advantages, rewards=rewards)


def test_logprobs_entropy_and_hidden_match_the_full_logits(model: Model) -> None:
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jnp.asarray(batch_of(3, seed=0).tokens)
    full = ts.forward(graphdef, params, rest, tokens, 0.7, with_hidden=True)
    chunked = ts.forward(graphdef, params, rest, tokens, 0.7, with_hidden=True, logits_chunk=CHUNK)
    assert full[0].shape == chunked[0].shape == (3, 11)
    np.testing.assert_allclose(chunked[0], full[0], atol=LP_ATOL)  # log pi(target)
    np.testing.assert_allclose(chunked[1], full[1], atol=LP_ATOL)  # entropy
    np.testing.assert_array_equal(chunked[2], full[2])  # the same trunk, untouched


def test_a_chunk_larger_than_the_batch_and_a_bad_chunk() -> None:
    h = jax.random.normal(jax.random.key(0), (2, 3, 4))
    w = jax.random.normal(jax.random.key(1), (4, 10))
    targets = jnp.arange(6).reshape(2, 3)
    lp, ent = chunked_token_logprobs(h, targets, lambda x: x @ w, 1.0, 512)
    logp = jax.nn.log_softmax(h @ w)
    np.testing.assert_allclose(lp, jnp.take_along_axis(logp, targets[..., None], -1)[..., 0], 1e-6)
    np.testing.assert_allclose(ent, -(jnp.exp(logp) * logp).sum(-1), rtol=1e-6)
    with pytest.raises(ValueError, match="chunk"):
        chunked_token_logprobs(h, targets, lambda x: x @ w, 1.0, 0)
    with pytest.raises(ValueError, match="logits_chunk"):
        TrainerConfig(logits_chunk=0)


def test_micro_loss_gradients_match_the_full_logits(model: Model) -> None:
    micro_loss_gradients_match(model, lora=None)  # the head's own gradient, tied or not


def test_lora_gradients_match_the_full_logits(tied: Model) -> None:
    micro_loss_gradients_match(tied, lora=LoraConfig(rank=4))  # through h only


def micro_loss_gradients_match(model: Model, lora: LoraConfig | None) -> None:
    # An entropy bonus and a KL term: every term of the loss has a gradient through the head.
    grpo = GrpoConfig(entropy_coef=0.05, kl_coef=0.1)
    trainer = Trainer(model, TrainerConfig(lora=lora, grpo=grpo, temperature=0.7))
    if lora is not None:  # B = 0 at init leaves A without gradient: move off it
        trainer.trainable = jax.tree.map(lambda x: x + 0.05, trainer.trainable)
    mb = trainer._prepare(batch_of(3, seed=1))
    counts = Counts.of(mb.mask)
    grads = {}
    for chunk in (None, CHUNK):
        cfg = dataclasses.replace(trainer._cfg, logits_chunk=chunk)

        def loss(t: ts.Trainable, cfg: ts.StepConfig = cfg) -> jax.Array:
            args = (trainer._frozen, trainer._rest, mb, counts)
            return ts.micro_loss(t, *args, graphdef=trainer._graphdef, cfg=cfg)[0]

        grads[chunk] = jax.jit(jax.grad(loss))(trainer.trainable)
    full, chunked = grads[None], grads[CHUNK]
    if lora is None:  # the head's own gradient: the embedding (tied) or lm_head's kernel
        head = full["policy"]["embed" if model.lm_head is None else "lm_head"]
        assert float(jnp.abs(jax.tree.leaves(head)[0]).max()) > 0
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(chunked), strict=True):
        assert float(jnp.abs(a).max()) > 0
        np.testing.assert_allclose(b, a, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_a_train_step_is_the_same_with_chunks(tied: Model) -> None:
    # PPO with two mini-batches: pi_old and V_old are scored (the no-gradient path) before
    # the updates, and the loss is GRPO's clipped surrogate plus the value head's.
    base = TrainerConfig(
        learning_rate=1e-2,
        mini_batches=2,
        temperature=0.7,
        grpo=GrpoConfig(entropy_coef=0.01),
        ppo=PpoConfig(),
    )
    batch = batch_of(4, seed=2)
    results = []
    for chunk in (None, CHUNK):
        trainer = Trainer(tied, dataclasses.replace(base, logits_chunk=chunk))
        start = trainer.trainable
        metrics = trainer.train_step(batch)
        results.append((metrics, jax.tree.map(jnp.subtract, trainer.trainable, start)))
    (full_m, full_step), (chunk_m, chunk_step) = results
    assert set(full_m) == set(chunk_m)
    for name, value in full_m.items():
        assert chunk_m[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    # The weights' change, leaf by leaf. Not element by element: Adam divides each gradient
    # by its own size, so a 1e-7 relative difference in a near-zero gradient element moves
    # that element's update by up to 1% of the learning rate (measured, one element in
    # 12,288); over a leaf the difference is at most 8e-5 of the step (measured).
    for a, b in zip(jax.tree.leaves(full_step), jax.tree.leaves(chunk_step), strict=True):
        assert float(jnp.linalg.norm(a)) > 0
        assert float(jnp.linalg.norm(b - a)) <= 1e-3 * float(jnp.linalg.norm(a))
