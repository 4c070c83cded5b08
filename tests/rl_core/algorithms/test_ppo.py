"""GAE and the clipped value loss, checked against a plain-Python reference and by property."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.algorithms.ppo import gae, last_token_rewards, value_loss, whiten


def reference_gae(
    rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float, lam: float
) -> np.ndarray:
    """Textbook GAE over each row's action tokens only (observation tokens removed)."""
    out = np.zeros_like(rewards)
    for row in range(rewards.shape[0]):
        steps = np.flatnonzero(mask[row])
        next_value = next_adv = 0.0
        for t in steps[::-1]:
            delta = rewards[row, t] + gamma * next_value - values[row, t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[row, t]
            out[row, t] = next_adv
    return out


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_the_reference_and_skips_observation_tokens(gamma: float, lam: float) -> None:
    rng = np.random.default_rng(0)
    mask = (rng.uniform(size=(5, 12)) > 0.4).astype(np.float32)
    mask[4] = 0  # a padding row
    rewards = rng.normal(size=(5, 12)).astype(np.float32) * mask
    values = rng.normal(size=(5, 12)).astype(np.float32)
    adv, ret = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam)
    expected = reference_gae(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, (expected + values) * mask, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(adv[4]).sum()) == 0.0


def test_monte_carlo_limit_gives_reward_minus_value() -> None:
    # gamma = lambda = 1: A_t = (sum of future rewards) - V(s_t), the Monte-Carlo advantage.
    mask = jnp.array([[0, 1, 1, 0, 1, 0]], jnp.float32)
    rewards = last_token_rewards(jnp.array([2.0]), mask)
    np.testing.assert_array_equal(rewards, [[0, 0, 0, 0, 2.0, 0]])
    values = jnp.array([[9.0, 0.5, 1.0, 9.0, 1.5, 9.0]])
    adv, _ = gae(rewards, values, mask, 1.0, 1.0)
    np.testing.assert_allclose(adv, [[0, 1.5, 1.0, 0, 0.5, 0]], rtol=1e-6)


def test_last_token_rewards_of_an_empty_row_are_zero() -> None:
    mask = jnp.array([[0, 0, 0], [1, 1, 0]], jnp.float32)
    np.testing.assert_array_equal(
        last_token_rewards(jnp.array([5.0, 1.0]), mask), [[0, 0, 0], [0, 1, 0]]
    )


def test_whiten_over_the_mask() -> None:
    x = jax.random.normal(jax.random.key(0), (4, 9)) * 3 + 2
    mask = (jax.random.uniform(jax.random.key(1), (4, 9)) > 0.3).astype(jnp.float32)
    w = whiten(x, mask)
    n = mask.sum()
    assert float((w * mask).sum() / n) == pytest.approx(0.0, abs=1e-5)
    assert float(((w * mask) ** 2).sum() / n) == pytest.approx(1.0, rel=1e-4)
    assert float(jnp.abs(w * (1 - mask)).sum()) == 0.0


def test_value_loss_is_half_squared_error_inside_the_clip_range() -> None:
    values, old, ret = jnp.array([[1.1]]), jnp.array([[1.0]]), jnp.array([[2.0]])
    loss, frac = value_loss(values, old, ret, jnp.ones((1, 1)), 0.2)
    assert float(loss) == pytest.approx(0.5 * 0.9**2, rel=1e-5) and float(frac) == 0.0
    grad = jax.grad(lambda v: value_loss(v, old, ret, jnp.ones((1, 1)), 0.2)[0])(values)
    assert float(grad[0, 0]) == pytest.approx(-0.9, rel=1e-5)


def test_value_loss_clips_a_step_that_overshoots() -> None:
    # The new value jumped past the target, beyond the clip range: the clipped error is larger
    # and wins the max, and its gradient is zero (the step is already too big).
    values, old, ret = jnp.array([[3.0]]), jnp.array([[1.0]]), jnp.array([[2.0]])
    loss, frac = value_loss(values, old, ret, jnp.ones((1, 1)), 0.2)
    assert float(loss) == pytest.approx(0.5 * 1.0**2) and float(frac) == 0.0
    values = jnp.array([[1.5]])  # moved the right way but past old + clip: clipped error 0.8
    loss, frac = value_loss(values, old, ret, jnp.ones((1, 1)), 0.2)
    assert float(loss) == pytest.approx(0.5 * 0.8**2, rel=1e-5) and float(frac) == 1.0
    grad = jax.grad(lambda v: value_loss(v, old, ret, jnp.ones((1, 1)), 0.2)[0])(values)
    assert float(grad[0, 0]) == 0.0
