"""TensorBoard event files, written with tensorboardX.

tensorboardX because it is the lightest well-kept writer: pure Python on numpy and
protobuf (both already in a worker), where TensorBoard's own writers need TensorFlow
or torch, and the ``tensorboard`` package (the viewer) is not needed to write.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_core.host.trackers.base import Outcome, StepMetrics


class TensorboardFiles:
    kind = "tensorboard"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._writer: Any = None

    def open(self) -> None:
        from tensorboardX import SummaryWriter

        self.folder.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(logdir=str(self.folder), flush_secs=30)

    def log(self, steps: Sequence[StepMetrics]) -> None:
        for step, metrics in steps:
            for name, value in metrics.items():
                self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()  # a batch on disk before the next: a killed worker loses less

    def close(self, outcome: Outcome) -> None:
        self._writer.close()


__all__ = ["TensorboardFiles"]
