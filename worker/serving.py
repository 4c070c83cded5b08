"""A run's checkpoint behind an OpenAI chat-completions URL, for its tenant to try at once.

The API asks for one (`app.services.serving`) by sending the Celery task
``rlaas.serve_checkpoint`` to the serve queue with an order: the run, the step, the
checkpoint's URI, the run's spec, and a server id and secret of the API's making. The
worker that takes it (`serve_checkpoint`):

0. asks the API whether the order is still wanted (``GET /internal/serving/{id}``): one
   that waited in the queue past its replacement (no serve worker was running) is skipped;
1. finds the checkpoint on its disk or downloads it from the artifact store
   (`RunArtifacts.resolve`, as a resumed run does) and restores the policy's weights into
   the built-in JAX engine (`load_policy`);
2. serves ``POST /v1/chat/completions`` on ``RLAAS_SERVE_HOST`` (any free port), the
   sessions gateway's parsing and answers (`rl_core.protocol.chat_completions`, a
   `ChatSession` per call, no ledger kept), behind the order's secret;
3. registers its URL with the API (``POST /internal/serving/{id}``), which proxies the
   tenant's calls to it;
4. stops after ``RLAAS_SERVE_IDLE_S`` seconds without a call, and deregisters
   (``DELETE``). A failure to load is reported (``POST .../failed``) for the caller to read.

The task holds its (solo) worker while it serves: a worker that trains and serves takes
no run meanwhile, which is why serving has a queue of its own (docs/serving.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from aiohttp import web

from rl_core.protocol.chat_completions import (
    ChatCompletionError,
    parse_request,
    stream_completion,
)
from rl_core.protocol.internal import ServingFailedBody, ServingUrlBody
from rl_core.sessions.session import ChatSession, SessionConfig
from worker.gateway import MAX_BODY_BYTES, _bearer, _errors, _event_stream, _with_usage
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from rl_core.models.tokenizer import Tokenizer
    from rl_core.rollout.base import RolloutEngine
    from rl_core.spec import JobSpec

log = logging.getLogger(__name__)

TASK_SERVE_CHECKPOINT = "rlaas.serve_checkpoint"


@dataclass(frozen=True)
class Served:
    """What answers: the restored policy's engine, its tokenizer, the run's per-call bounds
    and sampler, and the name its answers carry (``step-12``: the step loaded)."""

    engine: RolloutEngine
    tokenizer: Tokenizer
    config: SessionConfig
    name: str


class _Routes:
    def __init__(self, served: Served, token: str, clock: Callable[[], float]) -> None:
        self.served, self.token, self.clock = served, token, clock
        self.last_call = clock()
        self.calls = itertools.count()
        self.answering = 0  # calls in flight: never idle while one is

    async def complete(self, request: web.Request) -> web.StreamResponse:
        if not hmac.compare_digest(_bearer(request).encode(), self.token.encode()):
            raise ChatCompletionError(
                "this server answers the control plane only (its serving secret)",
                code="invalid_api_key",
                status=401,
                type="authentication_error",
            )
        self.last_call = self.clock()
        self.answering += 1
        try:
            parsed = parse_request(await request.read())
            # A session of one call: the sessions gateway's rendering, sampling bounds and
            # answer, with nothing recorded for training.
            session = ChatSession(
                f"{self.served.name}-{next(self.calls)}",
                engine=self.served.engine,
                tokenizer=self.served.tokenizer,
                config=self.served.config,
            )
            answer = await session.complete(parsed)
        finally:
            self.answering -= 1
            self.last_call = self.clock()
        answer = answer.model_copy(update={"model": self.served.name})  # the step that answered
        if not parsed.stream:
            return web.Response(text=answer.to_json(), content_type="application/json")
        events = stream_completion(answer, include_usage=_with_usage(parsed.stream_options))
        return await _event_stream(request, events)


def serving_app(
    served: Served, *, token: str, clock: Callable[[], float] = time.monotonic
) -> web.Application:
    """``POST /v1/chat/completions`` answered by ``served``, behind ``token``."""
    routes = _Routes(served, token, clock)
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    app[ROUTES] = routes
    app.router.add_post("/v1/chat/completions", routes.complete)
    return app


ROUTES: web.AppKey[_Routes] = web.AppKey("serving_routes")


def idle_for(app: web.Application) -> float:
    """Seconds since the server's last call (or its start); 0 while one is answered."""
    routes = app[ROUTES]
    return 0.0 if routes.answering else routes.clock() - routes.last_call


async def serve_until_idle(
    served: Served,
    *,
    token: str,
    host: str,
    port: int = 0,
    idle_s: float,
    public_url: str | None,
    registered: Callable[[str], Any],
) -> None:
    """Serve on ``host:port`` (0: a free one) and call ``registered(url)`` once bound; return once
    no call came for ``idle_s`` seconds."""
    app = serving_app(served, token=token)
    runner = web.AppRunner(app, access_log=None)
    # The JAX engine batches concurrent calls (continuous batching) while it serves.
    batching = getattr(served.engine, "serving", None)
    async with batching() if batching else contextlib.nullcontext():
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound = runner.addresses[0][1]
            url = (public_url or f"http://{host}:{bound}").rstrip("/")
            await asyncio.to_thread(registered, url)
            log.info("serving %s at %s until %.0f s idle", served.name, url, idle_s)
            # Asleep until the idle time would end; a call since moves that end on.
            while True:
                left = idle_s - idle_for(app)
                if left <= 0:
                    break
                await asyncio.sleep(left)
        finally:
            await runner.cleanup()


