"""TensorBoard event files, written with tensorboardX.

tensorboardX because it is the lightest well-kept writer: pure Python on numpy and
protobuf (both already in a worker), where TensorBoard's own writers need TensorFlow
or torch, and the ``tensorboard`` package (the viewer) is not needed to write.

With an artifact store the folder is copied there (`rl_core.store.mirror.FolderMirror`)
at most every ``upload_every_s`` and when the run ends, on this tracker's own thread, so
the files outlive the worker's disk and the API can hand them to the tenant. A failed
upload is logged and tried again at the next; it never fails the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rl_core.host.trackers.base import Outcome, StepMetrics
from rl_core.store.base import StoreError
from rl_core.store.mirror import FolderMirror

log = logging.getLogger(__name__)

UPLOAD_EVERY_S = 60.0


class TensorboardFiles:
    kind = "tensorboard"

    def __init__(
        self,
        folder: Path,
        *,
        mirror: FolderMirror | None = None,
        upload_every_s: float = UPLOAD_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder = folder
        self.mirror, self.upload_every_s, self.clock = mirror, upload_every_s, clock
        self.upload_errors = 0
        self._writer: Any = None
        self._synced_at: float | None = None

    def open(self) -> None:
        from tensorboardX import SummaryWriter

        self.folder.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(logdir=str(self.folder), flush_secs=30)

    def log(self, steps: Sequence[StepMetrics]) -> None:
        for step, metrics in steps:
            for name, value in metrics.items():
                self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()  # a batch on disk before the next: a killed worker loses less
        due = self._synced_at is None or self.clock() - self._synced_at >= self.upload_every_s
        if due:
            self._sync()

    def close(self, outcome: Outcome) -> None:
        self._writer.close()
        self._sync()

    def _sync(self) -> None:
        if self.mirror is None:
            return
        self._synced_at = self.clock()
        try:
            self.mirror.sync(self.folder)
        except StoreError as exc:
            self.upload_errors += 1
            log.warning("tensorboard files not copied to the store (tried again later): %s", exc)


__all__ = ["TensorboardFiles"]
