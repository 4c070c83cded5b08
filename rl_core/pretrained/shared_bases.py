"""The base models of one process, loaded once and shared by the LoRA runs that name them.

A LoRA run never changes its base: the trainer keeps the base's arrays frozen (they are
its KL reference too) and an engine on a shared base samples with the run's adapter
beside them (`rl_core.rollout.adapter_policy`). So K runs of one base in one worker need
the base's memory once, not K times, and their compiled programs are the same ones.

`SharedBases.lease` gives a run the model and tokenizer of its ``model`` section, loading
them on the first lease and dropping them when the last run holding them ends. Two runs
asking at once for a base not yet loaded load it once: the second waits for the first.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from rl_core.models import Model
from rl_core.models.tokenizer import Tokenizer
from rl_core.pretrained.sources import load_model
from rl_core.spec import ModelSpec

BaseKey = tuple[str, str, int | None]


def base_key(spec: ModelSpec, *, seed: int) -> BaseKey:
    """What decides a base's weights: its source and dtype, and for a random-init preset
    (``builtin:``) the seed it was drawn with. The LoRA settings are the run's own."""
    return (spec.source, spec.dtype, seed if spec.kind == "builtin" else None)


@dataclass
class _Held:
    model: Model | None = None
    tokenizer: Tokenizer | None = None
    users: int = 0
    loading: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class BaseLease:
    model: Model
    tokenizer: Tokenizer
    sharers: int  # runs holding this base when the lease began, this one included


class SharedBases:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[BaseKey, _Held] = {}

    @contextlib.contextmanager
    def lease(self, spec: ModelSpec, *, seed: int) -> Iterator[BaseLease]:
        """The base of ``spec`` for as long as the block runs (loaded if no run holds it)."""
        key = base_key(spec, seed=seed)
        with self._lock:
            held = self._held.setdefault(key, _Held())
            held.users += 1
            sharers = held.users
        try:
            with held.loading:  # the first user loads; the others wait for it
                if held.model is None:
                    held.model, held.tokenizer = load_model(spec, seed=seed)
            assert held.tokenizer is not None
            yield BaseLease(held.model, held.tokenizer, sharers)
        finally:
            with self._lock:
                held.users -= 1
                if held.users == 0:
                    del self._held[key]  # the last run ended: its memory is freed

    def holders(self) -> dict[BaseKey, int]:
        """Runs holding each base now."""
        with self._lock:
            return {key: held.users for key, held in self._held.items()}


__all__ = ["BaseLease", "SharedBases", "base_key"]
