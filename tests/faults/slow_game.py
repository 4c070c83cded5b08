"""The demo game, slow to answer a step: served with ``--defer-after`` below its delay,
every step is deferred (answered 202, its result posted to the control plane later)."""

from __future__ import annotations

import asyncio

from rl_core.envs.base import Action, Step
from rl_core.envs.guess_number import GuessNumber

STEP_DELAY_S = 0.3


class SlowGuessNumber(GuessNumber):
    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        await asyncio.sleep(STEP_DELAY_S)
        return await super().step(episode_id, step, action)
