"""Tinker's policy losses (ppo, cispo, dro, gspo, and importance_sampling) against a plain
numpy reference written from the documented formulas (Tinker's loss docs; docs/tinker.md).

Each datum's reported loss equals the reference's sum, and the trainer's gradient is the
reference's dL/dlogp pushed through the model: the same gradient as a ``cross_entropy``
pass with ``weights = -dL/dlogp`` (a loss is a function of the target logprobs only). Where
there is no stop-gradient (ppo, dro, importance_sampling) the gradient also matches a
finite difference of the loss along a random direction of the adapter. Float32 on tiny.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.errors import UnsupportedSpec
from rl_core.models import ModelConfig
from rl_core.models.decoder import Model
from rl_core.protocol.tinker_losses import resolve_config
from rl_core.training.lora import LoraConfig
from rl_core.training.primitives import Datum, LoraModel
from tests.rl_core.training.tinker_reference import reference

LORA = LoraConfig(rank=4, alpha=4.0, targets=("q", "k", "v", "o"))
CONFIGS: dict[str, dict[str, float]] = {
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 1.05},
    "dro": {"beta": 0.3},
    "gspo": {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05},
}


def _data(rng: np.random.Generator, lps: list[list[float]], batch: list[Datum]) -> list[Datum]:
    """The same tokens with sampler logprobs near the trainer's (ratios spread across the
    clip bounds), advantages of both signs, and a prompt part where they are 0."""
    out = []
    # Per datum, the sampler is a little off in one direction: gspo's sequence ratios land
    # inside, below and above its clip range.
    for d, lp, shift in zip(batch, lps, (0.0, 0.1, -0.1), strict=True):
        n, head = len(d.tokens), 2
        q = np.asarray(lp) + shift + rng.normal(0.0, 0.1, n)
        q[:head] = 0.0  # the prompt: no sampler logprob, no advantage, outside the ratio
        adv = np.full(n, rng.choice([-1.0, 0.5, 2.0]))
        adv[:head] = 0.0
        ratio_mask = np.r_[np.zeros(head), np.ones(n - head)]
        inputs = {
            "target_tokens": list(d.inputs["target_tokens"]),
            "logprobs": q.tolist(),
            "advantages": adv.tolist(),
            "sequence_ratio_mask": ratio_mask.tolist(),
        }
        out.append(Datum(d.tokens, inputs))
    return out


def _grads(model: LoraModel) -> list[np.ndarray]:
    return [np.asarray(g, np.float64) for g in jax.tree.leaves(model.grads)]


@pytest.mark.parametrize("loss_fn", sorted(CONFIGS))
def test_loss_and_gradient_match_the_documented_formula(
    tiny_config: ModelConfig, loss_fn: str
) -> None:
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    # A trained-looking adapter (B off zero) so every factor has a gradient.
    trained = LoraModel(model, rank=4, seed=3, lora=LORA)
    trained.adapters = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.key(7), x.shape, x.dtype),
        trained.adapters,
    )
    plain = []
    for length in (7, 12, 5):
        tokens = rng.integers(1, tiny_config.vocab_size, length + 1).tolist()
        plain.append(Datum(tokens[:-1], {"target_tokens": tokens[1:], "weights": [0.0] * length}))
    lps, _ = trained.forward_backward(plain, "cross_entropy", forward_only=True)
    data = _data(rng, lps, plain)
    cfg = CONFIGS[loss_fn]

    got_lps, got_loss = trained.forward_backward(data, loss_fn, config=cfg)
    refs = [
        reference(loss_fn, np.asarray(lp), d.inputs, cfg)
        for lp, d in zip(got_lps, data, strict=True)
    ]
    np.testing.assert_allclose(got_loss, sum(r[0] for r in refs), rtol=1e-5, atol=1e-5)
    if loss_fn in ("ppo", "gspo"):  # the data reach both sides of the clip range
        log_r = [np.asarray(lp) - d.inputs["logprobs"] for lp, d in zip(got_lps, data, strict=True)]
        if loss_fn == "gspo":
            log_r = [np.array([x[2:].mean()]) for x in log_r]  # the sequence ratio
        ratios = np.exp(np.concatenate(log_r))
        assert (ratios < cfg["clip_low_threshold"]).any()
        assert (ratios > cfg["clip_high_threshold"]).any()

    # The same gradient as cross_entropy with weights -dL/dlp, on a twin model.
    twin = LoraModel(model, rank=4, seed=3, lora=LORA)
    twin.adapters = trained.adapters
    linear = [
        Datum(d.tokens, {"target_tokens": d.inputs["target_tokens"], "weights": (-g).tolist()})
        for d, (_, g) in zip(data, refs, strict=True)
    ]
    twin.forward_backward(linear, "cross_entropy")
    for g, want in zip(_grads(trained), _grads(twin), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6)
    assert max(float(np.abs(g).max()) for g in _grads(trained)) > 1e-4  # not all zero

    if loss_fn in ("ppo", "dro", "importance_sampling"):  # no stop-gradient: L's own slope
        direction = jax.tree.map(
            lambda x: jax.random.normal(jax.random.key(9), x.shape, jnp.float32), trained.adapters
        )

        def loss_at(step: float) -> float:
            probe = LoraModel(model, rank=4, seed=3, lora=LORA)
            probe.adapters = jax.tree.map(lambda w, v: w + step * v, trained.adapters, direction)
            return probe.forward_backward(data, loss_fn, forward_only=True, config=cfg)[1]

        def central(eps: float) -> float:
            return (loss_at(eps) - loss_at(-eps)) / (2 * eps)

        # The losses are float32 sums near 100 (dro), resolved to ~8e-6: a step of 1e-3
        # left the difference within float32's noise (the slope moved by 3 % between two
        # CPUs). Larger steps, with Richardson's extrapolation cancelling their eps^2 error.
        eps = 8e-3
        slope = (4 * central(eps / 2) - central(eps)) / 3
        analytic = sum(
            float(np.sum(g * np.asarray(v, np.float64)))
            for g, v in zip(_grads(trained), jax.tree.leaves(direction), strict=True)
        )
        np.testing.assert_allclose(slope, analytic, rtol=2e-2, atol=2e-3)


def test_defaults_and_refusals_name_the_key() -> None:
    assert resolve_config("ppo", None) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert resolve_config("cispo", {}) == {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
    assert resolve_config("cispo", {"clip_high_threshold": 5}) == {
        "clip_low_threshold": 0.0,
        "clip_high_threshold": 5.0,
    }
    cases = [
        ("dro", None, "loss_fn_config.beta", "no default"),
        ("gspo", {"clip_low_threshold": 0.9}, "loss_fn_config.clip_high_threshold", "no default"),
        ("ppo", {"beta": 1.0}, "loss_fn_config.beta", "reads clip_low_threshold"),
        ("ppo", {"clip_low_threshold": "0.8"}, "loss_fn_config.clip_low_threshold", "number"),
        ("ppo", {"clip_low_threshold": 1.3}, "loss_fn_config.clip_low_threshold", "exceed"),
        ("cross_entropy", {"beta": 1.0}, "loss_fn_config.beta", "no loss_fn_config"),
        ("stable_reinforce", None, "loss_fn", "does not document"),
        ("custom", {"loss_id": "x"}, "loss_fn", "forward_backward_custom"),
        ("grpo", None, "loss_fn", "not served"),
    ]
    for loss_fn, cfg, field, words in cases:
        with pytest.raises(UnsupportedSpec, match=words) as refused:
            resolve_config(loss_fn, cfg)
        assert refused.value.field == field


def test_gspo_needs_a_marked_token(tiny_config: ModelConfig) -> None:
    trainer = LoraModel(Model(tiny_config, rngs=nnx.Rngs(0)), rank=4, seed=0, lora=LORA)
    datum = Datum(
        [1, 2, 3],
        {
            "target_tokens": [2, 3, 4],
            "logprobs": [0.0] * 3,
            "advantages": [1.0] * 3,
            "sequence_ratio_mask": [0.0] * 3,
        },
    )
    cfg = CONFIGS["gspo"]
    with pytest.raises(UnsupportedSpec, match="marks no token") as refused:
        trainer.forward_backward([datum], "gspo", config=cfg)
    assert refused.value.field == "data[0].loss_fn_inputs.sequence_ratio_mask"
