"""Two models trained in one batched program end where each trained alone ends.

Slot 0 and slot 2 of a `MultiLoraTrainer` (slot 1 idle) take the same calls as two
`LoraModel`s: two forward_backward calls accumulated per step (both slots' data in one
batch each time), then optim_step with each model's own Adam hyperparameters, for two
steps. Float32; tolerance 1e-5 on weights, logprobs and losses.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core.errors import UnsupportedSpec
from rl_core.models import ModelConfig
from rl_core.models.decoder import Model
from rl_core.training import tinker_layout
from rl_core.training.lora import LoraConfig
from rl_core.training.multi_trainer import MultiLoraTrainer, SlotCall
from rl_core.training.primitives import AdamParams, Datum, LoraModel, host_batch

LORA = LoraConfig(rank=4, alpha=4.0, targets=("q", "k", "v", "o"))  # LoraModel's default


def _datums(rng: np.random.Generator, vocab: int, n: int, lengths: tuple[int, int]) -> list[Datum]:
    out = []
    for _ in range(n):
        length = int(rng.integers(*lengths))
        tokens = rng.integers(0, vocab, length + 1).tolist()
        weights = rng.uniform(0.5, 1.0, length).tolist()
        out.append(Datum(tokens[:-1], {"target_tokens": tokens[1:], "weights": weights}))
    return out


def test_two_slots_batched_end_as_each_trained_alone(tiny_config: ModelConfig) -> None:
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    multi = MultiLoraTrainer(model, slots=3, lora=LORA)
    seeds = {0: 11, 2: 22}
    hyper = {0: AdamParams(learning_rate=1e-2), 2: AdamParams(learning_rate=3e-3, beta1=0.8)}
    alone = {s: LoraModel(model, rank=4, seed=seed, lora=LORA) for s, seed in seeds.items()}
    for s, seed in seeds.items():
        multi.reset(s, seed)
    rng = np.random.default_rng(0)
    for _ in range(2):
        for _ in range(2):  # two calls accumulate before each step
            # Slot 0: 3 rows of T 16, slot 2: 2 rows of T 32; one batch of 8 x 32, so the
            # padding of tokens and of rows is exercised (and few shapes compile).
            calls = [
                SlotCall(0, _datums(rng, tiny_config.vocab_size, 3, (4, 12))),
                SlotCall(2, _datums(rng, tiny_config.vocab_size, 2, (17, 24))),
            ]
            results = multi.forward_backward(calls, "cross_entropy")
            for call, got in zip(calls, results, strict=True):
                lps, loss = alone[call.slot].forward_backward(call.data, "cross_entropy")
                np.testing.assert_allclose(got.loss, loss, rtol=1e-5)
                for a, b in zip(got.logprobs, lps, strict=True):
                    np.testing.assert_allclose(a, b, atol=1e-5)
        for s in seeds:
            stats = multi.optim_step(s, hyper[s])
            expected = alone[s].optim_step(hyper[s])
            np.testing.assert_allclose(stats["grad_norm"], expected["grad_norm"], rtol=1e-5)
    for s in seeds:
        got, want = multi.adapter(s), alone[s].adapters
        assert sorted(got) == sorted(want)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)
        sampled = jax.tree.leaves(multi.sampler_weights(s))
        for g, w in zip(sampled, jax.tree.leaves(alone[s].sampler_weights()), strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)
        # Trained: B moved off zero.
        assert max(float(abs(np.asarray(ad["b"])).max()) for ad in got.values()) > 1e-4
    # The idle slot never moved and holds no gradient.
    for leaf in jax.tree.leaves(multi.adapter(1)):
        np.testing.assert_array_equal(leaf, np.zeros_like(leaf))
    for leaf in jax.tree.leaves(multi.grads):
        np.testing.assert_array_equal(leaf, np.zeros_like(leaf))
    with pytest.raises(UnsupportedSpec, match="slot 3"):
        multi.optim_step(3, AdamParams())
    # `add` hands out slots in order and doubles the slots when all are taken, keeping
    # every trained slot as it was.
    before = multi.adapter(2)
    multi.used = 3
    assert multi.add(seed=5) == 3 and multi.n_slots == 6 and multi.steps[2] == 2
    for g, w in zip(jax.tree.leaves(multi.adapter(2)), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(g, w)
    fresh = LoraModel(model, rank=4, seed=5, lora=LORA).adapters
    for g, w in zip(jax.tree.leaves(multi.adapter(3)), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(g, w)

    # An unloaded model's slot is zeroed and handed to the next model, fresh, before any
    # new slot; the others are untouched.
    multi.remove(2)
    assert all(not np.any(x) for x in jax.tree.leaves(multi.adapter(2)))
    assert multi.steps[2] == 0
    assert multi.add(seed=5) == 2 and multi.used == 4
    for g, w in zip(jax.tree.leaves(multi.adapter(2)), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(g, w)
    assert multi.add(seed=6) == 4


LOSS_CONFIGS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 1.05},
    "dro": {"beta": 0.3},
    "gspo": {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05},
}


def _policy_datums(rng: np.random.Generator, vocab: int, lengths: list[int]) -> list[Datum]:
    """Datums with every loss's inputs: a 2-token prompt (no advantage, outside gspo's
    ratio), sampler logprobs spread around the model's (ratios inside and outside the clip
    ranges), an advantage per datum of either sign."""
    out = []
    for n in lengths:
        tokens = rng.integers(0, vocab, n + 1).tolist()
        q = rng.normal(-np.log(vocab), 0.3, n)
        adv = np.full(n, rng.choice([-1.0, 0.5, 2.0]))
        q[:2], adv[:2] = 0.0, 0.0
        inputs = {
            "target_tokens": tokens[1:],
            "weights": rng.uniform(0.5, 1.0, n).tolist(),
            "logprobs": q.tolist(),
            "advantages": adv.tolist(),
            "sequence_ratio_mask": np.r_[np.zeros(2), np.ones(n - 2)].tolist(),
        }
        out.append(Datum(tokens[:-1], inputs))
    return out


@pytest.mark.parametrize("loss_fn", sorted(LOSS_CONFIGS))
def test_packed_rows_and_chunked_head_equal_the_padded_full_logits_path(
    tiny_config: ModelConfig, loss_fn: str
) -> None:
    """The serving defaults (each call's datums packed into rows, the output head in
    chunks) against one datum a row and every position's logits at once: the same
    logprobs, losses and accumulated gradients, for every built-in loss (gspo's sequence
    ratio is per datum, so a packed row's segments each keep their own)."""
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    ref = MultiLoraTrainer(model, slots=2, lora=LORA, pack=False, logits_chunk=None)
    cut = MultiLoraTrainer(model, slots=2, lora=LORA)
    assert cut.pack and cut.logits_chunk is not None
    cut.logits_chunk = 8  # many chunks, the last one padded (8 does not divide the rows)
    rng = np.random.default_rng(3)
    vocab = tiny_config.vocab_size
    # One update of both first, so B is off zero and every factor has a gradient.
    warm = [SlotCall(s, _policy_datums(rng, vocab, [9, 14])) for s in (0, 1)]
    for trainer in (ref, cut):
        trainer.reset(0, 1)
        trainer.reset(1, 2)
        trainer.forward_backward(warm, "cross_entropy")
        for s in (0, 1):
            trainer.optim_step(s, AdamParams(learning_rate=5e-2))
    calls = [
        SlotCall(0, _policy_datums(rng, vocab, [3, 20, 7, 11, 5]), LOSS_CONFIGS[loss_fn]),
        SlotCall(1, _policy_datums(rng, vocab, [17, 6]), LOSS_CONFIGS[loss_fn]),
    ]
    # Packed, the 7 datums fill 3 rows of 32 (20+11, 7+5+3; 17+6), where plain pads them
    # to 8 rows.
    hosts = [host_batch(c.data, loss_fn, tiny_config.max_seq_len, c.config) for c in calls]
    layout = tinker_layout.packed(hosts, [c.slot for c in calls])
    assert layout.rows == [[0, 1], [2]] and layout.batch["tokens"].shape == (3, 32)
    assert tinker_layout.plain(hosts, [0, 1]).batch["tokens"].shape == (8, 32)

    want = ref.forward_backward(calls, loss_fn)
    got = cut.forward_backward(calls, loss_fn)
    for g, w, call in zip(got, want, calls, strict=True):
        np.testing.assert_allclose(g.loss, w.loss, rtol=1e-5, atol=1e-6)
        assert [len(x) for x in g.logprobs] == [len(d.tokens) for d in call.data]
        for a, b in zip(g.logprobs, w.logprobs, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)
    flat_g, flat_w = jax.tree.leaves(cut.grads), jax.tree.leaves(ref.grads)
    scale = max(float(np.abs(w).max()) for w in flat_w)
    assert scale > 1e-4  # the step had a gradient to compare
    for g, w in zip(flat_g, flat_w, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5 * scale, rtol=1e-4)
    # forward_only reads the same layout and changes no accumulator.
    before = [np.asarray(x) for x in jax.tree.leaves(cut.grads)]
    again = cut.forward_backward(calls, loss_fn, forward_only=True)
    for a, b in zip(again[0].logprobs, want[0].logprobs, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for x, y in zip(jax.tree.leaves(cut.grads), before, strict=True):
        np.testing.assert_array_equal(x, y)
