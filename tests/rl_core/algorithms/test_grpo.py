"""Property tests of the GRPO numerics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.algorithms.grpo import (
    Counts,
    GrpoConfig,
    aggregate,
    group_advantages,
    policy_loss,
    token_logprobs,
    turn_advantages,
)

ALL = jnp.ones((2, 4), bool)


def test_equal_rewards_give_zero_advantage() -> None:
    rewards = jnp.array([[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 1.0, 0.0]])
    adv = group_advantages(rewards, ALL, True)
    np.testing.assert_allclose(adv[0], 0.0, atol=1e-6)
    assert float(jnp.abs(adv[1]).min()) > 0.5


@pytest.mark.parametrize("scale", [True, False])
def test_advantages_are_centred_per_group(scale: bool) -> None:
    rewards = jax.random.uniform(jax.random.key(0), (5, 6)) * 3
    adv = group_advantages(rewards, jnp.ones((5, 6), bool), scale)
    np.testing.assert_allclose(adv.mean(axis=1), 0.0, atol=1e-5)
    if scale:
        np.testing.assert_allclose(adv.std(axis=1), 1.0, atol=1e-4)
    else:
        np.testing.assert_allclose(adv, rewards - rewards.mean(axis=1, keepdims=True), atol=1e-6)


def test_dropped_episodes_are_ignored() -> None:
    rewards = jnp.array([[1.0, 0.0, 100.0]])
    valid = jnp.array([[True, True, False]])
    adv = group_advantages(rewards, valid, False)
    np.testing.assert_allclose(adv, [[0.5, -0.5, 0.0]], atol=1e-6)


@pytest.mark.parametrize("scale", [True, False])
def test_turn_advantages_of_one_turn_are_the_episode_advantages(scale: bool) -> None:
    rewards = jax.random.uniform(jax.random.key(1), (3, 5)) * 2
    valid = jnp.array([[True] * 5, [True, True, False, True, True], [True] * 5])
    turn = turn_advantages(rewards[..., None], valid[..., None], scale)[..., 0]
    np.testing.assert_allclose(turn, group_advantages(rewards, valid, scale), atol=1e-5)


def test_a_turn_is_credited_with_what_it_and_later_turns_earned_not_earlier_luck() -> None:
    # Two members, three turns. They differ only in turn 0's reward (luck before turn 1)
    # and in turn 2's reward (earned at turn 2).
    rewards = jnp.array([[[1.0, 0.5, 1.0], [0.0, 0.5, 0.0]]])
    reached = jnp.ones((1, 2, 3), bool)
    adv = np.asarray(turn_advantages(rewards, reached, False))
    # Returns-to-go: member 0 (2.5, 1.5, 1.0), member 1 (0.5, 0.5, 0.0).
    np.testing.assert_allclose(adv[0, :, 0], [1.0, -1.0], atol=1e-6)
    np.testing.assert_allclose(adv[0, :, 1], [0.5, -0.5], atol=1e-6)  # turn 0 left out
    np.testing.assert_allclose(adv[0, :, 2], [0.5, -0.5], atol=1e-6)


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_gamma_discounts_the_later_turns_rewards(gamma: float) -> None:
    # Same rewards as above; returns-to-go written out by hand for each gamma.
    rewards = jnp.array([[[1.0, 0.5, 1.0], [0.0, 0.5, 0.0]]])
    adv = np.asarray(turn_advantages(rewards, jnp.ones((1, 2, 3), bool), False, gamma=gamma))
    togo = {
        0.0: [[1.0, 0.5, 1.0], [0.0, 0.5, 0.0]],
        0.5: [[1.0 + 0.25 + 0.25, 0.5 + 0.5, 1.0], [0.0 + 0.25 + 0.0, 0.5, 0.0]],
    }[gamma]
    expected = np.asarray(togo) - np.asarray(togo).mean(axis=0)
    np.testing.assert_allclose(adv[0], expected, atol=1e-6)


def test_members_that_did_not_reach_a_turn_are_out_of_its_baseline() -> None:
    rewards = jnp.array([[[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]])
    reached = jnp.array([[[True, True], [True, True], [True, False]]])
    adv = np.asarray(turn_advantages(rewards, reached, False))
    # Turn 1: members 0 and 1 only (1.0 and 0.0); member 2 ended at turn 0.
    np.testing.assert_allclose(adv[0, :, 1], [0.5, -0.5, 0.0], atol=1e-6)
    np.testing.assert_allclose(adv[0, :, 0], [1 - 2 / 3, -2 / 3, 1 - 2 / 3], atol=1e-6)


@pytest.mark.parametrize("scale", [True, False])
def test_batch_baseline_centres_over_the_whole_batch(scale: bool) -> None:
    rewards = jax.random.uniform(jax.random.key(2), (4, 6)) * 3
    adv = np.asarray(group_advantages(rewards, jnp.ones((4, 6), bool), scale, baseline="batch"))
    np.testing.assert_allclose(adv.mean(), 0.0, atol=1e-5)
    expected = rewards - rewards.mean()
    if scale:
        expected = expected / rewards.std()
    np.testing.assert_allclose(adv, expected, atol=1e-4)


def test_a_unanimous_wrong_group_moves_only_with_the_batch_baseline() -> None:
    # Group 0 all answered a turn wrong (0), group 1 all right (1): the group's own
    # mean gives both zero; the batch's mean pushes group 0 down and group 1 up.
    rewards = jnp.array([[[0.0], [0.0]], [[1.0], [1.0]]])
    reached = jnp.ones((2, 2, 1), bool)
    np.testing.assert_allclose(turn_advantages(rewards, reached, False), 0.0, atol=1e-6)
    adv = np.asarray(turn_advantages(rewards, reached, False, baseline="batch"))[..., 0]
    np.testing.assert_allclose(adv, [[-0.5, -0.5], [0.5, 0.5]], atol=1e-6)


def test_batch_baseline_per_turn_counts_only_members_that_reached_it() -> None:
    rewards = jnp.array([[[0.0, 1.0], [1.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    reached = jnp.array([[[True, True], [True, False]], [[True, True], [True, True]]])
    adv = np.asarray(turn_advantages(rewards, reached, False, baseline="batch"))
    # Turn 1: three members reached it, returns-to-go 1, 0, 0 -> mean 1/3; member (0,1) out.
    np.testing.assert_allclose(adv[:, :, 1], [[2 / 3, 0.0], [-1 / 3, -1 / 3]], atol=1e-6)
    # Turn 0: returns-to-go 1, 1, 0, 0 -> mean 0.5.
    np.testing.assert_allclose(adv[:, :, 0], [[0.5, 0.5], [-0.5, -0.5]], atol=1e-6)


def loss_of(ratio: float, adv: float, **cfg: object) -> tuple[float, dict[str, float], float]:
    """Loss, metrics and d loss / d logprob for one token with the given ratio and advantage."""
    config = GrpoConfig(**cfg)  # type: ignore[arg-type]
    old = jnp.full((1, 1), -1.0)
    mask = jnp.ones((1, 1))

    def f(lp: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        return policy_loss(lp, old, old, jnp.array([adv]), mask, jnp.zeros((1, 1)), config)

    lp = old + jnp.log(ratio)
    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(lp)
    return float(loss), {k: float(v) for k, v in metrics.items()}, float(grad[0, 0])


def test_unclipped_loss_is_minus_ratio_times_advantage() -> None:
    loss, metrics, grad = loss_of(1.1, 2.0)
    assert loss == pytest.approx(-1.1 * 2.0, rel=1e-5)
    assert grad == pytest.approx(-1.1 * 2.0, rel=1e-5)  # d(-r A)/d logp = -r A
    assert metrics["clip_frac"] == 0.0


def test_clipping_stops_the_gradient_beyond_the_range() -> None:
    loss, metrics, grad = loss_of(1.5, 1.0, clip_eps=0.2)
    assert loss == pytest.approx(-1.2, rel=1e-5) and grad == 0.0
    assert metrics["clip_frac"] == 1.0
    # With a negative advantage, a large ratio is not clipped (the pessimistic branch).
    loss, metrics, grad = loss_of(1.5, -1.0, clip_eps=0.2)
    assert loss == pytest.approx(1.5, rel=1e-5) and grad != 0.0
    assert metrics["clip_frac"] == 0.0
    _, metrics, grad = loss_of(0.5, -1.0, clip_eps=0.2)
    assert grad == 0.0 and metrics["clip_frac"] == 1.0


def test_clip_higher_widens_the_upper_side_only() -> None:
    assert loss_of(1.25, 1.0, clip_eps=0.2, clip_eps_high=0.28)[2] != 0.0
    assert loss_of(1.3, 1.0, clip_eps=0.2, clip_eps_high=0.28)[2] == 0.0
    assert loss_of(0.75, -1.0, clip_eps=0.2, clip_eps_high=0.28)[2] == 0.0


def test_truncated_importance_weight_is_capped() -> None:
    old = jnp.zeros((1, 3))
    behaviour = jnp.log(jnp.array([[1.0, 0.5, 0.01]]))  # weights 1, 2, 100
    mask, adv = jnp.ones((1, 3)), jnp.array([1.0])
    cfg = GrpoConfig(importance_correction="truncated", importance_cap=2.0)
    loss, m = policy_loss(old, old, behaviour, adv, mask, jnp.zeros((1, 3)), cfg)
    assert float(loss) == pytest.approx(-(1 + 2 + 2) / 3, rel=1e-5)
    assert float(m["importance_weight"]) == pytest.approx(5 / 3, rel=1e-5)
    assert float(m["mismatch_kl"]) > 0
    none = GrpoConfig(importance_correction="none")
    loss, _ = policy_loss(old, old, behaviour, adv, mask, jnp.zeros((1, 3)), none)
    assert float(loss) == pytest.approx(-1.0, rel=1e-5)


def test_mismatch_is_zero_when_sampler_and_trainer_agree() -> None:
    lp = -jax.random.uniform(jax.random.key(1), (3, 5))
    _, m = policy_loss(lp, lp, lp, jnp.ones(3), jnp.ones((3, 5)), jnp.zeros((3, 5)), GrpoConfig())
    assert float(m["mismatch_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(m["kl"]) == 0.0


def test_kl_penalty_to_reference() -> None:
    lp = jnp.log(jnp.full((1, 2), 0.5))
    ref = jnp.log(jnp.full((1, 2), 0.25))
    cfg = GrpoConfig(kl_coef=0.5)
    args = (lp, lp, lp, jnp.zeros(1), jnp.ones((1, 2)), jnp.zeros((1, 2)), cfg)
    loss, m = policy_loss(*args, ref_logprobs=ref)
    q = np.log(0.5)  # log ref - log pi
    assert float(m["kl"]) == pytest.approx(np.exp(q) - q - 1, rel=1e-5)
    assert float(loss) == pytest.approx(0.5 * (np.exp(q) - q - 1), rel=1e-5)


def test_aggregation_modes() -> None:
    per_token = jnp.array([[1.0, 1.0, 1.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], jnp.float32)
    assert float(aggregate(per_token, mask, "token_mean", 10)) == pytest.approx(7 / 4)
    assert float(aggregate(per_token, mask, "sequence_mean", 10)) == pytest.approx((1 + 4) / 2)
    assert float(aggregate(per_token, mask, "token_sum_norm", 10)) == pytest.approx(7 / (2 * 10))


def test_token_logprobs_and_entropy() -> None:
    logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25]]]))
    lp, ent = token_logprobs(logits, jnp.array([[1]]))
    assert float(lp[0, 0]) == pytest.approx(np.log(0.25), rel=1e-5)
    assert float(ent[0, 0]) == pytest.approx(-(0.5 * np.log(0.5) + 0.5 * np.log(0.25)), rel=1e-5)
    hot, _ = token_logprobs(logits, jnp.array([[1]]), temperature=2.0)
    assert float(hot[0, 0]) > float(lp[0, 0])  # higher temperature flattens


@pytest.mark.parametrize("floor", [None, 0.5])
def test_entropy_bonus_and_floor(floor: float | None) -> None:
    """The bonus lifts every token's entropy; with a floor, only the tokens below it."""
    sharp = jnp.array([8.0, 0.0, 0.0, 0.0])  # entropy ~0.01 nats
    flat = jnp.array([0.3, 0.0, 0.1, 0.2])  # entropy ~1.38 nats
    logits = jnp.stack([sharp, flat])[None]  # [1, 2, V]
    config = GrpoConfig(entropy_coef=0.1, entropy_floor=floor)

    def loss(z: jax.Array) -> jax.Array:
        lp, entropy = token_logprobs(z, jnp.zeros((1, 2), jnp.int32))
        out, _ = policy_loss(lp, lp, lp, jnp.zeros((1,)), jnp.ones((1, 2)), entropy, config)
        return out

    grad = jax.grad(loss)(logits)[0]
    _, before = token_logprobs(logits, jnp.zeros((1, 2), jnp.int32))
    _, after = token_logprobs(logits - grad, jnp.zeros((1, 2), jnp.int32))  # one SGD step
    assert float(after[0, 0]) > float(before[0, 0])  # the sharp token is always lifted
    if floor is None:
        assert float(after[0, 1]) > float(before[0, 1])
    else:
        np.testing.assert_allclose(grad[1], 0.0, atol=1e-7)  # above the floor: left alone


