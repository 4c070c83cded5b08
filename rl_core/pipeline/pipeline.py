"""The pipeline: collector, queue and trainer wired together, in ``async`` or ``sync`` mode.

One step, as the trainer sees it::

    queue_wait   take B groups from the queue (staleness gate applied; with dynamic
                 sampling, groups of equal rewards dropped and replaced: dynamic.py)
    train_step   pack them and update the policy, in the device thread
    weight_sync  snapshot the new weights and hand them to the engine as version = step
    report       sink.on_step / on_spans / on_trajectories; checkpoint every N steps
    eval         every ``eval_interval`` steps, once before the first and after the
                 last: the held-out episodes of `rl_core.pipeline.evaluate`, whose
                 ``eval/`` metrics join that step's (step 0's stand alone)

In ``async`` mode the collector runs all the while: episodes of the next
steps are being played while the trainer computes, up to what
``staleness.max_staleness`` allows (`rl_core.pipeline.queue`). ``sync`` mode is
the classic baseline: the collector plays exactly one batch with the current
policy, the trainer waits for all of it, then trains; implemented as the same
parts with the staleness bound forced to 0, which is what admission control
then makes of it (no group starts before the policy it will be trained
against exists).

Everything below runs on one event loop; device work (engine batches, train
steps, weight snapshots, checkpoints) runs in the `DeviceThread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rl_core.agent.ledger import Trajectory
from rl_core.errors import EnvironmentFailure, NoTrajectories
from rl_core.host.control import RunControl
from rl_core.host.sinks import RunSink
from rl_core.host.telemetry import Profiler, SpanRecorder
from rl_core.models.tokenizer import Tokenizer
from rl_core.pipeline.cadence import CheckpointCadence
from rl_core.pipeline.collector import Collector
from rl_core.pipeline.device import DeviceThread
from rl_core.pipeline.dynamic import EqualRewardScreen
from rl_core.pipeline.metrics import Readings, StepMeter
from rl_core.pipeline.queue import Admission, Group, GroupQueue
from rl_core.pipeline.reported import trained_records, untrained_records
from rl_core.pipeline.result import TrainResult
from rl_core.records import CheckpointRecord, InflightEpisode, InflightSnapshot

log = logging.getLogger(__name__)

INFLIGHT_INTERVAL_S = 1.0
LAG_INTERVAL_S = 0.05
STOP_POLL_S = 0.25
INFLIGHT_EPISODES_MAX = 200
ENV_CLOSE_TIMEOUT_S = 10.0


class TrainerLike(Protocol):
    def train_step(self, batch: Any) -> dict[str, float]: ...

    def params(self) -> Any: ...


class Checkpointer(Protocol):
    def save(self, step: int, extra: Mapping[str, Any]) -> CheckpointRecord: ...


class EvaluatorLike(Protocol):
    async def run(self, step: int) -> dict[str, float]: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    steps: int
    batch_groups: int
    group_size: int
    mode: str = "async"
    max_staleness: int = 1
    concurrency: int = 64  # episodes in flight at most (rollout.concurrency)
    stale_policy: str = "drop"
    # Checkpoints between steps (rl_core.pipeline.cadence): every `checkpoint_interval`
    # steps; else every `checkpoint_every_s` seconds; else, with `checkpoint_auto`, by time
    # at an interval from the checkpoint's measured cost; else only at the end.
    checkpoint_interval: int = 0
    checkpoint_every_s: float | None = None
    checkpoint_auto: bool = False
    eval_interval: int = 0
    trajectories_per_step: int = 4
    # Dynamic sampling (rl_core.pipeline.dynamic): drop groups whose rewards are all equal,
    # at most `max_dropped_equal` a step; `turn_credit` says what "equal" compares.
    drop_equal_groups: bool = False
    max_dropped_equal: int = 0
    turn_credit: bool = False


class Pipeline:
    def __init__(
        self,
        *,
        config: PipelineConfig,
        collector_factory: Callable[[Admission, GroupQueue], Collector],
        engine: Any,
        trainer: TrainerLike,
        build_batch: Callable[[list[Group]], Any],
        snapshot: Callable[[Any], Any],
        tokenizer: Tokenizer,
        device: DeviceThread,
        recorder: SpanRecorder,
        sink: RunSink,
        control: RunControl,
        profiler: Profiler,
        checkpointer: Checkpointer | None = None,
        evaluator: EvaluatorLike | None = None,
        start_step: int = 0,
        sessions: Any = None,
        policy_weights: Callable[[], Any] | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.trainer = trainer
        self.build_batch = build_batch
        self.snapshot = snapshot
        # What the engine is given after each update: the trainer's weights, snapshotted;
        # on a shared base, the trainer's adapters alone (rl_core.rollout.adapter_policy).
        self.policy_weights = policy_weights or (lambda: self.snapshot(self.trainer.params()))
        self.tokenizer = tokenizer
        self.device = device
        self.recorder = recorder
        self.sink = sink
        self.control = control
        self.profiler = profiler
        self.checkpointer = checkpointer
        self.evaluator = evaluator
        self.start_step = start_step
        # A run whose clients play the episodes: the `SessionBroker` the host serves them
        # through (rl_core.sessions.broker); None for environments the agent plays.
        self.sessions = sessions
        sync = config.mode == "sync"
        bound = 0 if sync else config.max_staleness
        self.screen = (
            EqualRewardScreen(max_dropped=config.max_dropped_equal, turn_credit=config.turn_credit)
            if config.drop_equal_groups
            else None
        )
        self.admission = Admission(
            batch_groups=config.batch_groups,
            max_staleness=bound,
            version=start_step,
            # Async: admission by episode, up to `concurrency` unfinished (see queue.py).
            episodes=None if sync else config.concurrency,
            group_size=config.group_size,
        )
        self.queue = GroupQueue(
            admission=self.admission,
            policy="requeue" if config.stale_policy == "requeue" else "drop",
            requeue=lambda task: self.collector.requeue(task),
            # Admission keeps at most max(M, 1) batches waiting when a group may start;
            # the groups in flight then may all finish before the trainer takes one.
            maxsize=(max(bound, 1) + 1) * config.batch_groups + config.concurrency,
            screen=self.screen,
        )
        self.collector = collector_factory(self.admission, self.queue)
        self.trainer_state, self.trainer_since = "idle", time.monotonic()
        self.step = start_step
        self._lags: list[float] = []
        self._saved_step = start_step  # a resumed run's own checkpoint is not written again
        self.cadence = CheckpointCadence(
            every_steps=config.checkpoint_interval,
            every_s=config.checkpoint_every_s,
            auto=config.checkpoint_auto,
        )

    # --- the run ---------------------------------------------------------------

    async def run(self) -> TrainResult:
        self.engine.update_weights(
            await self.device.run_trainer(self.policy_weights),
            version=self.start_step,
        )
        serving = getattr(self.engine, "serving", None)
        ended = "failed"
        try:
            # The engine serves (batches requests) for as long as episodes may ask.
            async with (
                serving() if serving else contextlib.nullcontext(),
                asyncio.TaskGroup() as tg,
            ):
                helpers = [
                    tg.create_task(self.collector.run(), name="collector"),
                    tg.create_task(self._publish_inflight(), name="inflight"),
                    tg.create_task(self._watch_lag(), name="loop-lag"),
                ]
                try:
                    result = await self._train_loop()
                    ended = "was stopped" if result.stopped_early else "finished its steps"
                finally:
                    for task in helpers:
                        task.cancel()
        except ExceptionGroup as group:
            # Raise the first cause itself, so the run's error reads as what went wrong.
            cause = _first_leaf(group)
            ended = f"failed ({type(cause).__name__})"
            raise cause from group
        finally:
            if self.sessions is not None:
                self.sessions.close(ended)  # clients still in a session are told so
            self._report_cancelled()
            await self._close_environment()
        self.profiler.stop()
        return result

    async def _close_environment(self) -> None:
        """Close the environment's connections in the loop that opened them (webhooks)."""
        aclose = getattr(getattr(self.collector, "env", None), "aclose", None)
        if aclose is None:
            return
        try:
            async with asyncio.timeout(ENV_CLOSE_TIMEOUT_S):
                await aclose()
        except Exception as exc:  # the run's outcome is already decided; closing is tidy-up
            log.warning("closing the environment failed: %s: %s", type(exc).__name__, exc)

    def _env_metrics(self) -> dict[str, float]:
        """The environment's own ``env/`` metrics, for one that keeps some (a webhook's
        faults, concurrency limit and breaker: `WebhookEnvironment.step_metrics`)."""
        step_metrics = getattr(getattr(self.collector, "env", None), "step_metrics", None)
        return step_metrics() if step_metrics is not None else {}

    async def _train_loop(self) -> TrainResult:
        cfg = self.config
        meter = StepMeter(self._readings(), turn_credit=cfg.turn_credit)
        done, final, stopped = 0, {}, False
        if self.start_step == 0 and self._eval_due(0):
            self.sink.on_step(0, await self._evaluate(0))
        for step in range(self.start_step + 1, cfg.steps + 1):
            if self.control.stop_requested:
                stopped = True
                break
            self.step = self.device.step = step
            self.profiler.begin_step(step, self.control.take_profile_request())
            started = time.perf_counter()
            groups, waited = await self._gather(step)
            if groups is None:
                stopped = True
                break
            dropped = self.screen.drain() if self.screen is not None else []
            metrics, busy, blocked = await self._train(step, groups)
            if self.control.aborted:  # the run is not this host's any more: not a word more
                stopped = True
                break
            finished = self.collector.drain_finished()
            if self.sessions is not None:  # sessions its clients failed, slots offered again
                finished += self.sessions.drain_faulted()
            self.admission.set_version(step)  # only now may groups of the new policy start
            self.profiler.end_step()
            wall = time.perf_counter() - started
            final = meter.measure(
                groups=groups,
                finished=finished,
                staleness=self.queue.drain_staleness(),
                max_staleness=self.admission.max_staleness,
                train=metrics,
                readings=self._readings(),
                wall_s=wall,
                trainer_busy_s=busy,
                trainer_blocked_s=waited + blocked,
                queue_depth=self.queue.depth,
                lag_s=self._take_lags(),
                policy_version=step,
                dropped_equal=dropped,
            )
            if self.sessions is not None:
                final.update(self.sessions.step_metrics())
            final.update(self._env_metrics())
            if self._eval_due(step):
                final.update(await self._evaluate(step))
            self._report(step, final, groups, finished, dropped)
            done += 1
            log.info("step %d: reward %.3f (%.2fs)", step, final["reward/mean"], wall)
            if self.cadence.due(step) and not self.control.aborted:
                await self._checkpoint(step)
        last = self.start_step + done
        if (last > self.start_step or stopped) and not self.control.aborted:
            await self._checkpoint(last)
        self._set_trainer("idle")
        return TrainResult(steps_completed=done, stopped_early=stopped, final_metrics=final)

    async def _gather(self, step: int) -> tuple[list[Group] | None, float]:
        """B groups' worth of episodes for this step (B groups, unless some came in two
        parts), or None when a stop arrives first (they are given back)."""
        self._set_trainer("waiting_for_trajectories")
        groups: list[Group] = []
        wanted = self.config.batch_groups * self.config.group_size
        failed_before = self.collector.dropped_groups
        if self.screen is not None:
            self.screen.begin_step()
        started = time.perf_counter()
        with self.recorder.span("queue_wait", track="trainer", step=step) as args:
            while sum(g.members for g in groups) < wanted:
                try:
                    # Not asyncio.wait_for: on Python 3.11 it returns the group when the
                    # group and a cancel (the TaskGroup's, as the collector fails) arrive
                    # together, and the cancel is lost: the run then waited for groups
                    # forever (seen when a failure budget ran out mid-step).
                    async with asyncio.timeout(STOP_POLL_S):
                        groups.append(await self.queue.take())
                except TimeoutError:
                    if self.control.stop_requested:
                        self.admission.unconsume(groups)
                        self.collector.unconsume([g.task for g in groups])
                        args["stopped"] = True
                        return None, time.perf_counter() - started
                    self._check_stall(self.collector.dropped_groups - failed_before)
            args["groups"] = len(groups)
        if self.screen is not None and self.screen.capped:
            log.warning(
                "step %d: dynamic sampling dropped %d groups of equal rewards, its cap "
                "(algorithm.dynamic_sampling.max_dropped_groups); the step trains the groups "
                "that came after as they are, equal ones included (groups/trained_equal)",
                step,
                self.screen.max_dropped,
            )
        return groups, time.perf_counter() - started

    def _check_stall(self, failed_groups: int) -> None:
        # A step that has lost twice its batch to failures is not going to
        # recover by waiting: the environment (or the engine) is broken.
        if failed_groups < 2 * self.config.batch_groups:
            return
        error = self.collector.first_error
        if error:
            raise EnvironmentFailure(
                f"step {self.step}: {failed_groups} groups lost to failed episodes; first: {error}"
            )
        if self.sessions is not None:
            # Clients' cancels and timeouts are offered again and budgeted by the broker
            # (rollout.client_fault_budget): what is left is groups never filled.
            raise NoTrajectories(
                f"step {self.step}: {failed_groups} groups lost: too few of their members "
                "were played to the end (slots a client's group name never took within "
                "the fill timeout, or offered again until their bound); send group_size "
                "sessions per group name, and see the sessions/ metrics"
            )
        raise NoTrajectories(
            f"step {self.step}: {failed_groups} groups lost to episodes that timed out or were "
            "cancelled; raise rollout.episode_timeout_s or agent.env_timeout_s"
        )

    async def _train(self, step: int, groups: list[Group]) -> tuple[dict[str, float], float, float]:
        """Train and sync weights; returns the trainer's metrics, busy and device-wait seconds."""
        self._set_trainer("training")
        submitted = time.perf_counter()
        timing: dict[str, float] = {}

        def on_device() -> dict[str, float]:
            timing["start"] = time.perf_counter()
            with self.recorder.span("train_step", track="trainer", step=step, annotate=True):
                metrics = self.trainer.train_step(self.build_batch(groups))
            self._set_trainer("syncing_weights")
            with self.recorder.span("weight_sync", track="trainer", step=step, annotate=True):
                self.engine.update_weights(self.policy_weights(), version=step)
            # An engine with figures of its own per update (vLLM: pause, probe check).
            engine_metrics = getattr(self.engine, "update_metrics", None)
            if engine_metrics is not None:
                metrics = {**metrics, **engine_metrics()}
            timing["end"] = time.perf_counter()
            return metrics

        metrics = await self.device.run_trainer(on_device)
        self._set_trainer("idle")
        return metrics, timing["end"] - timing["start"], timing["start"] - submitted

    def _eval_due(self, step: int) -> bool:
        every = self.config.eval_interval
        return (
            self.evaluator is not None
            and every > 0
            and (step % every == 0 or step == self.config.steps)
        )

    async def _evaluate(self, step: int) -> dict[str, float]:
        assert self.evaluator is not None
        self._set_trainer("evaluating")
        with self.recorder.span("eval", track="trainer", step=step):
            metrics = await self.evaluator.run(step)
        self._set_trainer("idle")
        log.info("step %d: eval %s", step, {k: round(v, 3) for k, v in metrics.items()})
        return metrics

    async def _checkpoint(self, step: int) -> None:
        if self.checkpointer is None or step == self._saved_step:
            return
        checkpointer = self.checkpointer
        extra = {"collector": self.collector.position(), "step": step}

        timing: dict[str, float] = {}

        def save() -> CheckpointRecord:
            # Timed in the device thread: the save's own cost, not the wait for the thread
            # (busy with the engine's batches in async mode), which the cadence must not see.
            started = time.perf_counter()
            with self.recorder.span("checkpoint", track="trainer", step=step, annotate=True):
                record = checkpointer.save(step, extra)
            timing["cost"] = time.perf_counter() - started
            return record

        record = await self.device.run_trainer(save)
        cost = timing["cost"]
        self.cadence.saved(cost)
        self._saved_step = step
        interval = self.cadence.interval_s
        log.info(
            "checkpoint of step %d: %.3fs%s",
            step,
            cost,
            "" if interval is None else f"; the next in {interval:.0f}s",
        )
        self.sink.on_checkpoint(record)
        self._flush_spans()

    # --- reporting -------------------------------------------------------------

    def _report(
        self,
        step: int,
        metrics: dict[str, float],
        groups: list[Group],
        finished: list[Trajectory],
        dropped: list[Group],
    ) -> None:
        self.sink.on_step(step, metrics)
        self._flush_spans()
        n = self.config.trajectories_per_step
        if n:
            records = trained_records(groups, self.tokenizer, step=step, n=n)
            records += untrained_records(
                finished, self.tokenizer, n=n, dropped=[t for g in dropped for t in g.to_train]
            )
            if records:
                self.sink.on_trajectories(records)

    def _report_cancelled(self) -> None:
        if self.control.aborted:
            return
        n = self.config.trajectories_per_step
        cancelled = self.collector.cancelled
        if self.sessions is not None:
            cancelled = cancelled + self.sessions.drain_faulted()
        records = untrained_records(cancelled, self.tokenizer, n=n) if n else []
        if records:
            self.sink.on_trajectories(records)
        self._flush_spans()

    def _flush_spans(self) -> None:
        spans = self.recorder.drain()
        if spans:
            self.sink.on_spans(spans)

    def _readings(self) -> Readings:
        busy, blocked, _ = self.device.engine_counters()
        stats = getattr(self.engine, "stats", None)  # the built-in engine's counters
        return Readings(
            stages=self.recorder.totals(),
            engine_busy_s=busy,
            engine_blocked_s=blocked,
            dropped_failed=self.collector.dropped_groups,
            gate=dataclasses.replace(self.queue.counts),
            prompt_tokens=(
                getattr(stats, "prefilled_tokens", 0),
                getattr(stats, "reused_tokens", 0),
            ),
        )

    def _set_trainer(self, state: str) -> None:
        self.trainer_state, self.trainer_since = state, time.monotonic()

    def snapshot_inflight(self) -> InflightSnapshot:
        now = time.monotonic()
        live = sorted(self.collector.inflight.values(), key=lambda t: t.stage_since)
        return InflightSnapshot(
            step=self.step,
            trainer=self.trainer_state,
            trainer_since_s=round(now - self.trainer_since, 3),
            queue_depth=self.queue.depth,
            episodes=tuple(
                InflightEpisode(
                    episode_id=t.episode_id,
                    stage=t.stage,
                    since_s=round(now - t.stage_since, 3),
                    turn=t.turns,
                )
                for t in live[:INFLIGHT_EPISODES_MAX]
            ),
        )

    async def _publish_inflight(self) -> None:
        while True:
            self.control.publish_inflight(self.snapshot_inflight())
            await asyncio.sleep(INFLIGHT_INTERVAL_S)

    async def _watch_lag(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(LAG_INTERVAL_S)
            self._lags.append(max(0.0, time.perf_counter() - before - LAG_INTERVAL_S))

    def _take_lags(self) -> list[float]:
        lags, self._lags = self._lags, []
        return lags


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


__all__ = ["Checkpointer", "EvaluatorLike", "Pipeline", "PipelineConfig", "TrainerLike"]
