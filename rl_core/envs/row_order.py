"""The order of a ``dataset`` environment's rows: how many are held out, and which row a
training task plays (the same rule for a file's rows and a procedural source's)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from rl_core.errors import EnvironmentFailure
from rl_core.protocol.datasets import DatasetConfig, Split


def held_out(split: Split, rows: int) -> int:
    """How many of ``rows`` rows ``split`` holds out: its ``size``, or its share (at least
    one when the share is above 0)."""
    if split.size is not None:
        return split.size
    share = split.eval or 0.0
    return max(1 if share > 0 else 0, round(rows * share))


class EpochOrder:
    """The order of a train split's rows: training task ``t`` plays position ``t mod n``
    of epoch ``t div n``, a permutation seeded by (``seed``, epoch) (the rows' own order
    without ``shuffle``)."""

    def __init__(self, train: Sequence[int]) -> None:
        self.train = train
        self._orders: dict[int, list[int]] = {}

    def row(self, task: int, cfg: DatasetConfig) -> int:
        epoch, position = divmod(task, len(self.train))
        if cfg.epochs is not None and epoch >= cfg.epochs:
            raise EnvironmentFailure(
                f"dataset: all {cfg.epochs} epochs of {len(self.train)} rows are played "
                f"(task {task}); ask for fewer train.steps or more epochs"
            )
        if not cfg.shuffle:
            return self.train[position]
        order = self._orders.get(epoch)
        if order is None:
            order = list(self.train)
            random.Random(f"{cfg.seed}:epoch:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # one epoch at a time: tasks run near in order
        return order[position]


def held_out_row(rows: Sequence[int], index: int) -> int:
    """The eval split's row that held-out episode ``index`` plays; never a training row:
    a held-out figure measured on trained rows would flatter."""
    if not rows:
        raise EnvironmentFailure(
            "dataset: held-out episodes play the eval split's rows and this config "
            "holds none out; give split (e.g. {eval: 0.05}) or set train.eval_interval to 0"
        )
    return rows[index % len(rows)]


__all__ = ["EpochOrder", "held_out", "held_out_row"]
