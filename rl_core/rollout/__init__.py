"""Rollout engines. `base` is pure Python; `jax_engine` imports JAX when imported."""

from rl_core.rollout.base import Completion, Grammar, RolloutEngine, SamplingParams

__all__ = ["Completion", "Grammar", "RolloutEngine", "SamplingParams"]
