"""A group's ``judge`` term, applied to its trajectories once all its members have ended.

The collector (training groups) and the evaluator (a task's samples) call
`judge_trajectories` between a group's last episode and its use: the environment
(`rl_core.envs.scored.Scored`) makes the one judge call for the group, and here each
answer's weighted score is added to its episode's reward (the last turn's, where the
episode ended), or the episode is failed with the judge's reason (``env_error``,
``judge_<reason>``): removed from its group like any failed episode, never trained as 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_core.agent.ledger import Trajectory
from rl_core.envs.judge import JudgeFailed


def judges_groups(env: Any) -> bool:
    """Whether ``env`` scores a term over whole groups (a `Scored` with a judge)."""
    return getattr(env, "judge", None) is not None and hasattr(env, "judge_group")


def judge_spent(env: Any) -> dict[str, int] | None:
    """What the run's judge has spent (calls, tokens), for the collector's checkpointed
    position, so a resumed attempt goes on counting against the same budget."""
    if not judges_groups(env):
        return None
    return {"calls": env.judge.calls, "tokens": env.judge.tokens}


def restore_judge_spent(env: Any, spent: Any) -> None:
    """The spending a checkpoint saved (`judge_spent`), given back to a new attempt's judge."""
    if judges_groups(env) and isinstance(spent, dict):
        env.judge.calls = int(spent.get("calls", 0))
        env.judge.tokens = int(spent.get("tokens", 0))


async def judge_trajectories(env: Any, trajectories: Sequence[Trajectory]) -> str | None:
    """Score the group's answers in one call and apply the results; the first failure's
    message (for the run's error when its groups are all lost), else None."""
    ids = [t.episode_id for t in trajectories]
    try:
        results = await env.judge_group(ids)
    finally:
        env.forget(ids)  # a cancelled call leaves no answers waiting
    first_error: str | None = None
    for traj in trajectories:
        result = results.get(traj.episode_id)
        if result is None:
            continue
        if isinstance(result, JudgeFailed):
            traj.error = f"reward 'judge' {result.reason}: {result}"
            traj.end_state, traj.end_reason = "env_error", f"judge_{result.reason}"
            first_error = first_error or f"{traj.end_reason}: {traj.error}"
            continue
        traj.reward += result
        if traj.turn_rewards:
            traj.turn_rewards[-1] += result
        terms = traj.info.get("reward_terms")
        traj.info["reward_terms"] = {**(terms if isinstance(terms, dict) else {}), "judge": result}
    return first_error


__all__ = ["judge_spent", "judge_trajectories", "judges_groups", "restore_judge_spent"]
