"""The calls of one session, and their assembly into a trajectory by token prefix.

Each call is recorded as the engine saw it: the prompt token ids, the completion
token ids and their sampler logprobs, the policy version that sampled it and the
engine's finish reason (a completion cut at a client's stop string is recorded as cut,
`rl_core.sessions.stop`: the tokens up to the stop string's, finish reason ``stop``).
The calls become `Sample`s (`rl_core.agent.ledger`) by one rule, on token ids only:

- a call whose prompt **starts with** the previous call's prompt + completion
  extends the current sample: the prompt's new tokens after that prefix are
  observation tokens (loss mask 0: the tool results, the next user turn, the
  template's markers), then the completion's tokens are model tokens (loss mask 1,
  their logprobs, the call's index as their turn);
- any other call starts a new sample with its whole prompt as observation, and is
  counted as a **prefix break** (`PrefixBreak`: where its prompt departs, and
  whether inside the previous prompt, ``history``: the client edited or dropped an
  earlier message, or the template rewrote one; or after it, ``reply``: the
  previous answer came back rendered to other tokens, was edited, or was left out
  as by a retry). A break is never patched by re-tokenising anything: each
  sample holds exactly the tokens one call's model saw.

So the current sample's tokens are always the last call's prompt + completion.
The trajectory's ``turn_versions`` has one entry per call (the version that
sampled it, which the pipeline's staleness gate reads), and a model token's turn
indexes it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from rl_core.agent.ledger import Sample, Trajectory
from rl_core.records import EpisodeEnd
from rl_core.rollout.base import Completion, SamplingParams


@dataclasses.dataclass(frozen=True)
class CallRecord:
    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_version: int
    finish_reason: Literal["stop", "length"]  # stop: on a stop token (its last) or a stop string
    # The sampler the completion was drawn with (None: the run's), and whether under a
    # grammar's mask: the logprobs are under that distribution.
    sampling: SamplingParams | None = None
    constrained: bool = False


@dataclasses.dataclass(frozen=True)
class PrefixBreak:
    call: int  # the call that started a new sample
    at: int  # the first position where its prompt departs from the previous prompt + completion
    where: Literal["history", "reply"]  # before the end of the previous prompt, or after it


class SessionLedger:
    """Records calls in the order they are given; `trajectory` assembles them."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []
        self.samples: list[Sample] = []
        self.breaks: list[PrefixBreak] = []
        self.started = time.monotonic()

    @property
    def prefix_breaks(self) -> int:
        return len(self.breaks)

    def record(
        self,
        prompt: Sequence[int],
        completion: Completion,
        *,
        sampling: SamplingParams | None = None,
        constrained: bool = False,
    ) -> int:
        """Add one call; returns its index (its turn)."""
        if not prompt:
            raise ValueError("a call's prompt cannot be empty")
        if len(completion.tokens) != len(completion.logprobs):
            raise ValueError(
                f"{len(completion.tokens)} completion tokens but "
                f"{len(completion.logprobs)} logprobs"
            )
        call = CallRecord(
            prompt=tuple(prompt),
            completion=tuple(completion.tokens),
            logprobs=tuple(completion.logprobs),
            policy_version=completion.policy_version,
            finish_reason=completion.finish_reason,
            sampling=sampling,
            constrained=constrained,
        )
        turn = len(self.calls)
        if self.samples and _starts_with(call.prompt, self.samples[-1].tokens):
            sample = self.samples[-1]
            sample.append_observation(call.prompt[len(sample.tokens) :])
        else:
            if self.samples:
                self.breaks.append(self._break(turn, call.prompt))
            sample = Sample()
            self.samples.append(sample)
            sample.append_observation(call.prompt)
        sample.append_model(call.completion, call.logprobs, turn)
        self.calls.append(call)
        return turn

    def trajectory(
        self,
        episode_id: str,
        *,
        reward: float,
        turn_rewards: Sequence[float] | None = None,
        end_state: EpisodeEnd = "done",
        end_reason: str | None = "client_done",
        sampling: Mapping[str, float | int] | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> Trajectory:
        """The session as one episode.

        ``reward`` is the episode's; ``turn_rewards``, when given, has one reward per
        call (what that call's answer earned) and sums to ``reward``. Without them the
        whole reward goes to the last call, so that turn-level credit sees the same
        episode (every turn's return-to-go is ``reward``).
        """
        if not self.calls:
            raise ValueError("the session has no calls: there is nothing to train on")
        rewards = _turn_rewards(reward, turn_rewards, len(self.calls))
        traj = Trajectory(
            episode_id=episode_id,
            samples=copy.deepcopy(self.samples),
            reward=float(reward),
            turn_rewards=rewards,
            turns=len(self.calls),
            policy_version=self.calls[0].policy_version,
            turn_versions=[c.policy_version for c in self.calls],
            sampling=dict(sampling or {}),
            info={**(info or {}), "calls": len(self.calls), "prefix_breaks": self.prefix_breaks},
            started=self.started,
        )
        traj.end(end_state, end_reason)
        return traj

    def _break(self, turn: int, prompt: tuple[int, ...]) -> PrefixBreak:
        before = self.calls[-1]
        expected = before.prompt + before.completion
        at = next(
            (i for i, (a, b) in enumerate(zip(prompt, expected, strict=False)) if a != b),
            min(len(prompt), len(expected)),
        )
        return PrefixBreak(
            call=turn, at=at, where="history" if at < len(before.prompt) else "reply"
        )


def _starts_with(ids: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(ids) >= len(prefix) and list(ids[: len(prefix)]) == list(prefix)


def _turn_rewards(reward: float, given: Sequence[float] | None, calls: int) -> list[float]:
    if not math.isfinite(reward):
        raise ValueError(f"reward must be a finite number, not {reward}")
    if given is None:
        return [0.0] * (calls - 1) + [float(reward)]
    rewards = [float(r) for r in given]
    if len(rewards) != calls:
        raise ValueError(f"turn_rewards has {len(rewards)} values; the session has {calls} calls")
    if not all(math.isfinite(r) for r in rewards):
        raise ValueError("turn_rewards must be finite numbers")
    if not math.isclose(sum(rewards), reward, rel_tol=1e-6, abs_tol=1e-6):
        raise ValueError(
            f"turn_rewards sum to {sum(rewards)}, not to the reward {reward}: turn-level and "
            "episode-level credit would train on different outcomes"
        )
    return rewards


__all__ = ["CallRecord", "PrefixBreak", "SessionLedger"]
