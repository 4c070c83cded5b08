"""Serve any `rl_core` Environment as a webhook environment (v1, docs/environment-protocol.md).

    rlaas env serve mypackage.envs:MyEnv --port 9000 --secret-env RLAAS_ENV_SECRET

or from Python: ``uvicorn.run(EnvServer(MyEnv(), secret=...).app)``.

What the server does for the environment's author:

- verifies every request's signature (401 with the reason otherwise);
- makes ``(episode_id, step)`` idempotent: a retried step (the worker's
  answer was lost, or it timed out while the step ran) gets the result of the
  first call, even one still running, and never advances the environment
  again; a retried reset of the same episode likewise (a reset after steps
  is a new episode under the same id, and starts over);
- optionally defers slow steps: with ``defer_after_s`` a step that has not
  finished by then is answered ``202 {"deferred": true}``, and its result is
  POSTed, signed and naming its ``episode_id`` and ``step``, to
  ``{callback_url}/{episode_id}/{step}`` when it is ready (the control plane's
  ``/v1/env-callbacks``), retried while the control plane is away or busy;
- maps `EnvironmentFailure` (the environment refusing the request, e.g. an
  unknown config key) to 422, which the worker does not retry, and any other
  exception to 500, which it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rl_core.envs.base import Action, Environment, Reset, Step, ToolCall
from rl_core.errors import EnvironmentFailure
from rl_core.protocol import webhook as wire
from rl_core.protocol.signing import HEADER, SignatureError, sign, verify

log = logging.getLogger(__name__)

CALLBACK_ATTEMPTS = 5
CALLBACK_MAX_WAIT_S = 60.0  # the longest Retry-After honoured between two attempts
# Worth another attempt: the control plane is away, busy or rate-limiting. Any other
# answer is final: 2xx taken, 409 taken before, 410 nobody waits any more, and the rest
# of the 4xx a mistake that a retry repeats.
RETRY_STATUSES = frozenset({408, 425, 429})
R = TypeVar("R", bound=BaseModel)


class BadRequest(ValueError):
    """The body is signed but not the protocol's shape."""


@dataclasses.dataclass
class _Episode:
    reset: asyncio.Task[Reset] | None = None
    steps: dict[int, asyncio.Task[Step]] = dataclasses.field(default_factory=dict)
    deferred: set[int] = dataclasses.field(default_factory=set)


