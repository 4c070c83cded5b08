"""A run's rollout engine on a base model it shares: its policy is an adapter slot.

In a worker that hosts several LoRA runs of one base (docs/shared-base.md), each run's
`JaxEngine` is built over the same base arrays, with one adapter slot: the run's weight
updates are its LoRA adapters (`Trainer.adapters`), swapped into the slot, never the base
with the adapters merged into it, which would be a copy of the base per run and per
update. Sampling computes the adapter unmerged beside the base (`rl_core.models.multi_lora`),
as the trainer does by default (``lora_apply: unmerged``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from rl_core.models.lora import Adapters
from rl_core.rollout.base import Completion, Grammar, SamplingParams
from rl_core.rollout.jax_engine import JaxEngine


class AdapterPolicyEngine:
    """`RolloutEngine` whose policy is ``engine``'s base with the adapter in ``slot``."""

    def __init__(self, engine: JaxEngine, slot: int = 0) -> None:
        self.engine, self.slot = engine, slot

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        return await self.engine.generate(
            prompts,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            seeds=seeds,
            grammars=grammars,
            top_logprobs=top_logprobs,
            adapter_slot=self.slot,
        )

    def update_weights(self, params: Adapters, version: int) -> None:
        """``params``: the run's adapters (`rl_core.models.lora` layout), not full weights."""
        self.engine.update_adapter(self.slot, params, version)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[AdapterPolicyEngine]:
        async with self.engine.serving():
            yield self

    def close(self) -> None:
        self.engine.close()


__all__ = ["AdapterPolicyEngine"]
