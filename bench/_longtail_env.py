"""B12's webhook environment: the long-tail workload behind `sdk.envserver`, timing itself.

    RLAAS_ENV_SECRET=... .venv/bin/python -m bench._longtail_env --port 9000

Written the way a client writes one: an `rl_core` Environment (async reset,
step, close) served by the SDK's `EnvServer` under uvicorn, in a process of
its own. The workload is docs/benchmarks.md's ``long-tail`` (B11's): each
step sleeps a lognormal time (median 50 ms, log-sd 1.0); the number of turns
is lognormal (median 12, log-sd 1.0, at most 32); both are drawn from the
reset seed with `rl_core.envs.simulated.plan_episode`, so a run's seed
gives the plans B11 plays with it.

The reward pays 1/turns for each turn played, so an episode played to its end
earns 1. That is all the tiny model has to learn: ``builtin:tiny`` starts
from random weights, ends a turn (samples its end-of-turn token) within 8
tokens about one time in six, and the agent truncates an episode at the
first turn that does not end, so until the model has learned to end its turns
(9-16 steps at B12's learning rate) episodes last one or two turns,
not the workload's twelve. Once it has, every member of a group earns the
same and GRPO's advantages are zero: the policy stops moving and the
workload stays put for the rest of the run.

Observations are ``ok?`` (5 tokens of the builtin tokenizer): a 32-turn
episode stays under ~450 tokens, so train rows stay short and the trainer
does not set the pace of every configuration (B11 cut its rows to 256 for
the same reason, which a run through the API cannot do).

The server measures with its own clock (``time.time``, the clock of the
run's spans on the same machine), per run (the episode id's part before
``~``): each episode's reset arrival, the end of its last step (the step
that answered ``done``), its close, the sum of its own sleeps, its turns;
the calls it answered; and, every 50 ms, the episodes open (reset seen,
neither done nor closed), the calls so far and the seconds slept so far.
``GET /bench/stats`` returns them as JSON (unsigned: a benchmark's loopback
server, not part of the protocol).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from rl_core.envs.base import Action, Reset, Step
from rl_core.envs.simulated import SimConfig, plan_episode
from rl_core.errors import EnvironmentFailure
from sdk.envserver import EnvServer

SAMPLE_S = 0.05
PLAN = SimConfig(preset="long-tail")
PROMPT = "Reply with the word 'ok'."
AGAIN = "ok?"


@dataclasses.dataclass
class Episode:
    run: str
    seed: int
    latencies: tuple[float, ...]
    reset_t: float
    turns: int = 0
    env_s: float = 0.0  # the sum of its own sleeps, timed
    end_t: float | None = None  # the done step answered
    close_t: float | None = None

    @property
    def open(self) -> bool:
        return self.end_t is None and self.close_t is None

    def record(self, episode_id: str) -> list[Any]:
        return [episode_id, self.seed, self.reset_t, self.end_t, self.close_t, self.env_s,
                self.turns, len(self.latencies)]  # fmt: skip


class LongTail:
    """The environment; it keeps what it measured for ``/bench/stats``."""

    name = "long-tail"

    def __init__(self) -> None:
        self.episodes: dict[str, Episode] = {}
        self.calls: dict[str, int] = {}  # per run: resets + steps + closes answered
        # (t, episodes open, calls so far, seconds slept so far: all runs)
        self.samples: list[tuple[float, int, int, float]] = []
        self._open = 0
        self._slept = 0.0
        self._sampler: asyncio.Task[None] | None = None

    def _count(self, run: str) -> None:
        self.calls[run] = self.calls.get(run, 0) + 1

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        if self._sampler is None:  # started in the server's loop, by its first request
            self._sampler = asyncio.create_task(self._sample())
        if config:
            raise EnvironmentFailure(f"long-tail takes no config; got {sorted(config)}")
        run = episode_id.split("~", 1)[0]
        old = self.episodes.get(episode_id)
        if old is not None and old.open:  # a new episode under an old id: the old one ended
            self._open -= 1
        plan = plan_episode(PLAN, seed)
        self.episodes[episode_id] = Episode(run, seed, plan.latencies_s, time.time())
        self._open += 1
        self._count(run)
        return Reset(messages=[{"role": "user", "content": PROMPT}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        episode = self.episodes.get(episode_id)
        if episode is None:
            raise EnvironmentFailure(f"no episode {episode_id!r}; call reset first")
        if episode.turns >= len(episode.latencies):
            raise EnvironmentFailure(f"episode {episode_id!r} is already over")
        self._count(episode.run)
        delay = episode.latencies[episode.turns]
        episode.turns += 1
        t0 = time.perf_counter()
        await asyncio.sleep(delay)
        slept = time.perf_counter() - t0
        episode.env_s += slept
        self._slept += slept
        done = episode.turns >= len(episode.latencies)
        if done and episode.open:
            episode.end_t = time.time()
            self._open -= 1
        messages = [] if done else [{"role": "user", "content": AGAIN}]
        return Step(messages, 1.0 / len(episode.latencies), done)

    async def close(self, episode_id: str) -> None:
        episode = self.episodes.get(episode_id)
        if episode is None:
            return
        self._count(episode.run)
        if episode.open:
            self._open -= 1
        if episode.close_t is None:
            episode.close_t = time.time()

    async def _sample(self) -> None:
        while True:
            calls = sum(self.calls.values())
            self.samples.append((time.time(), self._open, calls, self._slept))
            await asyncio.sleep(SAMPLE_S)

    def stats(self, run: str | None) -> dict[str, Any]:
        episodes = [e.record(i) for i, e in self.episodes.items() if run in (None, e.run)]
        return {
            "fields": ["id", "seed", "reset_t", "end_t", "close_t", "env_s", "turns", "planned"],
            "episodes": episodes,
            "calls": self.calls.get(run, 0) if run else sum(self.calls.values()),
            "samples": self.samples,
        }


def build(secret: str) -> tuple[LongTail, EnvServer]:
    env = LongTail()
    # Past the oldest 10,000 the helper forgets episodes; a run here starts ~2,000.
    server = EnvServer(env, secret=secret, max_episodes=100_000)

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(env.stats(request.query_params.get("run")))

    server.app.add_route("/bench/stats", stats, methods=["GET"])
    return env, server


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret-env", default="RLAAS_ENV_SECRET")
    args = parser.parse_args()
    _, server = build(os.environ[args.secret_env])
    uvicorn.run(server.app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
