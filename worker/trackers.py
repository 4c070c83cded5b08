"""A run's metrics mirrored to the trackers its spec names (docs/trackers.md).

The mirror itself is rl_core's (`rl_core.host.trackers.mirror`): a bounded queue and a
thread per tracker, fed by the sink the pipeline reports to. Here the worker decides
where its files go (``<artifacts>/<run>/trackers``, and TensorBoard's to the artifact
store's ``<run>/trackers/tensorboard`` too when there is one), where an MLflow server may be
(``RLAAS_ENV_URL_ALLOWLIST``, as for webhook environments), how long the end of a run
waits for its trackers, and reports their final counters as points of the last step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from worker.settings import WorkerSettings
from worker.sinks import HttpRunSink

if TYPE_CHECKING:
    from rl_core.host.sinks import RunSink
    from rl_core.host.trackers.base import Outcome
    from rl_core.host.trackers.mirror import MirroredSink
    from rl_core.spec import JobSpec
    from rl_core.training.stored import StoreTarget

log = logging.getLogger(__name__)


class RunTrackers:
    """The trackers of one run: `sink` is what the pipeline reports to."""

    def __init__(
        self,
        spec: JobSpec,
        run_id: str,
        settings: WorkerSettings,
        inner: HttpRunSink,
        store: StoreTarget | None = None,
    ) -> None:
        from rl_core.host.trackers.build import build_trackers
        from rl_core.host.trackers.mirror import MirrorConfig, MirroredSink, TrackerMirror

        self._inner = inner
        self._mirrored: MirroredSink | None = None
        trackers = build_trackers(
            spec,
            run_id=run_id,
            run_dir=settings.artifacts_dir() / run_id,
            allowlist=settings.env_allowlist(),
            store=store.store if store is not None else None,
            store_prefix=store.prefix if store is not None else run_id,
        )
        if trackers:
            config = MirrorConfig(close_timeout_s=settings.tracker_close_seconds)
            self._mirrored = MirroredSink(inner, TrackerMirror(trackers, config))

    @property
    def sink(self) -> RunSink:
        return self._mirrored or self._inner

    def close(self, outcome: Outcome) -> None:
        """End each tracker's run, waiting at most ``RLAAS_TRACKER_CLOSE_SECONDS``, and
        report the final counters with the last step's metrics."""
        if self._mirrored is None:
            return
        final = self._mirrored.mirror.close(outcome)
        if self._mirrored.last_step is not None:
            self._inner.add_points(self._mirrored.last_step, final)
        missed = {k: v for k, v in final.items() if k.endswith(("/dropped", "/errors")) and v}
        if missed:
            log.warning("trackers of this run missed steps or failed calls: %s", missed)
