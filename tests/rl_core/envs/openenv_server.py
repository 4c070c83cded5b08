"""An OpenEnv environment written as OpenEnv's docs say (an Action, an Observation, an
Environment; ``create_app``), served by openenv-core's own server on loopback.

``Say``: reset shows a number (the seed modulo 3); each of two steps pays 1.0 when the
message is that number. The number lives in the environment instance, so a step that
reached a fresh instance (OpenEnv's stateless ``POST /step``) could not pay; only the
episode's own ``/ws`` session can. The server records what it paid, by episode id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from rl_core.protocol.signing import HEADER, SignatureError, verify
from tests.sdk.serving import serving

TURNS = 2
PAID: dict[str, list[float]] = {}  # episode id -> the rewards its steps got


class SayAction(Action):
    """What the agent says."""

    message: str = Field(..., description="The number to say")


class SayObservation(Observation):
    prompt: str = Field(default="", description="What to say")
    heard: str = Field(default="", description="What the environment heard")


class SayEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._target = ""

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> SayObservation:
        self._target = str((seed or 0) % 3)
        self._state = State(episode_id=episode_id, step_count=0)
        PAID[episode_id or ""] = []
        prefix = kwargs.get("prefix", "Say")
        return SayObservation(prompt=f"{prefix} {self._target}", done=False, reward=None)

    def step(self, action: SayAction, **kwargs: Any) -> SayObservation:  # type: ignore[override]
        self._state.step_count += 1
        reward = 1.0 if action.message.strip() == self._target else 0.0
        PAID[self._state.episode_id or ""].append(reward)
        return SayObservation(
            prompt=f"Say {self._target}",
            heard=action.message,
            done=self._state.step_count >= TURNS,
            reward=reward,
        )

    @property
    def state(self) -> State:
        return self._state


class SignedOnly:
    """ASGI middleware in front of the OpenEnv app: refuses a WebSocket whose upgrade
    lacks a valid ``X-Rlaas-Signature`` over its path (what a tenant's proxy can do with
    the registered secret; OpenEnv's server checks nothing itself)."""

    def __init__(self, app: Any, secret: str) -> None:
        self.app, self.secret = app, secret
        self.refused = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            try:
                verify(self.secret, scope["path"].encode(), headers.get(HEADER.lower()))
            except SignatureError:
                self.refused += 1
                await send({"type": "websocket.close", "code": 1008})
                return
        await self.app(scope, receive, send)


def app() -> Any:
    return create_app(SayEnvironment, SayAction, SayObservation, max_concurrent_envs=64)


@contextlib.contextmanager
def say_server(secret: str) -> Iterator[tuple[str, SignedOnly]]:
    """The server behind a proxy that checks rlaas's signature with ``secret``."""
    served = SignedOnly(app(), secret)
    with serving(served) as url:
        yield url, served


@contextlib.contextmanager
def bare_say_server() -> Iterator[str]:
    """The server as OpenEnv serves it, nothing in front."""
    with serving(app()) as url:
        yield url
