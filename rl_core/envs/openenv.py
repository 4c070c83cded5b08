"""``openenv``: an OpenEnv environment server (PyPI ``openenv-core``, 0.3.x) as an environment.

OpenEnv serves an environment over HTTP with ``openenv.core.env_server.create_app``.
Its ``POST /reset`` and ``POST /step`` are stateless: each request builds a fresh
environment and closes it after answering, so a step never sees the episode its
reset began. Episodes live on its WebSocket, ``/ws``, which is what OpenEnv's own
``EnvClient`` speaks: one connection is one environment instance; the client sends
``{"type": "reset", "data": {seed, episode_id, ...}}``, ``{"type": "step", "data":
<action fields>}`` and ``{"type": "close"}``; the server answers ``{"type":
"observation", "data": {"observation": {...}, "reward": float|null, "done": bool}}``
or ``{"type": "error", "data": {"message", "code"}}``. So this adapter opens one
connection per episode, as ``EnvClient`` does.

What maps to what (`rl_core.protocol.ecosystem.OpenEnvConfig`):

- the model's turn -> the Action: its text as ``Action.<action_field>`` (mode
  ``text``), or the arguments of its call to one tool whose parameters are the
  Action's JSON schema from the server's ``GET /schema`` (mode ``tool_call``);
  ``action_fixed`` fields ride along with every action;
- an observation -> one message: its ``observation_field``, or the whole
  observation as JSON; a ``user`` message, or a ``tool`` message answering the call;
- ``reward`` -> the step's reward (null is 0); ``done`` -> the step's done.

The walls are a webhook's (`rl_core.envs.transport`): the server is registered
with ``POST /v1/environments`` (its URL checked against the allowlist there), and
every connection resolves its host through `CheckingResolver`, so a name
re-pointed since registration cannot reach metadata, link-local or (on a server)
private addresses; redirects are not followed; at most ``max_concurrency``
episodes hold a connection at once. Every request (the WebSocket upgrade,
``GET /schema``) carries ``X-Rlaas-Signature`` over its path: OpenEnv's server
checks nothing, but a proxy or middleware in front of it that holds the secret
can refuse connections that are not rlaas's. The signature does not cover the
messages on the connection (TLS does, with an https URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from rl_core.envs.base import Action, Message, Reset, Step
from rl_core.envs.errors import WebhookAddressRefused, WebhookProtocolError, WebhookUnavailable
from rl_core.envs.transport import MAX_ANSWER_BYTES, AddressRefused, CheckingResolver, tls_context
from rl_core.envs.webhook import WebhookTarget
from rl_core.errors import EnvironmentFailure
from rl_core.protocol.addresses import ip_literal
from rl_core.protocol.ecosystem import OPENENV, OpenEnvConfig
from rl_core.protocol.signing import HEADER, sign

_CLOSE_TIMEOUT_S = 5.0
_ENDED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)


@dataclasses.dataclass
class _Episode:
    ws: aiohttp.ClientWebSocketResponse
    answers: dict[int, Step] = dataclasses.field(default_factory=dict)
    done: bool = False
    last_call_id: str | None = None


class OpenEnvEnvironment:
    """One per run; one WebSocket per episode in flight."""

    def __init__(self, target: WebhookTarget, config: OpenEnvConfig) -> None:
        self.target = target
        self.config = config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None
        self._episodes: dict[str, _Episode] = {}
        self._tool: dict[str, Any] | None = None
        parts = urlsplit(target.url.rstrip("/"))
        scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
        self._ws_url = urlunsplit(parts._replace(scheme=scheme, path=parts.path + "/ws"))
        self._schema_url = urlunsplit(parts._replace(path=parts.path + "/schema"))

    # -- the Environment protocol ---------------------------------------------------------

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        cfg = self.config
        session, slots = self._bind()
        tools = [await self._action_tool(session)] if cfg.action_mode == "tool_call" else []
        await slots.acquire()
        try:
            ws = await self._connect(session)
        except BaseException:
            slots.release()
            raise
        episode = self._episodes[episode_id] = _Episode(ws=ws)
        data = {**cfg.reset, "seed": seed, "episode_id": episode_id}
        answer = await self._exchange(episode, {"type": "reset", "data": data}, "reset")
        episode.done = bool(answer.get("done", False))
        text = self._observation_text(answer, "reset")
        content = f"{cfg.instructions}\n\n{text}" if cfg.instructions else text
        info = {"openenv_reset_reward": _reward(answer)}
        return Reset(messages=[{"role": "user", "content": content}], tools=tools, info=info)

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EnvironmentFailure(f"{OPENENV}: no episode {episode_id!r}; call reset first")
        if step in episode.answers:  # a retried step: answered once, never played twice
            return episode.answers[step]
        if episode.done:
            raise EnvironmentFailure(f"{OPENENV}: episode {episode_id!r} is already over")
        data, refusal = self._action(action)
        if refusal is not None:  # no action to send: the model is told how to act
            result = Step(messages=[refusal], reward=0.0, done=False, info={"refused": True})
        else:
            answer = await self._exchange(episode, {"type": "step", "data": data}, "step")
            episode.done = bool(answer.get("done", False))
            reply: Message = {"role": "user", "content": self._observation_text(answer, "step")}
            call = action.tool_calls[0] if action.tool_calls else None
            if self.config.action_mode == "tool_call" and call is not None:
                reply = {**reply, "role": "tool", "tool_call_id": call.id}
            result = Step(messages=[reply], reward=_reward(answer), done=episode.done)
        episode.answers[step] = result
        return result

    async def close(self, episode_id: str) -> None:
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            return
        try:
            if not episode.ws.closed:
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await episode.ws.send_str(json.dumps({"type": "close"}))
                    # The server closes the connection on that message; closing it from
                    # here at the same time makes OpenEnv's server log a disconnect error.
                    while not episode.ws.closed:
                        message = await episode.ws.receive()
                        if message.type in _ENDED:
                            break
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            pass  # the server drops its instance when the connection goes, either way
        finally:
            with contextlib.suppress(Exception):  # closed already, as a rule
                await episode.ws.close()
            if self._slots is not None:
                self._slots.release()

    async def aclose(self) -> None:
        """Close what is still open, in the loop that opened it (the pipeline calls it)."""
        for episode_id in list(self._episodes):
            await self.close(episode_id)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- mapping --------------------------------------------------------------------------

    def _action(self, action: Action) -> tuple[dict[str, Any], Message | None]:
        """The Action's fields for the model's turn, or a message telling it how to act."""
        cfg = self.config
        if cfg.action_mode == "text":
            return {**cfg.action_fixed, cfg.action_field: action.content}, None
        call = next((c for c in action.tool_calls if c.name == cfg.tool_name), None)
        if call is None:
            hint = f"Act by calling the {cfg.tool_name} tool."
            return {}, {"role": "user", "content": hint}
        return {**cfg.action_fixed, **call.arguments}, None

    def _observation_text(self, answer: Mapping[str, Any], what: str) -> str:
        observation = answer.get("observation")
        if not isinstance(observation, dict):
            raise self._protocol(f"the {what} answer has no observation object")
        field = self.config.observation_field
        if field is None:
            return json.dumps(observation, sort_keys=True, default=str)
        if field not in observation:
            raise EnvironmentFailure(
                f"{OPENENV} {self.target.id}: the observation has no field {field!r} "
                f"(environment.config.observation_field); it has {sorted(observation)}"
            )
        value = observation[field]
        return value if isinstance(value, str) else json.dumps(value, default=str)

    async def _action_tool(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """The one tool of mode ``tool_call``: the Action's JSON schema from ``GET /schema``
        (its ``metadata`` field left out: it is not the model's to fill)."""
        if self._tool is None:
            self._check_literal(self._schema_url)
            headers = self._signed(urlsplit(self._schema_url).path.encode())
            try:
                async with (
                    asyncio.timeout(self.target.timeout_s),
                    session.get(self._schema_url, headers=headers, allow_redirects=False) as r,
                ):
                    if r.status != 200:
                        raise self._protocol(f"GET /schema answered {r.status}")
                    body = await r.json(content_type=None)
            except AddressRefused as exc:
                raise WebhookAddressRefused(
                    self.target.id, f"GET /schema was not sent: {exc}"
                ) from None
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise WebhookUnavailable(self.target.id, f"GET /schema failed: {exc!r}") from exc
            schema = body.get("action") if isinstance(body, dict) else None
            if not isinstance(schema, dict):
                raise self._protocol("GET /schema has no 'action' JSON schema")
            params = {k: v for k, v in schema.items() if k not in ("title", "description")}
            props = {k: v for k, v in params.get("properties", {}).items() if k != "metadata"}
            params["properties"] = props
            self._tool = {
                "type": "function",
                "function": {
                    "name": self.config.tool_name,
                    "description": schema.get("description") or "Act in the environment.",
                    "parameters": params,
                },
            }
        return self._tool

    # -- the connection -------------------------------------------------------------------

    async def _connect(self, session: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
        self._check_literal(self._ws_url)
        path = urlsplit(self._ws_url).path.encode()
        try:
            async with asyncio.timeout(self.target.timeout_s):
                return await session.ws_connect(
                    self._ws_url,
                    headers=self._signed(path),
                    max_msg_size=MAX_ANSWER_BYTES,
                    autoping=True,
                    heartbeat=None,
                )
        except AddressRefused as exc:
            raise WebhookAddressRefused(self.target.id, f"no connection to /ws: {exc}") from None
        except aiohttp.WSServerHandshakeError as exc:
            raise WebhookUnavailable(
                self.target.id,
                f"{self._ws_url} refused the WebSocket ({exc.status}): is it an OpenEnv "
                "server made with create_app, at the registered URL?",
            ) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise WebhookUnavailable(self.target.id, f"no connection to /ws: {exc!r}") from None

    async def _exchange(self, episode: _Episode, message: dict[str, Any], what: str) -> Any:
        """Send one message and read its answer's ``data``, within the target's timeout."""
        ws = episode.ws
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.target.timeout_s):
                await ws.send_str(json.dumps(message))
                reply = await ws.receive()
        except TimeoutError:
            raise WebhookUnavailable(
                self.target.id,
                f"no answer to {what} within timeout_s={self.target.timeout_s}s "
                f"({time.monotonic() - started:.1f}s)",
            ) from None
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise WebhookUnavailable(self.target.id, f"{what} failed: {exc!r}") from None
        if reply.type != aiohttp.WSMsgType.TEXT:
            raise WebhookUnavailable(
                self.target.id, f"the connection ended before the {what} answer ({reply.type!r})"
            )
        try:
            body = json.loads(reply.data)
        except ValueError:
            raise self._protocol(f"the {what} answer is not JSON") from None
        kind = body.get("type") if isinstance(body, dict) else None
        data = body.get("data") if isinstance(body, dict) else None
        if kind == "error":
            problem = data if isinstance(data, dict) else {}
            hint = (
                " (check environment.config.action_field / action_fixed against the "
                "server's Action type, GET /schema)"
                if problem.get("code") == "VALIDATION_ERROR"
                else ""
            )
            raise EnvironmentFailure(
                f"{OPENENV} {self.target.id}: {what} refused: "
                f"{problem.get('code', '?')}: {problem.get('message', data)}{hint}"
            )
        if kind != "observation" or not isinstance(data, dict):
            raise self._protocol(f"the {what} answer is {kind!r}, not an observation")
        return data

    def _check_literal(self, url: str) -> None:
        """An IP-literal host never reaches the resolver: check it here (as the transport does)."""
        host = urlsplit(url).hostname or ""
        literal = ip_literal(host)
        why = None if literal is None else self.target.allowlist.refusal(host, [literal])
        if why is not None:
            raise WebhookAddressRefused(self.target.id, f"refused to connect: {why}")

    def _signed(self, path: bytes) -> dict[str, str]:
        # A local run's server (config.url) has no registered secret: nothing to prove.
        return {HEADER: sign(self.target.secret, path)} if self.target.secret else {}

    def _protocol(self, message: str) -> WebhookProtocolError:
        return WebhookProtocolError(self.target.id, f"{message} (an OpenEnv server's /ws)")

    def _bind(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._session is None or self._slots is None:
            self._loop = loop
            connector = aiohttp.TCPConnector(
                # One connection per episode, and one more for GET /schema.
                limit=self.target.max_concurrency + 1,
                resolver=CheckingResolver(self.target.allowlist),
                ssl=tls_context(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None),
                trust_env=False,  # a proxy for the worker's own traffic must not see these
            )
            self._slots = asyncio.Semaphore(self.target.max_concurrency)
        return self._session, self._slots


def _reward(answer: Mapping[str, Any]) -> float:
    reward = answer.get("reward")
    if isinstance(reward, bool):  # OpenEnv allows bool rewards; True is 1
        return float(reward)
    return float(reward) if isinstance(reward, int | float) else 0.0


__all__ = ["OpenEnvEnvironment"]
