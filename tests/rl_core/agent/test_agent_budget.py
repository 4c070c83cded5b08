"""A spent failure budget ends the run, not just the episode.

An environment failure is normally the episode's own (it ends as
``env_error`` and is dropped from the batch); `FailureBudgetExhausted` says
the environment as a whole is failing, so the agent lets it through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from rl_core.envs import Action, Reset, Step
from rl_core.envs.errors import EnvironmentFailure, FailureBudgetExhausted
from rl_core.models.tokenizer import BuiltinTokenizer
from tests.rl_core.agent.test_agent import run


class FailingEnv:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        return Reset(messages=[{"role": "user", "content": "guess"}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        raise self.error

    async def close(self, episode_id: str) -> None:
        pass


def test_one_failed_step_ends_only_its_episode(tokenizer: BuiltinTokenizer) -> None:
    traj, _ = run(tokenizer, ["4"], env=FailingEnv(EnvironmentFailure("server said 503")))
    assert traj.end_state == "env_error"


def test_a_spent_failure_budget_is_raised_to_the_run(tokenizer: BuiltinTokenizer) -> None:
    spent = FailureBudgetExhausted("env_x", failed=6, started=10, allowed=5, last="timeout")
    with pytest.raises(FailureBudgetExhausted, match="failure budget"):
        run(tokenizer, ["4"], env=FailingEnv(spent))
