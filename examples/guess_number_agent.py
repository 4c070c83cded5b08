"""The demo game played by your own agents: ``guess_number`` on the client's side.

    .venv/bin/python examples/guess_number_agent.py --out runs/tiny-sessions
    .venv/bin/python examples/guess_number_agent.py --url URL --token TOKEN  # a run serving

Starts ``rlaas train`` on ``examples/tiny-game.yaml`` turned into a ``sessions`` run
(the run serves the policy; it plays no environment), then plays the game against it
from here: many agents at once, each written against the official ``openai`` package
only (``openai.AsyncOpenAI`` at a session's URL; sessions opened and ended with plain
HTTP, docs/sessions.md), every other answer streamed. The game's rules and rewards are
the built-in environment's (`rl_core.envs.guess_number`), driven from the client, so
a sessions run can be compared with the built-in one (bench S2) and learns as it does
(tests/worker/test_sessions_learning.py).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml

from rl_core.envs.base import Action
from rl_core.envs.guess_number import GuessNumber

HERE = Path(__file__).resolve().parent


class GuessNumberAgents:
    """Agents playing ``config``'s game through the sessions of the gateway at ``url``;
    the sessions of one game share a GRPO group (``group_size`` of them)."""

    def __init__(self, url: str, token: str, config: dict[str, Any], group_size: int) -> None:
        self.url, self.token, self.config, self.group_size = url, token, config, group_size
        self.game = GuessNumber()  # the rules and rewards, as the built-in run has them
        self.played: list[float] = []  # each finished episode's reward
        self.stop = asyncio.Event()

    async def run(self, agents: int) -> None:
        """Play until `stop` is set; an agent's error ends the run unless stopping."""
        # aiohttp under both clients: httpx's own pool scans every connection per request,
        # and with an agent each, that was most of this process's CPU.
        connector = aiohttp.TCPConnector(limit=0)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            openai.AsyncOpenAI(
                base_url=self.url, api_key="-", http_client=openai.DefaultAioHttpClient()
            ) as llm,
        ):
            games = itertools.count()
            await asyncio.gather(*(self._agent(http, llm, games) for _ in range(agents)))

    async def _agent(
        self, http: aiohttp.ClientSession, llm: openai.AsyncOpenAI, games: itertools.count[int]
    ) -> None:
        while not self.stop.is_set():
            index = next(games)
            try:
                self.played.append(await self._play(http, llm, index))
            except (aiohttp.ClientConnectionError, openai.APIConnectionError):
                self.stop.set()  # the run has ended: its gateway is gone
            except (aiohttp.ClientError, openai.APIError):
                if not self.stop.is_set():  # the run ending under open sessions is expected
                    raise

    async def _play(
        self, http: aiohttp.ClientSession, llm: openai.AsyncOpenAI, index: int
    ) -> float:
        game = index // self.group_size
        while True:
            async with http.post(
                f"{self.url}/v1/sessions",
                json={"group": f"game-{game}", "wait_s": 10},
                headers={"Authorization": f"Bearer {self.token}"},
            ) as opened:
                if opened.status != 429:  # 429: every episode is taken; ask again
                    opened.raise_for_status()
                    session = await opened.json()
                    break
        chat = llm.with_options(base_url=session["base_url"], api_key=session["api_key"])
        episode = f"episode-{index}"
        reset = await self.game.reset(episode, seed=game, config=self.config)
        messages: list[Any] = list(reset.messages)
        rewards: list[float] = []  # one per call
        for turn in range(self.config["max_turns"]):
            text, finish = await _ask(chat, messages, stream=turn % 2 == 1)
            messages.append({"role": "assistant", "content": text})
            if finish == "length":
                rewards.append(0.0)  # a turn that never ended is no answer
                break
            step = await self.game.step(episode, turn + 1, Action(content=text))
            rewards.append(step.reward)
            if step.done:
                break
            messages.extend(step.messages)
        await self.game.close(episode)
        async with http.post(
            f"{session['base_url']}/end",
            json={"reward": sum(rewards), "turn_rewards": rewards},
            headers={"Authorization": f"Bearer {session['api_key']}"},
        ) as ended:
            ended.raise_for_status()
        return sum(rewards)


async def _ask(chat: openai.AsyncOpenAI, messages: list[Any], *, stream: bool) -> tuple[str, str]:
    """One model call: the answer's text and finish reason, streamed or not."""
    if not stream:
        answer = await chat.chat.completions.create(model="policy", messages=messages)
        choice = answer.choices[0]
        return choice.message.content or "", str(choice.finish_reason)
    parts, finish = [], ""
    chunks = await chat.chat.completions.create(model="policy", messages=messages, stream=True)
    async for chunk in chunks:
        for delta in chunk.choices:
            parts.append(delta.delta.content or "")
            finish = delta.finish_reason or finish
    return "".join(parts), finish


def sessions_spec(example: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``example`` (a guess_number spec) as a sessions run, and its game's config."""
    spec = yaml.safe_load(example.read_text())
    game = spec["environment"].get("config", {})
    spec["environment"] = {"name": "sessions"}
    spec["name"] = f"{spec.get('name', 'run')}-sessions"
    return spec, game


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/tiny-sessions"))
    parser.add_argument("--spec", type=Path, default=HERE / "tiny-game.yaml")
    parser.add_argument("--url", help="play at this gateway (a run already serving) ...")
    parser.add_argument("--token", help="... with its token, instead of starting a run")
    parser.add_argument("--agents", type=int, help="games at once (rollout.concurrency)")
    args = parser.parse_args()
    spec, game = sessions_spec(args.spec)
    rollout = spec.get("rollout", {})
    if args.url:
        agents = GuessNumberAgents(args.url, args.token, game, rollout["group_size"])
        asyncio.run(play(agents, args.agents or rollout["concurrency"], lambda: True))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    where = args.out / "sessions.json"
    where.unlink(missing_ok=True)  # a file left by an earlier run
    spec_path = args.out / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "sdk.cli", "train", str(spec_path), "--out", str(args.out)]
    train = subprocess.Popen(command)
    # Killed, this script takes its run with it (a SIGTERM would skip the `finally`).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        while not where.exists():
            if train.poll() is not None:
                return train.returncode
            time.sleep(0.2)
        served = json.loads(where.read_text())
        agents = GuessNumberAgents(served["url"], served["token"], game, rollout["group_size"])

        def serving() -> bool:  # the run removes sessions.json when its gateway closes
            return train.poll() is None and where.exists()

        asyncio.run(play(agents, args.agents or rollout["concurrency"], serving))
        return train.wait()
    finally:
        if train.poll() is None:
            train.terminate()
            train.wait(60)


async def play(agents: GuessNumberAgents, n: int, serving: Callable[[], bool]) -> None:
    """``n`` agents at once while ``serving()``, printing how the last 256 games went."""
    playing = asyncio.create_task(agents.run(n))
    reported = 0
    while serving() and not playing.done():
        await asyncio.sleep(1)
        if len(agents.played) >= reported + 256:
            reported = len(agents.played)
            last = agents.played[-256:]
            print(f"{reported} games, the last 256 earned {sum(last) / 256:.3f}", flush=True)
    agents.stop.set()
    if serving():
        await playing  # an agent failed while the run serves: say why
    else:
        await asyncio.gather(playing, return_exceptions=True)  # cut short by the run's end


if __name__ == "__main__":
    sys.exit(main())
