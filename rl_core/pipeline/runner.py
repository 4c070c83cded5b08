"""Run a whole training job from its spec: the entry point of the worker and the CLI.

`train` builds the parts a spec names (environment, model and tokenizer,
device thread, rollout engine, trainer, agent, collector) and runs the
pipeline of `rl_core.pipeline.pipeline` on its own event loop until
``train.steps`` steps are done or the host asks it to stop.

Importing this module starts no JAX (the CLI imports it for ``--help``); the
heavy parts are imported inside `train`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_core.errors import UnsupportedSpec
from rl_core.host.control import RunControl
from rl_core.host.sinks import RunSink
from rl_core.pipeline.result import TrainResult
from rl_core.spec import SESSIONS, JobSpec

if TYPE_CHECKING:
    from rl_core.envs.walls import WallPolicy
    from rl_core.host.trackers.base import Outcome
    from rl_core.pipeline.colocation import Colocation
    from rl_core.pipeline.hosted import StartHosts
    from rl_core.training.stored import StoreTarget

log = logging.getLogger(__name__)


def train(
    spec: JobSpec,
    *,
    sink: RunSink,
    control: RunControl | None = None,
    artifacts_dir: Path | None = None,
    resume_from: str | None = None,
    episode_prefix: str = "",
    webhooks: Mapping[str, Any] | None = None,
    callbacks: Any = None,
    gateway: Callable[[Any], contextlib.AbstractAsyncContextManager[Any]] | None = None,
    walls: WallPolicy | None = None,
    store: StoreTarget | None = None,
    colocation: Colocation | None = None,
    trainer_hosts: StartHosts | None = None,
) -> TrainResult:
    """Train ``spec`` to ``train.steps`` steps, reporting to ``sink``; see the module docstring.

    ``control`` is the host's handle (stop at a step boundary, profile, read
    what is in flight). ``artifacts_dir`` receives checkpoints (by time by default,
    `rl_core.pipeline.cadence`; at the end and on a stop) and profiles.
    ``resume_from`` is a checkpoint written by an earlier attempt: the run
    continues after its step, with the collector where it stood. Episode ids
    are ``f"{episode_prefix}g<task>-e<member>"``. ``webhooks``/``callbacks``
    reach `rl_core.envs.build_environment` for ``env_<id>`` environments.
    ``gateway`` serves a ``sessions`` run's `rl_core.sessions.broker.SessionBroker` to
    clients (an HTTP server, which rl_core does not have) on the run's own event loop,
    for as long as the run lasts. ``walls``: whether tenant code may run behind a sandbox
    wall weaker than bubblewrap (`rl_core.envs.walls`; None: a single-user machine's
    policy, a warning; a deployed worker passes its own). ``store``: the artifact store
    (`rl_core.training.stored.StoreTarget`) the checkpoints and exports are uploaded to,
    ``artifacts_dir`` then being a cache; a ``resume_from`` missing there is downloaded.
    ``colocation``: what the runs of a process that hosts several share (their base
    model, turns on the device; `rl_core.pipeline.colocation`), the same object for each.
    ``trainer_hosts`` starts the trainer processes of a run with ``resources.hosts`` > 1
    (`rl_core.pipeline.hosted`; a worker's are Ray actors); None: such a run is refused.

    Must be called from synchronous code (it runs its own event loop).
    """
    _check_supported(spec, gateway)
    # Imported here: importing rl_core.pipeline.runner must not start JAX.
    from rl_core.pipeline.build import build_pipeline

    control = control or RunControl()
    pipeline, close = build_pipeline(
        spec,
        sink=sink,
        control=control,
        artifacts_dir=artifacts_dir,
        resume_from=resume_from,
        episode_prefix=episode_prefix,
        webhooks=webhooks,
        callbacks=callbacks,
        walls=walls,
        store=store,
        colocation=colocation,
        trainer_hosts=trainer_hosts,
    )

    async def run() -> TrainResult:
        if pipeline.sessions is None or gateway is None:
            return await pipeline.run()
        async with gateway(pipeline.sessions):
            return await pipeline.run()

    try:
        return asyncio.run(run())
    finally:
        close()


def train_to_folder(
    spec: JobSpec,
    out: Path,
    *,
    resume: bool = False,
    gateway: Callable[[Any], contextlib.AbstractAsyncContextManager[Any]] | None = None,
) -> TrainResult:
    """`train` with the files of ``rlaas train --out DIR`` (`rl_core.pipeline.files.RunFiles`).

    Checkpoints go to ``out/checkpoints``; ``resume`` continues from the newest.
    The spec's trackers (docs/trackers.md) get the metrics too, their files under
    ``out/trackers``; on one's own machine an MLflow server may be anywhere.
    The first Ctrl-C asks for a stop at the next step boundary (with a final
    checkpoint); a second one interrupts at once.
    """
    import signal

    from rl_core.host.trackers.build import build_trackers
    from rl_core.host.trackers.mirror import MirroredSink, TrackerMirror
    from rl_core.pipeline.files import RunFiles

    out = Path(out)
    resume_from = None
    if resume:
        from rl_core.training.checkpointing import latest_checkpoint

        newest = latest_checkpoint(out)
        resume_from = newest.uri if newest else None
    files = RunFiles(out, append=resume_from is not None)
    trackers = build_trackers(spec, run_id=out.resolve().name, run_dir=out, allowlist=None)
    mirror = TrackerMirror(trackers)
    sink = MirroredSink(files, mirror) if trackers else files
    control = RunControl()

    def on_interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, previous)
        log.warning("stopping at the next step boundary (Ctrl-C again to interrupt)")
        control.request_stop()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    outcome: Outcome = "failed"
    try:
        result = train(
            spec,
            sink=sink,
            control=control,
            artifacts_dir=out,
            resume_from=resume_from,
            gateway=gateway,
            # On one's own machine a multi-host spec's trainer processes are children of
            # this one (no cluster engine): rl_core.training.local_hosts.
            trainer_hosts=start_local_hosts,
        )
        outcome = "cancelled" if result.stopped_early else "succeeded"
        return result
    finally:
        signal.signal(signal.SIGINT, previous)
        final = mirror.close(outcome)
        if any(final.values()):
            log.warning("trackers: %s", final)
        files.close()


def start_local_hosts(count: int, factory: Callable[[Any], Any]) -> Any:
    """K trainer processes spawned by this one (`rl_core.training.local_hosts`)."""
    from rl_core.training.local_hosts import LocalHosts

    return LocalHosts(count, factory)


def _check_supported(spec: JobSpec, gateway: object) -> None:
    if spec.environment.name == SESSIONS and gateway is None:
        raise UnsupportedSpec(
            "environment.name",
            "'sessions' runs need a session gateway for clients to reach: run them with "
            "`rlaas train`, which serves one",
        )
    if spec.agent.chat_template != "model":
        raise UnsupportedSpec("agent.chat_template", "only the model's own template ('model')")


__all__ = ["TrainResult", "train", "train_to_folder"]