class EnvServer:
    """One environment instance behind the protocol's three routes (and ``/healthz``)."""

    def __init__(
        self,
        env: Environment,
        *,
        secret: str,
        callback_url: str | None = None,
        defer_after_s: float | None = None,
        max_episodes: int = 10_000,
    ) -> None:
        if defer_after_s is not None and not callback_url:
            raise ValueError("defer_after_s needs callback_url: deferred results are POSTed there")
        if len(secret) < 16:
            raise ValueError("the secret must be at least 16 characters (as rlaas requires)")
        self.env = env
        self.secret = secret
        self.callback_url = callback_url.rstrip("/") if callback_url else None
        self.defer_after_s = defer_after_s
        self.max_episodes = max_episodes
        # Episodes in arrival order; the oldest are forgotten past max_episodes,
        # so a client that never calls /close cannot grow the server without bound.
        self._episodes: OrderedDict[str, _Episode] = OrderedDict()
        self._background: set[asyncio.Task[Any]] = set()
        self._client: httpx.AsyncClient | None = None
        self.app = Starlette(
            routes=[
                Route("/reset", self._reset, methods=["POST"]),
                Route("/step", self._step, methods=["POST"]),
                Route("/close", self._close, methods=["POST"]),
                Route("/healthz", lambda _: JSONResponse({"ok": True}), methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        self._client = httpx.AsyncClient(trust_env=False, timeout=10.0)
        try:
            yield
        finally:
            for task in [*self._background, *self._all_tasks()]:
                task.cancel()
            await asyncio.gather(*self._background, return_exceptions=True)
            await self._client.aclose()

    # -- routes ---------------------------------------------------------------------------

    async def _reset(self, request: Request) -> Response:
        return await self._handle(request, self._do_reset)

    async def _step(self, request: Request) -> Response:
        return await self._handle(request, self._do_step)

    async def _close(self, request: Request) -> Response:
        return await self._handle(request, self._do_close)

    async def _handle(self, request: Request, action: Any) -> Response:
        return await _signed(self.secret, request, action)

    async def _do_reset(self, body: Mapping[str, Any]) -> Response:
        request = _parse(wire.ResetRequest, body)
        episode_id, seed, config = request.episode_id, request.seed, request.config
        episode = self._episode(episode_id)
        if episode.steps:
            # A retried reset never follows a step (the client steps only after a
            # reset answer), so this is a new episode under an old id: start over.
            self._forget(episode_id)
            episode = self._episode(episode_id)
        if episode.reset is None:
            episode.reset = self._remembered(
                episode, "reset", self.env.reset(episode_id, seed, config)
            )
        reset = await asyncio.shield(episode.reset)
        answer = {"messages": reset.messages, "tools": reset.tools, "info": reset.info}
        return JSONResponse(_checked(wire.ResetAnswer, answer))

    async def _do_step(self, body: Mapping[str, Any]) -> Response:
        request = _parse(wire.StepRequest, body)
        episode_id, step = request.episode_id, request.step
        action = Action(
            content=request.action.content,
            tool_calls=tuple(
                ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                for c in request.action.tool_calls
            ),
        )
        episode = self._episode(episode_id)
        task = episode.steps.get(step)
        if task is None:
            task = self._remembered(episode, step, self.env.step(episode_id, step, action))
            episode.steps[step] = task
        if self.defer_after_s is not None and not task.done():
            await asyncio.wait({task}, timeout=self.defer_after_s)
            if not task.done():
                if step not in episode.deferred:
                    episode.deferred.add(step)
                    self._spawn(self._deliver(episode_id, step, task))
                return JSONResponse(
                    wire.DeferredAnswer(deferred=True).model_dump(), status_code=202
                )
        # shield: a client that hangs up must not cancel the environment's step.
        return JSONResponse(_step_body(await asyncio.shield(task)))

    async def _do_close(self, body: Mapping[str, Any]) -> Response:
        episode_id = _parse(wire.CloseRequest, body).episode_id
        self._forget(episode_id)
        await self.env.close(episode_id)
        return JSONResponse(wire.CloseAnswer(closed=True).model_dump())

    # -- bookkeeping ----------------------------------------------------------------------

    def _episode(self, episode_id: str) -> _Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            episode = self._episodes[episode_id] = _Episode()
            while len(self._episodes) > self.max_episodes:
                self._episodes.popitem(last=False)
        return episode

    def _forget(self, episode_id: str) -> None:
        episode = self._episodes.pop(episode_id, None)
        if episode is not None:
            for step, task in episode.steps.items():
                if step not in episode.deferred:  # a deferred result still has to be delivered
                    task.cancel()

    def _remembered(
        self, episode: _Episode, key: int | str, call: Awaitable[Any]
    ) -> asyncio.Task[Any]:
        """Run ``call`` once; forget it if it fails, so that a retry runs it again."""

        async def run() -> Any:
            try:
                return await call
            except BaseException:
                if key == "reset":
                    episode.reset = None
                else:
                    episode.steps.pop(int(key), None)
                raise

        return asyncio.ensure_future(run())

    def _all_tasks(self) -> list[asyncio.Task[Any]]:
        tasks: list[asyncio.Task[Any]] = []
        for episode in self._episodes.values():
            tasks += [*episode.steps.values(), *([episode.reset] if episode.reset else [])]
        return tasks

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)

    async def _deliver(self, episode_id: str, step: int, task: asyncio.Task[Step]) -> None:
        """POST a deferred step's result (or its failure) to the callback URL, with retries.

        The body names the step it answers: the signature covers it, so the control
        plane can tell that the post is for the URL's step and not a replay of another.
        """
        assert self._client is not None and self.callback_url is not None
        bound: dict[str, Any] = {"episode_id": episode_id, "step": step}
        try:
            payload = {**bound, **_step_body(await task)}
        except Exception as exc:
            failure = {"code": "environment_error", "message": f"{exc}"}
            payload = wire.CallbackFailure.model_validate({**bound, "error": failure}).model_dump()
        raw = json.dumps(payload, separators=(",", ":")).encode()
        url = f"{self.callback_url}/{episode_id}/{step}"
        for attempt in range(CALLBACK_ATTEMPTS):
            wait = 0.2 * 2**attempt
            try:
                response = await self._client.post(
                    url, content=raw, headers={HEADER: sign(self.secret, raw)}
                )
                status = response.status_code
                if status < 300 or status == 409:  # 409: taken before
                    return
                if status < 500 and status not in RETRY_STATUSES:
                    level = logging.WARNING if status == 410 else logging.ERROR
                    log.log(level, "callback %s refused (%s): %s", url, status, _reason(response))
                    return
                log.warning("callback %s answered %s", url, status)
                wait = max(wait, _retry_after(response))
            except httpx.HTTPError as exc:
                log.warning("callback %s failed: %s", url, exc)
            await asyncio.sleep(min(wait, CALLBACK_MAX_WAIT_S))
        log.error("gave up delivering %s step %s to %s", episode_id, step, url)


async def _signed(secret: str, request: Request, action: Any) -> Response:
    """Verify the request's signature, then answer with ``action(body)``; the protocol's
    error answers for a bad signature (401), a bad body (400), a refusal (422) and any
    other exception (500, which the worker retries)."""
    raw = await request.body()
    try:
        verify(secret, raw, request.headers.get(HEADER))
    except SignatureError as exc:
        return _error(401, "bad_signature", str(exc))
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return await action(body)  # type: ignore[no-any-return]
    except (BadRequest, json.JSONDecodeError) as exc:
        return _error(400, "bad_request", str(exc))
    except EnvironmentFailure as exc:
        return _error(422, "environment_refused", str(exc))
    except Exception as exc:
        log.exception("environment raised")
        return _error(500, "environment_error", f"{type(exc).__name__}: {exc}")


ScoreFn = Callable[[wire.ScoreRequest], float | Awaitable[float]]


class ScorerServer:
    """A scorer endpoint for the ``webhook`` reward (docs/environment-protocol.md#scoring):
    ``score(request)`` (plain or async) gives a finished episode's score; the server
    verifies signatures and answers ``POST /score`` with ``{"score": ...}``.

        uvicorn.run(ScorerServer(my_score, secret=...).app)
    """

    def __init__(self, score: ScoreFn, *, secret: str) -> None:
        if len(secret) < 16:
            raise ValueError("the secret must be at least 16 characters (as rlaas requires)")
        self.score = score
        self.secret = secret
        self.app = Starlette(
            routes=[
                Route("/score", self._score, methods=["POST"]),
                Route("/healthz", lambda _: JSONResponse({"ok": True}), methods=["GET"]),
            ]
        )

    async def _score(self, request: Request) -> Response:
        return await _signed(self.secret, request, self._do_score)

    async def _do_score(self, body: Mapping[str, Any]) -> Response:
        value = self.score(_parse(wire.ScoreRequest, body))
        if inspect.isawaitable(value):
            value = await value
        return JSONResponse(_checked(wire.ScoreAnswer, {"score": value}))


def _reason(response: httpx.Response) -> str:
    """The control plane's ``error.message``, else the start of the body."""
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return str(response.json()["error"]["message"])
    return response.text[:300]


def _retry_after(response: httpx.Response) -> float:
    try:
        return float(response.headers.get("Retry-After", 0))
    except ValueError:  # an HTTP date: not sent by rlaas
        return 0.0


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _parse(model: type[R], body: Mapping[str, Any]) -> R:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(wire.problems(exc)) from None


def _checked(model: type[BaseModel], answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` as it goes out, checked against the protocol: an environment whose result
    is not protocol-shaped (a NaN reward, a message role the protocol lacks) is a 500 here,
    with the reason, rather than a protocol error on the worker's side."""
    try:
        model.model_validate(answer)
    except ValidationError as exc:
        raise ValueError(
            f"the environment's result is not protocol v1: {wire.problems(exc)}"
        ) from None
    return answer


def _step_body(result: Step) -> dict[str, Any]:
    answer = {
        "messages": result.messages,
        "reward": result.reward,
        "done": result.done,
        "info": result.info,
    }
    return _checked(wire.StepAnswer, answer)


def load_environment(target: str) -> Environment:
    """An instance of ``MODULE:CLASS`` (made with no arguments)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"{target!r}: expected MODULE:CLASS, e.g. rl_core.envs.calculator:Calculator"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{target!r}: cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"{target!r}: module {module_name!r} has no {attr!r}")
    env = factory()
    if not isinstance(env, Environment):
        raise ValueError(f"{target!r}: instances lack async reset/step/close")
    return env


def serve(
    target: str,
    *,
    secret: str,
    host: str = "127.0.0.1",
    port: int = 9000,
    callback_url: str | None = None,
    defer_after_s: float | None = None,
) -> None:
    import uvicorn

    server = EnvServer(
        load_environment(target),
        secret=secret,
        callback_url=callback_url,
        defer_after_s=defer_after_s,
    )
    uvicorn.run(server.app, host=host, port=port, log_level="info")
