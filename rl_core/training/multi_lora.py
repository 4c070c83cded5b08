"""Many LoRA adapters on one base for the trainer: the grouped product lives in
`rl_core.models.multi_lora`, below the rollout engine, which samples with it too."""

from rl_core.models.multi_lora import (
    DEFAULT_IMPL,
    IMPLS,
    Impl,
    MultiLoraLinear,
    StackedAdapters,
    delta_gather,
    delta_ragged,
    init_stacked,
    multi_lora_model,
    slot_adapters,
    stack_adapters,
    wrap_linears,
)

__all__ = [
    "DEFAULT_IMPL",
    "IMPLS",
    "Impl",
    "MultiLoraLinear",
    "StackedAdapters",
    "delta_gather",
    "delta_ragged",
    "init_stacked",
    "multi_lora_model",
    "slot_adapters",
    "stack_adapters",
    "wrap_linears",
]
