"""Which Tinker losses rlaas serves, what each reads, and its ``loss_fn_config`` (no JAX).

The control plane refuses a loss or a config here, before any call reaches a worker; the
trainer (`rl_core.training.losses`) resolves the same config into the numbers it uses.

Sources for each loss's definition and defaults (docs/tinker.md cites them): Tinker's
loss docs (``ppo``, ``cispo``, ``dro``, ``gspo`` pages) and the Tinker cookbook's
``tutorials/202_loss_functions.py`` (PPO's clip defaults 0.8 / 1.2, CISPO's 0.0 / 4.0).
What those sources leave open is refused rather than guessed:

- ``dro``'s ``beta`` has no documented default: it must be sent;
- ``gspo``'s clip thresholds have no documented default: both must be sent;
- ``stable_reinforce``'s objective reads information Tinker's sampler records and does not
  document: not served;
- ``custom`` with a ``loss_id`` (a loss graph uploaded by ``create_custom_loss``) is not
  served; ``forward_backward_custom`` with a Python function needs no server support (the
  SDK computes it from ``forward`` and a ``cross_entropy`` pass, and that works).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rl_core.errors import UnsupportedSpec

# What each served loss reads from a datum's loss_fn_inputs, besides target_tokens.
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
    "gspo": ("logprobs", "advantages", "sequence_ratio_mask"),
}
LOSSES = tuple(LOSS_INPUTS)

CLIP_LOW, CLIP_HIGH, BETA = "clip_low_threshold", "clip_high_threshold", "beta"

# The loss_fn_config keys each loss reads, with their defaults; None: no documented
# default, so the key must be sent.
CONFIG: dict[str, dict[str, float | None]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {CLIP_LOW: 0.8, CLIP_HIGH: 1.2},
    "cispo": {CLIP_LOW: 0.0, CLIP_HIGH: 4.0},
    "dro": {BETA: None},
    "gspo": {CLIP_LOW: None, CLIP_HIGH: None},
}

NOT_SERVED = {
    "stable_reinforce": (
        "is not served: its objective uses stability information that Tinker's sampler "
        "records (record_stability_info) and that Tinker does not document, so rlaas cannot "
        "compute the same loss; use ppo, cispo or gspo for off-policy data"
    ),
    "custom": (
        "with a loss_id (a loss uploaded by create_custom_loss) is not served; "
        "forward_backward_custom with a Python loss function works unchanged (the SDK runs "
        "it from forward and a cross_entropy pass)"
    ),
}


def check_loss_fn(loss_fn: str) -> None:
    """Refuse a loss this server does not compute, saying why and what to use instead."""
    if loss_fn in NOT_SERVED:
        raise UnsupportedSpec("loss_fn", f"loss_fn {loss_fn!r} {NOT_SERVED[loss_fn]}")
    if loss_fn not in LOSSES:
        raise UnsupportedSpec("loss_fn", f"loss_fn {loss_fn!r} is not served; use one of {LOSSES}")


def resolve_config(loss_fn: str, config: Mapping[str, float | str] | None) -> dict[str, float]:
    """``loss_fn``'s config values, the documented defaults filled in. A key the loss does
    not read, a value that is not a finite number, a missing key with no documented
    default, or clip thresholds out of order are refused, naming the key."""
    check_loss_fn(loss_fn)
    known = CONFIG[loss_fn]
    given = dict(config or {})
    for key, value in given.items():
        field = f"loss_fn_config.{key}"
        if key not in known:
            reads = ", ".join(known) or "no loss_fn_config"
            raise UnsupportedSpec(field, f"{loss_fn} does not read {key!r}; it reads {reads}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UnsupportedSpec(field, f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise UnsupportedSpec(field, f"must be finite, got {value!r}")
    resolved: dict[str, float] = {}
    for key, default in known.items():
        chosen = given.get(key, default)  # a number by now: the loop above checked it
        if chosen is None:
            raise UnsupportedSpec(
                f"loss_fn_config.{key}",
                f"{loss_fn} needs {key}: Tinker's docs give it no default, so rlaas does not "
                "guess one; send it in loss_fn_config",
            )
        resolved[key] = float(chosen)
    if CLIP_LOW in resolved and resolved[CLIP_LOW] > resolved[CLIP_HIGH]:
        raise UnsupportedSpec(
            f"loss_fn_config.{CLIP_LOW}",
            f"must not exceed {CLIP_HIGH} ({resolved[CLIP_LOW]} > {resolved[CLIP_HIGH]}); "
            "both are bounds on the probability ratio, e.g. 0.8 and 1.2",
        )
    if resolved.get(BETA, 0.0) < 0:
        raise UnsupportedSpec(f"loss_fn_config.{BETA}", "must be 0 or more")
    return resolved


__all__ = [
    "BETA",
    "CLIP_HIGH",
    "CLIP_LOW",
    "CONFIG",
    "LOSSES",
    "LOSS_INPUTS",
    "NOT_SERVED",
    "check_loss_fn",
    "resolve_config",
]
