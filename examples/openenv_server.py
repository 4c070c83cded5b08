"""An OpenEnv environment for examples/openenv.yaml, written as OpenEnv's docs say.

``Say``: reset shows a number from 0 to 9 (from the reset seed); each of three steps
pays 1/3 when the message is that number. Serve it with openenv-core's own server
(``pip install openenv-core``)::

    python examples/openenv_server.py --port 8001
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

TURNS = 3


class SayAction(Action):
    message: str = Field(..., description="The number to say")


class SayObservation(Observation):
    prompt: str = Field(default="", description="What to say")


class SayEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # one instance per WebSocket session

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._target = "0"

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> SayObservation:
        self._target = str((seed or 0) % 10)
        self._state = State(episode_id=episode_id, step_count=0)
        return SayObservation(prompt=f"Say {self._target}", done=False, reward=None)

    def step(self, action: SayAction, **kwargs: Any) -> SayObservation:  # type: ignore[override]
        self._state.step_count += 1
        right = action.message.strip() == self._target
        return SayObservation(
            prompt=f"Say {self._target}",
            done=self._state.step_count >= TURNS,
            reward=1 / TURNS if right else 0.0,
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(SayEnvironment, SayAction, SayObservation, max_concurrent_envs=256)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)
