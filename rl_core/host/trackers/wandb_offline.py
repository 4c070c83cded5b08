"""Weights & Biases in offline mode: a W&B run folder the user syncs later.

``wandb.init`` with ``mode="offline"`` writes the run's history to
``<folder>/wandb/offline-run-<time>-<id>/run-<id>.wandb`` and needs no network and
no API key; ``wandb sync <that folder>`` uploads it from any machine that has one.
The settings below keep W&B from touching the worker's process beyond its own run: no
console capture (it would wrap the worker's stdout), no system metrics sampler, no git
or code snapshot, no requirements scan, no crash reports sent. W&B's core process (one
per worker process, reused by its runs) keeps its own debug log under
``~/.cache/wandb/logs``.

`close` returns once the run's file is complete. wandb 0.31's ``finish`` does not
wait for that: its core holds the file's records in a buffer and writes them when it
closes the run's stream, which ``finish`` asks for last and does not wait on (seen: the
file held its 7-byte header alone after ``finish`` returned, on a loaded machine). So
`close` reads the file until the run's exit record is in it (`wandb_log.has_exit`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.host.trackers.base import Outcome, StepMetrics, TrackerError
from rl_core.host.trackers.wandb_log import has_exit


class WandbOffline:
    kind = "wandb"

    def __init__(
        self,
        folder: Path,
        *,
        project: str,
        run_id: str,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        write_timeout_s: float = 60.0,
    ) -> None:
        self.folder = folder
        self._project = project
        # W&B run ids may not hold / \ # ? % : ; one rlaas run is one W&B run id.
        self._id = re.sub(r"[^A-Za-z0-9_-]", "-", run_id)[:64]
        self._name = name or run_id
        self._config = dict(config or {})
        self._write_timeout_s = write_timeout_s  # for W&B's core to write the file
        self._run: Any = None

    def open(self) -> None:
        # W&B's core process reports its own crashes to W&B's Sentry unless told not to:
        # an offline run on a tenant's behalf sends nothing anywhere (an operator who
        # sets WANDB_ERROR_REPORTING keeps their choice). Read when the core starts.
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        import wandb

        self.folder.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            mode="offline",
            console="off",
            silent=True,
            save_code=False,
            disable_git=True,
            x_disable_stats=True,
            x_disable_meta=True,
            x_disable_machine_info=True,
        )
        self._run = wandb.init(
            project=self._project,
            name=self._name,
            id=self._id,
            dir=str(self.folder),
            config=self._config,
            settings=settings,
            reinit="create_new",  # one process trains many runs, one after another
        )

    def log(self, steps: Sequence[StepMetrics]) -> None:
        for step, metrics in steps:
            self._run.log(dict(metrics), step=step)

    def close(self, outcome: Outcome) -> None:
        log_file = Path(self._run.settings.sync_file)
        self._run.finish(exit_code=0 if outcome == "succeeded" else 1)
        deadline = time.monotonic() + self._write_timeout_s
        pause = 0.02
        while not has_exit(log_file):
            if time.monotonic() > deadline:
                raise TrackerError(
                    f"W&B's core did not write the run's file {log_file} within "
                    f"{self._write_timeout_s:.0f} s of the run's end"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


__all__ = ["WandbOffline"]
