"""Tinker's policy losses written plainly from their documented formulas (Tinker's loss
docs, cited in docs/tinker.md), in float64 numpy: the reference the trainer is tested
against (tests/rl_core/training/test_tinker_losses.py, tests/app/test_tinker_losses.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def reference(
    loss_fn: str,
    lp: np.ndarray,
    inputs: Mapping[str, Sequence[float]],
    cfg: Mapping[str, float],
) -> tuple[float, np.ndarray]:
    """One datum's loss and dL/dlp: ``lp`` the trainer's logprobs of its targets,
    ``inputs`` its loss_fn_inputs, ``cfg`` its loss_fn_config with the defaults filled in."""
    lp = np.asarray(lp, np.float64)
    q = np.asarray(inputs["logprobs"], np.float64)
    a = np.asarray(inputs["advantages"], np.float64)
    lo, hi = cfg.get("clip_low_threshold"), cfg.get("clip_high_threshold")
    if loss_fn == "importance_sampling":
        r = np.exp(lp - q)
        return float(-(r * a).sum()), -r * a
    if loss_fn == "ppo":
        r = np.exp(lp - q)
        unclipped, clipped = r * a, np.clip(r, lo, hi) * a
        # min picks the clipped term only where it is smaller; inside [lo, hi] both are r*a
        live = (unclipped <= clipped) | ((r >= lo) & (r <= hi))
        return float(-np.minimum(unclipped, clipped).sum()), np.where(live, -r * a, 0.0)
    if loss_fn == "cispo":
        w = np.clip(np.exp(lp - q), lo, hi)
        return float(-(w * lp * a).sum()), -w * a
    if loss_fn == "dro":
        beta = cfg["beta"]
        return float(-(lp * a - 0.5 * beta * (lp - q) ** 2).sum()), -(a - beta * (lp - q))
    if loss_fn == "gspo":
        marked = np.asarray(inputs["sequence_ratio_mask"]) != 0
        s = np.exp((lp - q)[marked].mean())  # one ratio for the datum: its value everywhere
        unclipped, clipped = s * a, np.clip(s, lo, hi) * a
        live = (unclipped <= clipped) | (lo <= s <= hi)
        return float(-np.minimum(unclipped, clipped).sum()), np.where(live, -s * a, 0.0)
    raise AssertionError(loss_fn)