def load_policy(spec: JobSpec, checkpoint: str, step: int) -> Served:
    """The run's model with the checkpoint's weights, in a JAX engine of its own.

    The trainer restores the checkpoint (its layout checks included) and is dropped once
    the engine has the weights: serving keeps no optimizer state."""
    from rl_core.pipeline import configs
    from rl_core.pipeline.build import build_trainer, snapshot
    from rl_core.pretrained.sources import load_model
    from rl_core.rollout.jax_engine import JaxEngine

    model, tokenizer = load_model(spec.model, seed=spec.train.seed)
    engine = JaxEngine(
        model, config=configs.engine_config(spec, tokenizer, model.config), tokenizer=tokenizer
    )
    trainer, restored, _ = build_trainer(spec, model, checkpoint)
    engine.update_weights(snapshot(trainer.params()), restored)
    del trainer
    return Served(engine, tokenizer, session_config(spec), name=f"step-{step}")


def session_config(spec: JobSpec) -> SessionConfig:
    """A call's bounds and sampler: the run's, as its sessions gateway has them."""
    from rl_core.pipeline import configs
    from rl_core.sessions.sampling import ClientSampling

    return SessionConfig(
        sampling=configs.sampling_params(spec),
        max_new_tokens=spec.agent.max_new_tokens,
        max_context=spec.agent.max_context,
        client_sampling=ClientSampling(**spec.rollout.client_sampling.model_dump()),
    )


class ServingApi:
    """The worker's side of ``/internal/serving/{id}``: the order's secret opens it."""

    def __init__(self, api_url: str, server_id: str, token: str) -> None:
        self._url = f"{api_url.rstrip('/')}/internal/serving/{server_id}"
        self._headers = {"Authorization": f"Bearer {token}"}

    def wanted(self) -> bool:
        """Whether the API still waits for this server: an order that waited in the queue
        past its replacement (no serve worker was running) is not loaded for nothing."""
        answer = httpx.get(self._url, headers=self._headers, timeout=30)
        if answer.status_code == 404:
            return False
        answer.raise_for_status()
        return True

    def register(self, url: str) -> None:
        body = ServingUrlBody(url=url).model_dump()
        answer = httpx.post(self._url, json=body, headers=self._headers, timeout=30)
        answer.raise_for_status()

    def failed(self, error: str) -> None:
        httpx.post(
            f"{self._url}/failed",
            json=ServingFailedBody(error=error[:2000]).model_dump(),
            headers=self._headers,
            timeout=30,
        ).raise_for_status()

    def deregister(self) -> None:
        httpx.delete(self._url, headers=self._headers, timeout=30).raise_for_status()


def serve_checkpoint(order: dict[str, Any], settings: WorkerSettings) -> str:
    """Load the order's checkpoint and serve it until idle; the outcome, for the log."""
    from rl_core.spec import confine_model_source, parse_spec
    from rl_core.training.stored import RunArtifacts
    from worker.job import failure_reason

    run_id, step = str(order["run_id"]), int(order["step"])
    api = ServingApi(settings.api_url, str(order["server_id"]), str(order["token"]))
    if not api.wanted():
        log.info(
            "run %s: the order to serve step %d was replaced or dropped; skipped", run_id, step
        )
        return "unwanted"
    try:
        spec = confine_model_source(parse_spec(order["spec"]), settings.models_dir())
        stored = RunArtifacts(
            settings.artifacts_dir() / run_id,
            settings.store_target(run_id),
            keep=spec.train.keep_checkpoints,
        )
        served = load_policy(spec, stored.resolve(str(order["uri"])), step)
    except Exception as exc:
        log.exception("run %s: the checkpoint of step %d could not be loaded", run_id, step)
        with contextlib.suppress(httpx.HTTPError):
            api.failed(failure_reason(exc))  # the tenant reads it: no path of this machine
        return "failed"
    try:
        asyncio.run(
            serve_until_idle(
                served,
                token=str(order["token"]),
                host=settings.serve_host,
                idle_s=settings.serve_idle_s,
                port=settings.serve_port,
                public_url=settings.serve_url,
                registered=api.register,
            )
        )
    finally:
        with contextlib.suppress(httpx.HTTPError):
            api.deregister()
        close = getattr(served.engine, "close", None)
        if close is not None:
            close()
    return "idle"


__all__ = [
    "TASK_SERVE_CHECKPOINT",
    "Served",
    "ServingApi",
    "load_policy",
    "serve_checkpoint",
    "serve_until_idle",
    "serving_app",
    "session_config",
]
