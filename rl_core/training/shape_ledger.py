"""Which train-step shapes a trainer has compiled, and when a new one is worth compiling.

Packing, the head's index width and the quarter-octave length buckets each cut a step's
positions, and each multiplies the shapes a run meets: a step whose batch needs 6 bins
where the last needed 4, or a length of 320 where the last was 512, is a new program.
On B12's long-tail run (builtin:tiny, 2026-12-07) a steady step took 0.1 s and a step
with a new shape 0.8-1.4 s (tracing and lowering, then XLA's compile or the persistent
cache's read): a quarter of the measured steps met one, and the run's mean train step
was three times its median. A bigger model compiles for tens of seconds.

A step whose own shape is new can usually run in a shape already compiled that holds it
(more bins, a wider head index, a longer length: padding, which changes no number the
loss reads), at the price of the extra positions. This is a ski-rental problem: rent
(pad into a compiled shape) until the padding paid since the last compile would reach
the price of one, then buy (compile the step's own shape). So padding never costs more
than the compiles did, plus one compile's price, whatever shapes the run's future holds;
and a run whose shapes settle stops compiling. Both prices are measured by the trainer
on its own steps: seconds per position from steps that compiled nothing, the compile
from steps that met a new shape.

The rent is one pool, not one per shape: a long-tail run meets many shapes each a few
times, and rent kept per shape would never reach a price while the padding, summed over
them, grew without bound. A compile no compiled shape could have spared (the step's
rows outgrew them all) is made wide enough to hold every compiled shape of its layout
and length too, so the next mix of widths is held rather than new again.

Pure bookkeeping: no JAX here. `Trainer` asks `choose` for a step's shape among the
natural shapes at the lengths it may pad to, runs the step in it and tells `record`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Sequence

# Steps remembered for each price: recent steps, so a model that warms up (its rows
# grow) or a machine whose load changes is followed, and one noisy step moves nothing.
WINDOW = 16


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What fixes a step's compiled programs (besides the model and the trainer's
    settings): the layout, its row length, its update's rows (plain: a mini-batch's
    rows; packed: its bins), the head's index width, and the scoring pass's rows and
    width (0: no scoring pass; plain scoring reads the update's width). A prefix-shared
    step ("shared") is its layouts' shapes, ``detail``, held by no other, and is priced
    at ``work``: its positions weighted as `Trainer` weighs them against packing's."""

    kind: str  # "plain" | "packed" | "shared"
    length: int  # T: tokens a row (a bin) holds
    rows: int  # rows (bins) of each update
    head: int  # K: the head's index width (0: the head at every position)
    score_packed: bool = False  # the scoring pass packed (else row by row)
    score_rows: int = 0  # rows (bins) of the scoring pass over the whole batch; 0: none
    score_head: int = 0  # its head width (packed scoring computes its own)
    detail: tuple[int, ...] = ()  # shared: each layout's slots, width, prefix shape
    work: int = 0  # shared: its weighted positions (else computed from the fields)

    def holds(self, other: StepShape) -> bool:
        """Whether ``other``'s step can run in this shape: the same layout and length,
        nothing of it narrower."""
        return (
            self.kind == other.kind
            and self.length == other.length
            and self.score_packed == other.score_packed
            and self.detail == other.detail
            and self.rows >= other.rows
            and self.head >= other.head
            and self.score_rows >= other.score_rows
            and self.score_head >= other.score_head
        )

    def positions(self, updates: int) -> int:
        """Positions a step computes in this shape, ``updates`` optimiser updates: each
        update's and the scoring pass's trunk positions, and the head's (the cost model
        `ShapeLedger` prices; a head position costs a vocabulary-wide matmul, counted as one)."""
        if self.work:
            return self.work
        head = self.head if self.head else self.length
        score_head = self.score_head or (self.head if self.head else self.length)
        update = self.rows * (self.length + head)
        return updates * update + self.score_rows * (self.length + score_head)


