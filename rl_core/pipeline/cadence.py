"""When the pipeline writes a checkpoint between steps: every N steps, or by time.

A run on preemptible workers loses what it trained since its last checkpoint when its
worker is taken away, so by default a run checkpoints by time: often enough that a
preemption costs little, rarely enough that checkpoints cost little. The interval comes
from the checkpoint's own measured cost::

    interval_s = clamp(cost_s / AUTO_COST_FRACTION, AUTO_FLOOR_S, AUTO_CEILING_S)

so writing checkpoints takes at most ``AUTO_COST_FRACTION`` of the run's wall time (the
floor bounds how often a cheap one is written, the ceiling how much a preemption can
lose). The cost is measured, not guessed: each attempt (each worker, whose disk and
accelerator may differ from the last one's) writes its first checkpoint right after its
first step, and times it. A spec can set the interval instead, in steps
(``train.checkpoint_interval``) or seconds (``train.checkpoint_every_s``, counted from
the end of the attempt's first step: its time is mostly compiling, which no checkpoint
saves).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

# Checkpoints take at most 2% of a run's wall time when the auto interval is above its floor.
AUTO_COST_FRACTION = 0.02
# A checkpoint of the tiny model costs 0.45-0.75 s on two busy cores (50x: 23-38 s), less on
# an idle machine: the floor bounds how many such folders a run writes (every checkpoint is
# kept), and is still short next to a worker's start.
AUTO_FLOOR_S = 10.0
# A model whose checkpoint costs 20 s or more is checkpointed every 15 minutes: the most a
# preemption can take from it, whatever the cost.
AUTO_CEILING_S = 900.0


def auto_interval_s(
    cost_s: float,
    *,
    fraction: float = AUTO_COST_FRACTION,
    floor_s: float = AUTO_FLOOR_S,
    ceiling_s: float = AUTO_CEILING_S,
) -> float:
    """Seconds between checkpoints that cost ``cost_s`` each: ``cost_s / fraction``,
    clamped to [``floor_s``, ``ceiling_s``]."""
    return min(max(cost_s / fraction, floor_s), ceiling_s)


@dataclasses.dataclass
class CheckpointCadence:
    """Says at each step boundary whether a checkpoint is due.

    ``every_steps`` > 0: every that many steps (the spec's ``checkpoint_interval``); 0 with
    ``every_s`` None: only at the end (and on a stop). Otherwise by time: ``every_s``
    seconds after the last checkpoint (or the start), or, when ``every_s`` is None, the
    auto interval of the last checkpoint's measured cost.
    """

    every_steps: int = 0
    every_s: float | None = None
    auto: bool = False
    clock: Callable[[], float] = time.monotonic
    _since: float = dataclasses.field(init=False)
    _interval_s: float = dataclasses.field(init=False)
    _first: bool = dataclasses.field(init=False, default=True)

    def __post_init__(self) -> None:
        self._since = self.clock()
        self._interval_s = self.every_s if self.every_s is not None else AUTO_FLOOR_S

    @property
    def by_time(self) -> bool:
        return self.every_steps == 0 and (self.auto or self.every_s is not None)

    @property
    def interval_s(self) -> float | None:
        """The seconds between time-based checkpoints now; None when counted in steps."""
        return self._interval_s if self.by_time else None

    def due(self, step: int) -> bool:
        """Asked once at the end of each step of the attempt."""
        if self.every_steps:
            return step % self.every_steps == 0
        if not self.by_time:
            return False
        if self._first:  # the attempt's first step
            self._first = False
            if self.every_s is None:
                return True  # auto: write one now, to measure what one costs here
            self._since = self.clock()  # seconds: counted from here, not from the compile
            return False
        return self.clock() - self._since >= self._interval_s

    def saved(self, cost_s: float) -> None:
        """A checkpoint was written, costing ``cost_s``: the next interval starts now."""
        self._since = self.clock()
        if self.auto and self.every_s is None:
            self._interval_s = auto_interval_s(cost_s)


__all__ = ["AUTO_CEILING_S", "AUTO_COST_FRACTION", "AUTO_FLOOR_S", "CheckpointCadence"]
