"""Execute one run: claim it, train it, report what happened.

This is the whole of the worker's logic; the Celery task only calls it. The
RL core is imported here, lazily, so that importing the Celery app (for
``celery inspect`` or a producer) does not start JAX.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, Literal

from rl_core.errors import TrainerHostLost
from rl_core.host.control import RunControl
from worker.api_client import ApiUnavailable, Claim, ClaimRefused, ControlPlane, LeaseLost
from worker.callbacks import HttpCallbackSource
from worker.datasets import HttpDatasets, with_local_dataset
from worker.heartbeat import Heartbeater
from worker.init_from import HttpAdapters, with_local_adapter
from worker.settings import WorkerSettings
from worker.sinks import HttpRunSink
from worker.startup import sandbox_wall
from worker.trackers import RunTrackers
from worker.trainer_hosts import ray_starter

if TYPE_CHECKING:
    from rl_core.envs.webhook import WebhookTarget

log = logging.getLogger(__name__)

Outcome = Literal["succeeded", "failed", "cancelled", "not_claimed", "lease_lost", "host_lost"]

# Sequence numbers of metric batches restart at a new block on every attempt,
# so a resumed run's batches never collide with those of the attempt before.
SEQ_BLOCK = 1_000_000_000


def execute_run(run_id: str, settings: WorkerSettings, *, colocation: Any = None) -> Outcome:
    """``colocation``: what the runs this worker hosts at once share (worker.hosting);
    None when it hosts one at a time."""
    # The shared worker token opens the claim only; the claim answers the lease token that
    # every later call about this run is made with (worker.api_client).
    claimer = ControlPlane(
        settings.api_url,
        settings.resolved_worker_token(),
        settings.worker_id,
        retry_seconds=settings.api_retry_seconds,
    )
    try:
        # The message names a run, but the fair claim takes the queued run fair order puts
        # first (app.services.fair): one tenant's many runs cannot starve another's one.
        claim = claimer.claim(
            run_id,
            settings.lease_seconds,
            fair=True,
            sandbox=sandbox_wall(settings),
            bases=held_bases(colocation),
        )
    except ClaimRefused as exc:
        log.info("run %s not claimed: %s", run_id, exc)
        return "not_claimed"
    finally:
        claimer.close()
    if claim.run_id != run_id:
        log.info("message for run %s: took run %s, next in fair order", run_id, claim.run_id)
        run_id = claim.run_id
    # Three clients, one per thread: this one, the shipper's and the heartbeat's.
    api = claimer.for_lease(claim)
    control = RunControl()
    try:
        sink = HttpRunSink(
            claimer.for_lease(claim),
            run_id,
            first_seq=claim.attempt * SEQ_BLOCK,
            attempt=claim.attempt,
            resumed_from=resumed_from(claim),
            # A refused report (a doubled step, a lease taken over) means another worker
            # holds the run: train no further step, report nothing more, release it.
            on_refused=lambda exc: refused(control, run_id, exc),
        )
        try:
            with Heartbeater(
                claimer.for_lease(claim),
                run_id,
                settings.heartbeat_seconds,
                control,
                lease_s=settings.lease_seconds,
            ) as beats:
                return _train_claimed(api, claim, beats, sink, settings, colocation)
        finally:
            sink.close()
    finally:
        api.close()


def _train_claimed(
    api: ControlPlane,
    claim: Claim,
    beats: Heartbeater,
    sink: HttpRunSink,
    settings: WorkerSettings,
    colocation: Any,
) -> Outcome:
    from rl_core.pipeline.runner import train
    from rl_core.spec import confine_model_source, parse_spec

    run_id = claim.run_id
    webhooks = webhook_targets(claim, settings)
    resume_from = None
    if claim.checkpoint is not None:
        resume_from = claim.checkpoint.uri
        log.info("run %s: resuming from step %s (%s)", run_id, claim.checkpoint.step, resume_from)
    try:
        # The dataset content the run pinned, fetched over the internal API (any host).
        datasets = HttpDatasets(
            settings.api_url, claim.lease_token, settings.data_dir / "dataset-cache"
        )
        raw_spec = with_local_dataset(claim.spec, run_id, datasets)
        # The adapter it starts from (model.lora.init_from), the same way: a local folder.
        adapters = HttpAdapters(
            settings.api_url, claim.lease_token, settings.data_dir / "adapter-cache"
        )
        raw_spec = with_local_adapter(raw_spec, run_id, adapters)
        # A tenant's hf:/gguf: path is read inside the operator's models folder only.
        spec = confine_model_source(parse_spec(raw_spec), settings.models_dir())
        # The spec's trackers (W&B, MLflow, TensorBoard), fed off the pipeline's path.
        store = settings.store_target(run_id)  # docs/storage.md: checkpoints, exports, files
        trackers = RunTrackers(spec, run_id, settings, sink, store)
        api.report_status(run_id, "running")
        try:
            result = train(
                spec,
                sink=trackers.sink,
                control=beats.control,
                artifacts_dir=settings.artifacts_dir() / run_id,
                resume_from=resume_from,
                # The run id first (the control plane routes callbacks by it), then the
                # attempt, so a resumed attempt's episodes never collide with the dead
                # one's (replays).
                episode_prefix=f"{run_id}~a{claim.attempt}-",
                webhooks=webhooks,
                callbacks=HttpCallbackSource(settings.api_url, claim.lease_token, run_id),
                gateway=session_gateway(api, run_id, settings),
                walls=settings.sandbox_walls(),  # deployed: bubblewrap or no tenant code
                store=store,
                colocation=colocation,
                trainer_hosts=ray_starter(settings),
            )
        except BaseException:
            trackers.close("failed")
            raise
        if beats.lease_lost.is_set():
            trackers.close("failed")  # this attempt's end; another worker resumes the run
        elif result.stopped_early and beats.cancel_requested.is_set():
            trackers.close("cancelled")
        else:
            trackers.close("succeeded")
        # Everything reported must be stored before the run may be called finished.
        sink.flush(timeout_s=settings.api_retry_seconds)
    except LeaseLost as exc:
        log.error("run %s: lease lost (%s); another worker owns it now", run_id, exc)
        return "lease_lost"
    except ApiUnavailable:
        log.exception("run %s: control plane unavailable; the lease reaper will retry it", run_id)
        return "failed"
    except TrainerHostLost:
        # As a worker that dies: no failure reported, the lease lapses, and the reaper
        # queues the run again to resume from its last checkpoint (docs/multi-host.md).
        log.exception("run %s: a trainer process was lost; the attempt ends", run_id)
        return "host_lost"
    except Exception as exc:
        log.exception("run %s failed", run_id)  # the traceback stays in the worker's log
        _report_failure(api, run_id, failure_reason(exc))
        return "failed"
    if beats.lease_lost.is_set():
        return "lease_lost"
    if result.stopped_early and beats.cancel_requested.is_set():
        api.report_status(run_id, "cancelled")
        return "cancelled"
    api.report_status(run_id, "succeeded")
    return "succeeded"


def held_bases(colocation: Any) -> list[str]:
    """The model sources of the bases this worker's runs hold now (none when it hosts one
    run at a time): the claim prefers a run on one of them (docs/shared-base.md)."""
    if colocation is None:
        return []
    return sorted({source for source, _, _ in colocation.bases.holders()})


def refused(control: RunControl, run_id: str, exc: Exception) -> None:
    log.error("run %s: a report was refused (%s); stopping the attempt now", run_id, exc)
    control.abort()


def resumed_from(claim: Claim) -> tuple[int, int]:
    """(step, attempt) of the policy this attempt starts from: the claim's checkpoint, or
    (0, 0), the initial policy. A checkpoint recorded by a control plane of the release
    before has no attempt; the lineage then shows the link as broken, not as a guess."""
    ckpt = claim.checkpoint
    if ckpt is None:
        return 0, 0
    return ckpt.step, ckpt.attempt if ckpt.attempt is not None else 0


def session_gateway(api: ControlPlane, run_id: str, settings: WorkerSettings) -> Any:
    """A sessions run's gateway, registered with the control plane once it serves (the
    API proxies clients' calls to it; it holds no database, only the run's broker)."""
    import asyncio
    import contextlib
    import secrets

    from worker.gateway import serve_gateway

    @contextlib.asynccontextmanager
    async def serving(broker: Any) -> Any:
        token = secrets.token_urlsafe(24)
        async with serve_gateway(
            broker,
            token=token,
            host=settings.gateway_host,
            port=settings.gateway_port,
            public_url=settings.gateway_url,
        ) as url:
            await asyncio.to_thread(api.register_gateway, run_id, url, token)
            log.info("run %s: sessions served at %s", run_id, url)
            yield url

    return serving


def webhook_targets(claim: Claim, settings: WorkerSettings) -> dict[str, WebhookTarget]:
    """The run's webhook environment, its ``webhook`` reward's scorer endpoint and its
    ``judge`` reward's LLM judge, those it has, connecting only where this worker's
    ``RLAAS_ENV_URL_ALLOWLIST`` allows (checked at every connection, not only at
    registration: a name re-pointed since then is refused)."""
    from rl_core.envs.webhook import WebhookTarget

    return {
        grant.id: WebhookTarget(
            id=grant.id,
            url=grant.url,
            secret=grant.secret,
            timeout_s=grant.timeout_s,
            max_concurrency=grant.max_concurrency,
            allowlist=settings.env_allowlist(),
        )
        for grant in (claim.environment, claim.scorer, claim.judge)
        if grant is not None
    }


_PATH = re.compile(r"(?<![\w:/.])/(?:[\w.+@-]+/)*[\w.+@-]+")
# The operator's artifact store (its bucket, its prefix, its folder) is no tenant's business.
_STORE_URL = re.compile(r"\b(?:s3|gs|az|file)://[^\s'\"]*")


def failure_reason(exc: BaseException) -> str:
    """What the tenant reads for a failed run: the error's type and message.

    Never a traceback, and no path of the worker's machine: paths in the message become
    their last part (``vllm-server.log``, not ``/srv/rlaas/runs/<id>/vllm-server.log``),
    and the artifact store's addresses become "the artifact store" and their last part.
    """
    message = _STORE_URL.sub(
        lambda m: f"the artifact store's {m.group(0).rstrip('/').rsplit('/', 1)[-1]}", str(exc)
    )
    message = _PATH.sub(lambda m: m.group(0).rsplit("/", 1)[-1], message).strip()
    return f"{type(exc).__name__}: {message[:2000]}" if message else type(exc).__name__


def _report_failure(api: ControlPlane, run_id: str, error: str) -> None:
    try:
        api.report_status(run_id, "failed", error=error)
    except (LeaseLost, ApiUnavailable):
        log.exception("could not report the failure of %s", run_id)