@dataclasses.dataclass(frozen=True)
class Choice:
    """A step's shape: ``natural`` (the one it needs at the length it runs at) run as
    ``run`` (itself, or a compiled shape that holds it); ``own``: its shape at its
    batch's own length."""

    own: StepShape
    natural: StepShape
    run: StepShape


class ShapeLedger:
    """The compiled shapes, both prices, and the padding paid since the last compile.

    ``updates``: optimiser updates a step (mini-batches x epochs), for the cost model.
    """

    def __init__(self, updates: int) -> None:
        self.updates = updates
        self.compiled: set[StepShape] = set()
        self.rent = 0.0  # seconds of padding paid since the last compile
        self._per_position: deque[float] = deque(maxlen=WINDOW)  # seconds
        self._compiles: deque[tuple[float, int]] = deque(maxlen=WINDOW)  # seconds, positions
        self.padded_steps = 0  # steps run in a compiled shape other than their own

    def prices(self) -> tuple[float, float] | None:
        """(seconds a position, seconds a compile), once both are measured; None before."""
        if not self._per_position or not self._compiles:
            return None
        per = statistics.median(self._per_position)
        compile_s = statistics.median(
            max(seconds - per * positions, 0.0) for seconds, positions in self._compiles
        )
        return per, compile_s

    def choose(self, naturals: Sequence[StepShape]) -> Choice:
        """The shape to run a step in. ``naturals``: the step's own shape at each length
        it may take (its batch's, then longer compiled ones), the first its own length's.

        Until both prices are measured, a new shape is compiled (as without a ledger).
        Else the cheapest compiled shape that holds one of them is rented while the
        padding paid since the last compile, its own extra included, stays under the
        price of a compile; at that step the cheapest new one is compiled."""
        if not naturals:
            raise ValueError("a step needs at least one shape to choose from")
        units, own = self.updates, naturals[0]
        best_new = min(naturals, key=lambda s: s.positions(units))
        held = [(c, n) for n in naturals for c in self.compiled if c.holds(n)]
        if not held:  # a compile it must be: one that holds what came before it too
            return Choice(own, best_new, self._envelope(best_new))
        rented, natural = min(held, key=lambda pair: pair[0].positions(units))
        new_cost = best_new.positions(units)
        if best_new in self.compiled or rented.positions(units) <= new_cost:
            return Choice(own, natural, rented)
        prices = self.prices()
        if prices is None:
            return Choice(own, best_new, best_new)
        per, compile_s = prices
        extra = per * (rented.positions(units) - new_cost)
        if self.rent + extra >= compile_s:
            return Choice(own, best_new, best_new)
        self.rent += extra
        return Choice(own, natural, rented)

    def _envelope(self, shape: StepShape) -> StepShape:
        """``shape`` widened to hold every compiled shape of its layout and length: a
        compile that none holds is the run's rows, bins or widths outgrowing what it
        compiled, and the next step's mix of them would be new again (B12u's batches
        grow more bins in one step and a wider head in the next)."""
        out = shape
        for c in self.compiled:
            if dataclasses.replace(c, rows=0, head=0, score_rows=0, score_head=0) == (
                dataclasses.replace(shape, rows=0, head=0, score_rows=0, score_head=0)
            ):
                out = dataclasses.replace(
                    out,
                    rows=max(out.rows, c.rows),
                    head=max(out.head, c.head),
                    score_rows=max(out.score_rows, c.score_rows),
                    score_head=max(out.score_head, c.score_head),
                )
        return out

    def record(self, choice: Choice, seconds: float) -> None:
        """The step's wall time in ``choice.run``: a price sample of either kind."""
        positions = choice.run.positions(self.updates)
        if choice.run in self.compiled:
            self._per_position.append(seconds / max(positions, 1))
            if choice.run != choice.own:
                self.padded_steps += 1
            return
        self.compiled.add(choice.run)
        self.rent = 0.0
        self._compiles.append((seconds, positions))


__all__ = ["Choice", "ShapeLedger", "StepShape"]
