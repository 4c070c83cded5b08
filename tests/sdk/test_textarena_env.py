"""examples/textarena_env.py (TextArena's games, as a user adapts them) behind the SDK's
server, played over real HTTP by the worker's webhook client."""

from __future__ import annotations

import asyncio
import re
import sys
from functools import reduce
from operator import xor
from pathlib import Path

import pytest

from rl_core.envs import Action
from rl_core.envs.errors import WebhookRejected
from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import WebhookCallSpec
from sdk.envserver import EnvServer
from tests.sdk.serving import SECRET, serving

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from textarena_env import TextArena


def _client(url: str) -> WebhookEnvironment:
    target = WebhookTarget(
        id="env_ta", url=url, secret=SECRET, timeout_s=10.0, max_concurrency=8,
        allowlist=Allowlist.parse("loopback", embedded=False),
    )  # fmt: skip
    return WebhookEnvironment(target, policy=WebhookCallSpec(backoff_s=0.01))


def _piles(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"pile \d+: (\d+)", text)][-3:]


def test_guess_the_number_is_won_by_binary_search_and_scored_by_closeness_otherwise() -> None:
    async def main(url: str) -> None:
        env = _client(url)
        config = {"game": "GuessTheNumber-v0"}
        reset = await env.reset("g1", 7, config)
        assert "between 1 and 20" in reset.messages[0]["content"]
        low, high, step = 1, 20, 0
        while True:
            guess = (low + high) // 2
            step += 1
            result = await env.step("g1", step, Action(content=f"I guess [{guess}]."))
            if result.done:
                break
            assert result.reward == 0.0
            hint = result.messages[0]["content"]
            assert "higher" in hint or "lower" in hint
            low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
        assert (result.reward, step <= 5) == (1.0, True)
        # A player who repeats a guess is warned once, then the game ends, scored by how
        # close its last valid guess was (TextArena's own rule).
        await env.reset("g2", 7, config)
        first = await env.step("g2", 1, Action(content="[1]"))
        again = await env.step("g2", 2, Action(content="[1]"))
        assert "already guessed" in again.messages[0]["content"] and not again.done
        end = await env.step("g2", 3, Action(content="[1]"))
        assert first.messages and end.done and 0.0 <= end.reward < 1.0
        await env.aclose()

    with serving(EnvServer(TextArena(), secret=SECRET).app) as url:
        asyncio.run(main(url))


def test_nim_against_random_moves_is_won_by_the_xor_rule_every_time() -> None:
    async def play(env: WebhookEnvironment, episode: str, seed: int) -> float:
        reset = await env.reset(episode, seed, {"game": "Nim-v0", "opponent": "random"})
        piles, step = _piles(reset.messages[0]["content"]), 0
        while True:
            total = reduce(xor, piles)
            i = next(i for i, p in enumerate(piles) if p ^ total < p)
            step += 1
            result = await env.step(
                episode, step, Action(content=f"[{i} {piles[i] - (piles[i] ^ total)}]")
            )
            if result.done:
                return result.reward
            text = result.messages[0]["content"]
            assert "Player 1 removes" in text
            piles = _piles(text)

    async def main(url: str) -> None:
        env = _client(url)
        rewards = await asyncio.gather(*(play(env, f"n{s}", s) for s in range(6)))
        assert rewards == [1.0] * 6
        await env.aclose()

    with serving(EnvServer(TextArena(), secret=SECRET).app) as url:
        asyncio.run(main(url))


def test_a_config_the_adapter_cannot_play_is_refused_with_the_reason() -> None:
    async def main(url: str) -> None:
        env = _client(url)
        with pytest.raises(WebhookRejected, match=r"config\.game 'NoSuchGame-v0'"):
            await env.reset("x1", 0, {"game": "NoSuchGame-v0"})
        with pytest.raises(WebhookRejected, match=r"config\.opponent"):
            await env.reset("x2", 0, {"game": "GuessTheNumber-v0", "opponent": "random"})
        await env.aclose()

    with serving(EnvServer(TextArena(), secret=SECRET).app) as url:
        asyncio.run(main(url))
