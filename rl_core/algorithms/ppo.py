"""PPO's critic side (Schulman et al., 2017): GAE over masked tokens and the clipped value loss.

The actor side is the same clipped, importance-corrected surrogate as GRPO
(`grpo.policy_loss`), fed per-token advantages instead of per-sequence ones.

Time steps are the model's own tokens (mask 1); observation tokens between
turns are part of the next state, not actions, so GAE skips them: the
"next" step of an action token is the next *masked* token of its row. The
episode's reward arrives on its last action token (reward 0 elsewhere) and
the value after it is 0 (the episode ended)::

    delta_t = r_t + gamma * V(s_t') - V(s_t)           t' = next action token
    A_t     = delta_t + gamma * lambda * A_t'           (Schulman et al., 2016)
    R_t     = A_t + V(s_t)                              the value target
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rl_core.algorithms.grpo import Counts


@dataclasses.dataclass(frozen=True, kw_only=True)
class PpoConfig:
    gamma: float = 1.0
    gae_lambda: float = 0.95
    value_coef: float = 0.5
    value_clip: float = 0.2  # PPO2's clip of the value update around the old value
    whiten_advantages: bool = True


def last_token_rewards(
    rewards: jax.Array,  # [B] one reward per episode
    mask: jax.Array,  # [B, T] 1 on action tokens
) -> jax.Array:  # [B, T]: the reward on each row's last action token, 0 elsewhere
    t = mask.shape[1]
    last = t - 1 - jnp.argmax(mask[:, ::-1] > 0, axis=1)  # [B]; rows without tokens get none
    onehot = (jnp.arange(t)[None, :] == last[:, None]) & (mask.sum(axis=1, keepdims=True) > 0)
    return jnp.where(onehot, rewards[:, None], 0.0)


def gae(
    rewards: jax.Array,  # [B, T] per-token rewards (0 off the mask)
    values: jax.Array,  # [B, T] V(s_t) of the state before each token
    mask: jax.Array,  # [B, T] 1 on action tokens
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:  # advantages [B, T], returns [B, T]; 0 off the mask
    """Generalised advantage estimation over each row's action tokens, right to left."""
    act = mask > 0

    def back(
        carry: tuple[jax.Array, jax.Array], xs: tuple[jax.Array, jax.Array, jax.Array]
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        next_value, next_adv = carry  # [B], [B]: of the next action token (0 past the end)
        r, v, a = xs
        delta = r + gamma * next_value - v
        adv = delta + gamma * lam * next_adv
        # Off the mask nothing happens: the carry passes through to the previous action.
        carry = (jnp.where(a, v, next_value), jnp.where(a, adv, next_adv))
        return carry, jnp.where(a, adv, 0.0)

    b = rewards.shape[0]
    zeros = jnp.zeros((b,), jnp.float32)
    xs = (rewards.T, values.T, act.T)  # scan over time
    _, adv_t = jax.lax.scan(back, (zeros, zeros), xs, reverse=True)
    advantages = adv_t.T
    returns = jnp.where(act, advantages + values, 0.0)
    return advantages, returns


def whiten(
    x: jax.Array,  # [B, T]
    mask: jax.Array,  # [B, T]
    eps: float = 1e-8,
) -> jax.Array:  # [B, T] zero mean, unit variance over the masked entries; 0 off the mask
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    return (x - mean) * jax.lax.rsqrt(var + eps) * m


def value_loss(
    values: jax.Array,  # [B, T] current critic, differentiable
    old_values: jax.Array,  # [B, T] critic at the start of the step
    returns: jax.Array,  # [B, T] GAE targets
    mask: jax.Array,  # [B, T]
    clip: float,
    counts: Counts | None = None,  # the whole batch's, when this is one micro-batch
) -> tuple[jax.Array, jax.Array]:  # loss [], clipped fraction []
    """0.5 * max((V - R)^2, (V_clipped - R)^2), token mean; V_clipped = V_old + clip(V - V_old)."""
    m = mask.astype(jnp.float32)
    counts = Counts.of(m) if counts is None else counts
    old = jax.lax.stop_gradient(old_values)
    target = jax.lax.stop_gradient(returns)
    clipped = old + jnp.clip(values - old, -clip, clip)
    unclipped_err = (values - target) ** 2
    clipped_err = (clipped - target) ** 2
    per_token = 0.5 * jnp.maximum(unclipped_err, clipped_err)
    frac = ((clipped_err > unclipped_err) & (m > 0)).astype(jnp.float32)
    return (per_token * m).sum() / counts.tokens, (frac * m).sum() / counts.tokens
