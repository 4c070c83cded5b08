"""Per-token estimators of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman, 2020).

With ``log_r = log pi_ref(a) - log pi_theta(a)`` for a token ``a`` drawn from
pi_theta::

    k1 = -log_r                      unbiased, high variance, can be negative
    k2 = log_r**2 / 2                biased, low variance, >= 0
    k3 = exp(log_r) - log_r - 1      unbiased, low variance, >= 0 (the default)

As a penalty in the loss, k3's gradient pulls pi_theta towards pi_ref only
where they differ, and it is exactly 0 (with zero gradient) when they agree.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

KlEstimator = Literal["k1", "k2", "k3"]


def kl_penalty(
    logprobs: jax.Array,  # [...] log pi_theta of the sampled tokens
    ref_logprobs: jax.Array,  # [...] log pi_ref of the same tokens
    estimator: KlEstimator = "k3",
) -> jax.Array:  # [...]
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return jnp.exp(log_r) - log_r - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1', 'k2' or 'k3'")


def sampled_kl(
    target_logprobs: jax.Array,  # [...] log p of tokens drawn from q
    sample_logprobs: jax.Array,  # [...] log q of the same tokens
) -> jax.Array:  # [...] k3 estimate of KL(q || p), clamped at 0
    """KL(q || p) from tokens drawn from q: the sampler/trainer ``mismatch_kl``.

    k3 is >= 0 exactly; rounding can dip a hair below it, hence the clamp.
    """
    return jnp.maximum(kl_penalty(sample_logprobs, target_logprobs, "k3"), 0.0)


__all__ = ["KlEstimator", "kl_penalty", "sampled_kl"]
