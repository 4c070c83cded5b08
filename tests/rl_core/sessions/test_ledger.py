"""The session ledger on token ids alone: extension, prefix breaks, rewards, versions."""

from __future__ import annotations

import math

import pytest

from rl_core.rollout.base import Completion
from rl_core.sessions.ledger import PrefixBreak, SessionLedger


def sampled(tokens: list[int], version: int = 0, logprob: float = -0.5) -> Completion:
    return Completion(
        tokens=tokens,
        logprobs=[logprob * (i + 1) for i in range(len(tokens))],
        finish_reason="stop",
        policy_version=version,
    )


def test_calls_that_extend_make_one_sample_with_model_tokens_masked_in() -> None:
    ledger = SessionLedger()
    ledger.record([1, 2, 3], sampled([10, 11], version=4))
    ledger.record([1, 2, 3, 10, 11, 5, 6], sampled([12], version=5, logprob=-0.25))
    ledger.record([1, 2, 3, 10, 11, 5, 6, 12], sampled([13, 14], version=5))  # no observation
    (sample,) = ledger.samples
    assert sample.tokens == [1, 2, 3, 10, 11, 5, 6, 12, 13, 14]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert sample.logprobs == [0, 0, 0, -0.5, -1.0, 0, 0, -0.25, -0.5, -1.0]
    assert sample.turns == [-1, -1, -1, 0, 0, -1, -1, 1, 2, 2]
    assert ledger.prefix_breaks == 0

    traj = ledger.trajectory("s", reward=2.0)
    assert traj.samples == ledger.samples and traj.samples[0] is not sample  # a copy
    assert traj.turns == 3 and traj.turn_versions == [4, 5, 5] and traj.policy_version == 4
    assert traj.turn_rewards == [0.0, 0.0, 2.0] and traj.reward == 2.0
    assert traj.end_state == "done" and traj.kept and traj.finished is not None
    assert traj.info == {"calls": 3, "prefix_breaks": 0}


def test_a_prompt_that_departs_starts_a_new_sample_and_says_where() -> None:
    ledger = SessionLedger()
    ledger.record([1, 2, 3], sampled([10, 11]))
    ledger.record([1, 2, 3, 10, 99, 5], sampled([12]))  # the answer came back otherwise
    ledger.record([1, 7, 3, 10, 99, 5, 12, 6], sampled([13]))  # an earlier message edited
    ledger.record([1, 7, 3, 10, 99, 5, 12, 6], sampled([14]))  # the same prompt again (retry)
    assert ledger.breaks == [
        PrefixBreak(call=1, at=4, where="reply"),
        PrefixBreak(call=2, at=1, where="history"),
        PrefixBreak(call=3, at=8, where="reply"),
    ]
    assert [s.tokens for s in ledger.samples] == [
        [1, 2, 3, 10, 11],
        [1, 2, 3, 10, 99, 5, 12],
        [1, 7, 3, 10, 99, 5, 12, 6, 13],
        [1, 7, 3, 10, 99, 5, 12, 6, 14],
    ]
    assert [s.turns[-1] for s in ledger.samples] == [0, 1, 2, 3]
    assert [sum(s.loss_mask) for s in ledger.samples] == [len(c.completion) for c in ledger.calls]
    traj = ledger.trajectory("s", reward=1.0, turn_rewards=[0.25, 0.25, 0.0, 0.5])
    assert traj.info["prefix_breaks"] == 3 and len(traj.samples) == 4
    assert traj.turn_rewards == [0.25, 0.25, 0.0, 0.5]


def test_a_shorter_prompt_breaks_at_its_end() -> None:
    ledger = SessionLedger()
    ledger.record([1, 2, 3], sampled([10]))
    ledger.record([1, 2], sampled([11]))
    assert ledger.breaks == [PrefixBreak(call=1, at=2, where="history")]


@pytest.mark.parametrize(
    ("reward", "turn_rewards", "problem"),
    [
        (1.0, [1.0], "2 calls"),
        (1.0, [0.5, 0.25], "sum to 0.75"),
        (math.nan, None, "finite"),
        (1.0, [math.inf, -math.inf], "finite"),
    ],
)
def test_rewards_must_describe_the_same_episode(
    reward: float, turn_rewards: list[float] | None, problem: str
) -> None:
    ledger = SessionLedger()
    ledger.record([1], sampled([2]))
    ledger.record([1, 2, 3], sampled([4]))
    with pytest.raises(ValueError, match=problem):
        ledger.trajectory("s", reward=reward, turn_rewards=turn_rewards)


def test_what_cannot_be_recorded() -> None:
    ledger = SessionLedger()
    with pytest.raises(ValueError, match="nothing to train on"):
        ledger.trajectory("s", reward=0.0)
    with pytest.raises(ValueError, match="empty"):
        ledger.record([], sampled([1]))
    with pytest.raises(ValueError, match="2 completion tokens but 1 logprobs"):
        ledger.record([1], Completion([1, 2], [0.0], "stop", 0))
    assert ledger.calls == [] and ledger.samples == []
