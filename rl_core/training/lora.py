"""LoRA for the trainer: the adapters' math lives in `rl_core.models.lora`.

It moved below the rollout engine, which applies adapters too (`rl_core.rollout` may not
import this room); the trainer, the exports and the Tinker pool keep importing it here.
"""

from rl_core.models.lora import (
    KNOWN_TARGETS,
    Adapters,
    LoraConfig,
    count_adapter_params,
    init_adapters,
    merged_params,
    targeted_kernels,
)

__all__ = [
    "KNOWN_TARGETS",
    "Adapters",
    "LoraConfig",
    "count_adapter_params",
    "init_adapters",
    "merged_params",
    "targeted_kernels",
]