def test_mismatch_splits_into_the_engines_gap_and_the_lagged_tokens() -> None:
    """Tokens sampled with the trainer's own weights (lag 0) measure the engine alone;
    lagged ones the policy's lag on top. The split's means add up to the overall one, and
    micro-batches given the batch's counts add up to the whole batch's figures."""
    key1, key2 = jax.random.split(jax.random.key(3))
    old = -jax.random.uniform(key1, (4, 6), minval=0.1, maxval=2.0)
    engine_gap = 1e-3 * jax.random.normal(key2, (4, 6))
    lag = jnp.array([[0.0] * 6, [0.0] * 6, [1.0] * 6, [0.0] * 3 + [2.0] * 3])
    behaviour = old + engine_gap + 0.5 * lag  # older weights: far off
    mask = jnp.ones((4, 6)).at[0, 5].set(0.0)
    args = (old, old, behaviour, jnp.ones(4), mask, jnp.zeros((4, 6)), GrpoConfig())
    _, m = policy_loss(*args, lag=lag)
    fresh = (lag == 0) & (mask > 0)
    assert float(m["mismatch/engine_max"]) == pytest.approx(
        float(jnp.max(jnp.where(fresh, jnp.abs(engine_gap), 0.0))), rel=1e-5
    )
    assert float(m["mismatch/engine_max"]) < 1e-2 < float(m["mismatch/lagged_max"])
    assert float(m["mismatch/lagged_token_frac"]) == pytest.approx(9 / 23)
    assert float(m["mismatch/lag_mean"]) == pytest.approx((6 + 3 * 2) / 23)
    n_fresh, n_lagged = 14, 9
    overall = (n_fresh * m["mismatch/engine_kl"] + n_lagged * m["mismatch/lagged_kl"]) / 23
    assert float(overall) == pytest.approx(float(m["mismatch_kl"]), rel=1e-5)
    # Two micro-batches with the whole batch's counts add up to it.
    counts = Counts.of(mask, lag)
    halves = [
        policy_loss(
            *(a[i : i + 2] for a in args[:6]), GrpoConfig(), counts=counts, lag=lag[i : i + 2]
        )[1]
        for i in (0, 2)
    ]
    assert float(
        halves[0]["mismatch/engine_kl"] + halves[1]["mismatch/engine_kl"]
    ) == pytest.approx(float(m["mismatch/engine_kl"]), rel=1e-5)
    # No lagged tokens at all (a sync run): their figures are NaN, never a perfect 0.
    _, sync = policy_loss(*args, lag=jnp.zeros((4, 6)))
    assert jnp.isnan(sync["mismatch/lagged_kl"]) and jnp.isnan(sync["mismatch/lagged_max"])
    assert float(sync["mismatch/engine_kl"]) == pytest.approx(float(sync["mismatch_kl"]), rel=1e-6)
    assert "mismatch/engine_kl" not in policy_loss(*args)[1]  # no lag given: no split
