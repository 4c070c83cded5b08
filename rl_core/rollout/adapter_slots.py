"""The adapter slots of a `JaxEngine`: S LoRA adapters stacked on one base, set one by one.

The base's weights are held once; each slot holds one adapter in `rl_core.models.lora`'s
layout, stacked with the others as ``[S + 1, ...]`` leaves (`rl_core.models.multi_lora`):
the extra slot S stays all zeros and is what a request without an adapter (and every
padding row) runs with. Setting a slot replaces the stacked arrays with new ones (never in
place: a device call already dispatched keeps the arrays it was given) and bumps the
slot's version, which the scheduler's prefix index keys parked sequences by.

A request holds its slot from `claim` to `release`: a slot in use cannot be set or
cleared (`RolloutError`), so no request ever changes adapter half-way. Whoever shares
slots between more adapters than there are slots (the Tinker worker's least recently
used cache) waits for a slot's requests to end before reusing it. The one exception is
`swap`, for a slot that serves one live policy (a job run on a shared base,
`rl_core.rollout.adapter_policy`): as with the base's weights in `JaxEngine.update_weights`,
the new adapter applies from the next decode step, requests in flight included.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from rl_core.errors import RolloutError
from rl_core.models.lora import Adapters, LoraConfig
from rl_core.models.multi_lora import set_slot, zero_stacked


class AdapterSlots:
    """``slots`` adapter slots over the targeted kernels of ``params`` (thread-safe)."""

    def __init__(self, params: Any, lora: LoraConfig, slots: int) -> None:
        if slots < 1:
            raise RolloutError(f"adapter_slots must be at least 1, got {slots}")
        self.lora, self.n = lora, slots
        stacked = zero_stacked(params, lora, slots + 1)  # slot S: the base alone
        self._stacked = stacked
        self.treedef: Any = jax.tree.structure(stacked)
        self._shapes = [(x.shape[1:], x.dtype) for x in jax.tree.leaves(stacked)]
        self.leaves: list[jax.Array] = jax.tree.leaves(stacked)  # read once per device call
        self.versions: tuple[int, ...] = (0,) * slots
        self._in_use = [0] * slots
        self._lock = threading.Lock()
        self._counter = itertools.count(1)

    @property
    def base_slot(self) -> int:
        return self.n

    def set(self, slot: int, adapters: Adapters) -> None:
        """Slot ``slot`` holds ``adapters`` (a copy, in the engine's dtype) from now on."""
        self._replace(slot, adapters, in_flight=False)

    def swap(self, slot: int, adapters: Adapters) -> None:
        """`set`, even while requests of ``slot`` are in flight: they continue with
        ``adapters`` from their next decode step."""
        self._replace(slot, adapters, in_flight=True)

    def _replace(self, slot: int, adapters: Adapters, *, in_flight: bool) -> None:
        self._check(slot)
        one = self._checked(adapters)
        with self._lock:
            if self._in_use[slot] and not in_flight:
                raise RolloutError(
                    f"adapter slot {slot} has {self._in_use[slot]} requests in flight; set it "
                    "once they are done"
                )
            self._stacked = set_slot(self._stacked, jnp.int32(slot), one)
            self.leaves = jax.tree.leaves(self._stacked)
            versions = list(self.versions)
            versions[slot] = next(self._counter)
            self.versions = tuple(versions)

    def clear(self, slot: int) -> None:
        """Slot ``slot`` holds no adapter (zeros: it samples as the base)."""
        zeros = jax.tree.unflatten(
            self.treedef, [jnp.zeros(shape, dtype) for shape, dtype in self._shapes]
        )
        self.set(slot, zeros)

    def claim(self, slots: Sequence[int | None]) -> list[tuple[int | None, int]]:
        """Hold each request's slot until `release`; each one's (slot, version)."""
        for s in slots:
            if s is not None:
                self._check(s)
        with self._lock:
            for s in slots:
                if s is not None:
                    self._in_use[s] += 1
            return [(s, 0 if s is None else self.versions[s]) for s in slots]

    def release(self, slots: Sequence[int | None]) -> None:
        with self._lock:
            for s in slots:
                if s is not None:
                    self._in_use[s] -= 1

    def in_use(self, slot: int) -> int:
        """Requests holding ``slot`` now."""
        return self._in_use[slot]

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.n:
            raise RolloutError(f"adapter slot {slot} is not one of this engine's 0..{self.n - 1}")

    def _checked(self, adapters: Adapters) -> Adapters:
        """``adapters`` if they fit the slots (same targets, rank and shapes), else why not."""
        if jax.tree.structure(adapters) != self.treedef:  # a dict's treedef has no shapes
            raise RolloutError(
                f"these adapters are not in the engine's layout (targets {self.lora.targets}): "
                f"they adapt {sorted(adapters)}"
            )
        for x, (shape, _) in zip(jax.tree.leaves(adapters), self._shapes, strict=True):
            if tuple(x.shape) != tuple(shape):
                raise RolloutError(
                    f"an adapter of shape {tuple(x.shape)} where the engine's slots hold "
                    f"{tuple(shape)} (rank {self.lora.rank})"
                )
        return adapters
