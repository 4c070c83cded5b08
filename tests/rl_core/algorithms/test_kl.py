"""The KL estimators: signs, zeros, and unbiasedness checked against the exact KL."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.algorithms.kl import kl_penalty, sampled_kl


def exact_kl(p: jax.Array, q: jax.Array) -> float:
    return float((p * (jnp.log(p) - jnp.log(q))).sum())


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_zero_when_the_policies_agree(estimator: str) -> None:
    lp = -jax.random.uniform(jax.random.key(0), (4, 7)) * 5
    np.testing.assert_array_equal(kl_penalty(lp, lp, estimator), 0.0)  # type: ignore[arg-type]
    grad = jax.grad(lambda x: kl_penalty(x, lp, estimator).sum())(lp)  # type: ignore[arg-type]
    # k2 and k3 have a minimum there; k1 = log pi - log ref is linear, with slope 1.
    np.testing.assert_allclose(grad, 1.0 if estimator == "k1" else 0.0, atol=1e-6)


def test_k2_and_k3_are_never_negative() -> None:
    a, b = jax.random.split(jax.random.key(1))
    lp, ref = -jax.random.uniform(a, (1000,)) * 8, -jax.random.uniform(b, (1000,)) * 8
    assert float(kl_penalty(lp, ref, "k2").min()) >= 0.0
    assert float(kl_penalty(lp, ref, "k3").min()) >= 0.0
    assert float(kl_penalty(lp, ref, "k1").min()) < 0.0  # k1 alone can go negative


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_unbiased_estimators_average_to_the_exact_kl(estimator: str) -> None:
    # E_{a ~ pi}[k(a)] summed exactly over the vocabulary: no sampling noise.
    pi = jax.nn.softmax(jax.random.normal(jax.random.key(2), (11,)))
    ref = jax.nn.softmax(jax.random.normal(jax.random.key(3), (11,)))
    per_token = kl_penalty(jnp.log(pi), jnp.log(ref), estimator)  # type: ignore[arg-type]
    assert float((pi * per_token).sum()) == pytest.approx(exact_kl(pi, ref), rel=1e-5)


def test_k2_is_biased_but_close_for_close_policies() -> None:
    pi = jax.nn.softmax(jax.random.normal(jax.random.key(4), (11,)))
    ref = jax.nn.softmax(jnp.log(pi) + 0.01 * jax.random.normal(jax.random.key(5), (11,)))
    k2 = float((pi * kl_penalty(jnp.log(pi), jnp.log(ref), "k2")).sum())
    assert k2 == pytest.approx(exact_kl(pi, ref), rel=0.05)


def test_sampled_kl_is_kl_of_the_sampler_to_the_target() -> None:
    mu = jax.nn.softmax(jax.random.normal(jax.random.key(6), (9,)))  # the sampler
    pi = jax.nn.softmax(jax.random.normal(jax.random.key(7), (9,)))  # the trainer
    estimate = float((mu * sampled_kl(jnp.log(pi), jnp.log(mu))).sum())
    assert estimate == pytest.approx(exact_kl(mu, pi), rel=1e-5)


def test_unknown_estimator_names_the_choices() -> None:
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(jnp.zeros(2), jnp.zeros(2), "k4")  # type: ignore[arg-type]
