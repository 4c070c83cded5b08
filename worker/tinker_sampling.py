"""Sampling for the Tinker worker: sampler snapshots kept as adapters, served from the adapter
slots of one engine per base and LoRA config, so samples of different models share a batch.

`save_weights_for_sampler` keeps a `Snapshot`: the model's adapter as it is at the save (a
few MB: a copy, which the trainer's later steps never touch, as they make new arrays),
not the base merged with it (a full copy of the base each). To sample one, `SlotCache`
puts it in a slot of its engine (a `JaxEngine` with ``adapter_slots``, holding the base
once), unless it is there already; with more snapshots in use than slots, the one used
least recently and held by no sample gives its slot up (a sample waits when every slot
is held). A sample holds its slot until its completions are back, so no slot changes
adapter under a running request (the engine refuses that too).

The engines run in `serving` mode for the worker's life: concurrent sample calls, of one
model or of many, join the same continuous batch, each row with its own adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any

SAMPLER_SLOTS = 8  # adapter slots of a sampling engine: snapshots sampled without a reload
SLOTS_SETTING = "RLAAS_TINKER_SAMPLER_SLOTS"
MAX_SLOTS = 1024
# Decode batch sizes of the sampling engines (the engine's default): a call's num_samples
# rows, with other models' calls beside them.
SAMPLE_BATCH_BUCKETS = (8, 64)

_ids = itertools.count(1)


def sampler_slots(environ: Mapping[str, str]) -> int:
    """The operator's adapter slots per sampling engine (``RLAAS_TINKER_SAMPLER_SLOTS``)."""
    raw = environ.get(SLOTS_SETTING, "").strip()
    if not raw:
        return SAMPLER_SLOTS
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_SLOTS:
        raise ValueError(
            f"{SLOTS_SETTING} must be a whole number of adapter slots from 1 to {MAX_SLOTS} "
            f"(each holds one sampler snapshot on the device); got {raw!r}"
        )
    return int(raw)


@dataclasses.dataclass(frozen=True, eq=False)
class Snapshot:
    """A model's adapter frozen at a `save_weights_for_sampler`, and the base it goes on."""

    base: str
    lora: Any  # rl_core.models.lora.LoraConfig: the engine it is sampled on
    adapters: Any  # rl_core.models.lora.Adapters: [d_in, r] / [r, d_out] per target
    id: int = dataclasses.field(default_factory=lambda: next(_ids))  # a re-save is a new one

    @property
    def nbytes(self) -> int:
        import jax

        return sum(int(x.nbytes) for x in jax.tree.leaves(self.adapters))


class SlotCache:
    """Which snapshot each adapter slot of ``engine`` holds; least recently used goes first.

    Runs on the worker's event loop (``set_adapter`` is called there: a small jitted copy
    into the stacked adapters, dispatched without waiting for it)."""

    def __init__(self, engine: Any, slots: int) -> None:
        self.engine = engine  # rl_core.rollout.jax_engine.JaxEngine, with ``slots`` slots
        self._where: OrderedDict[int, int] = OrderedDict()  # snapshot id -> slot, oldest first
        self._owner: list[int | None] = [None] * slots  # slot -> snapshot id
        self._held = [0] * slots  # samples running on each slot
        self._changed = asyncio.Condition()
        self.loads = 0  # snapshots put in a slot (a reload after an eviction counts again)

    @contextlib.asynccontextmanager
    async def holding(self, snapshot: Snapshot) -> AsyncIterator[int]:
        """The slot of ``snapshot``, held for the block (a sample on it)."""
        slot = await self.hold(snapshot)
        try:
            yield slot
        finally:
            await self.let_go(slot)

    async def hold(self, snapshot: Snapshot) -> int:
        """The slot holding ``snapshot`` (put there if it is not), held until `let_go`."""
        async with self._changed:
            while True:
                slot = self._where.get(snapshot.id)
                if slot is not None:
                    self._where.move_to_end(snapshot.id)
                    break
                slot = self._vacant()
                if slot is not None:
                    self.engine.set_adapter(slot, snapshot.adapters)
                    self._where[snapshot.id], self._owner[slot] = slot, snapshot.id
                    self.loads += 1
                    break
                await self._changed.wait()  # every slot is held: wait for a sample to end
            self._held[slot] += 1
            return slot

    async def let_go(self, slot: int) -> None:
        async with self._changed:
            self._held[slot] -= 1
            self._changed.notify_all()

    def forget(self, snapshot: Snapshot) -> None:
        """``snapshot`` is gone (unloaded, or its path saved again): its slot is free once
        no sample holds it."""
        slot = self._where.pop(snapshot.id, None)
        if slot is not None:
            self._owner[slot] = None

    def _vacant(self) -> int | None:
        """A slot to load into: an empty one, else the least recently used one not held."""
        for slot, owner in enumerate(self._owner):
            if owner is None and not self._held[slot]:
                return slot
        for snapshot_id, slot in self._where.items():  # oldest first
            if not self._held[slot]:
                del self._where[snapshot_id]
                self._owner[slot] = None
                return slot
        return None


def sampling_engine(model: Any, tokenizer: Any, lora: Any, slots: int) -> Any:
    """A `JaxEngine` on ``model``'s weights (shared, not copied) with ``slots`` adapter slots
    of ``lora``'s rank and targets; ``slots=0``: the base alone."""
    from rl_core.rollout.jax_engine import EngineConfig, JaxEngine

    config = EngineConfig(
        stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id),
        pad_id=tokenizer.pad_id,
        batch_buckets=SAMPLE_BATCH_BUCKETS,
        adapter_slots=slots,
        lora=lora if slots else None,
    )
    return JaxEngine(model, config=config)
