"""What the runs of one process share when a worker hosts several at once.

docs/shared-base.md: an operator may let a worker run several runs at once
(``RLAAS_RUNS_PER_WORKER``). The runs then share the process's `Colocation`: LoRA runs
with the JAX engine share their base model's weights (`SharedBases`), and every run's
device work takes fair turns on the accelerator (`DeviceShare`). A run that cannot share
its base (it trains every weight, or samples with vLLM, which holds its own copy) loads
its own, and still takes turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_core.pipeline.device_share import DeviceShare
from rl_core.pretrained.shared_bases import SharedBases
from rl_core.spec import JobSpec


def device_share() -> DeviceShare:
    """One call at a time on an accelerator; on the CPU backend one per core."""
    import os

    import jax

    cpu = jax.default_backend() == "cpu"
    return DeviceShare(capacity=(os.cpu_count() or 1) if cpu else 1)


@dataclass(frozen=True)
class Colocation:
    bases: SharedBases = field(default_factory=SharedBases)
    device: DeviceShare = field(default_factory=device_share)


def shares_base(spec: JobSpec) -> str | None:
    """Why ``spec`` cannot run on a shared base; None when it can."""
    if spec.model.lora is None:
        return "it trains every weight of its model (no model.lora)"
    if spec.rollout.engine != "jax":
        return "its rollouts come from vLLM, which holds its own copy of the weights"
    return None


__all__ = ["Colocation", "shares_base"]
