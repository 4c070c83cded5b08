"""The token ledger of an episode: what the trainer consumes, and how a person reads it.

An episode is one or more `Sample`s. A sample is a token sequence the model
really saw: the rendered prompt, then per turn the tokens the model produced
(exactly as the engine returned them, never re-tokenised) and the observation
tokens rendered after them. ``loss_mask`` is 1 exactly on model-produced tokens
and ``logprobs`` holds the sampler's logprob there (0 elsewhere).

A new sample starts when the chat template, rendering the whole conversation
for the next turn, no longer extends what came before (a template that
rewrites history, e.g. one that drops earlier reasoning): training on one
concatenated sequence would put the model's tokens after a context it never
saw. Every sample of an episode shares the episode's reward and advantage.

Pure Python: the agent and the control-plane-facing records need no JAX.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from rl_core.models.tokenizer import Tokenizer
from rl_core.records import EpisodeEnd, TextSegment, TrajectoryRecord

# End states whose episode stays in the batch: its reward means what it says.
# The others are infrastructure or bookkeeping outcomes, removed and counted.
KEPT_STATES: frozenset[EpisodeEnd] = frozenset({"done", "truncated"})
END_STATES: tuple[EpisodeEnd, ...] = ("done", "truncated", "timeout", "env_error", "cancelled")


@dataclasses.dataclass
class Sample:
    """One training sequence. The four lists are aligned.

    ``turns[i]`` is the turn (0-based) whose model call produced token i, and -1
    for observation tokens: turn-level credit gives each turn's tokens that
    turn's advantage.
    """

    tokens: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turns: list[int] = dataclasses.field(default_factory=list)

    def append_observation(self, ids: Sequence[int]) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.turns.extend([-1] * len(ids))

    def append_model(self, ids: Sequence[int], logprobs: Sequence[float], turn: int = 0) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} logprobs")
        self.tokens.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.turns.extend([turn] * len(ids))

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclasses.dataclass
class Trajectory:
    """One episode: its samples, its outcome, and where it is right now (for in-flight reports)."""

    episode_id: str
    group: int = 0
    member: int = 0
    samples: list[Sample] = dataclasses.field(default_factory=lambda: [Sample()])
    reward: float = 0.0
    turn_rewards: list[float] = dataclasses.field(default_factory=list)  # one per env step
    turns: int = 0
    end_state: EpisodeEnd = "truncated"
    end_reason: str | None = None
    policy_version: int = 0  # the policy that started the episode (its first model call)
    # The policy that sampled each model call (its first token), in turn order: an episode
    # in flight across weight updates goes on under the newer policies.
    turn_versions: list[int] = dataclasses.field(default_factory=list)
    sampling: dict[str, float | int] = dataclasses.field(default_factory=dict)
    error: str | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.monotonic)
    finished: float | None = None
    stage: str = "queued"  # what it waits on now: queued | env_step | model_call | finished
    stage_since: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def sample(self) -> Sample:
        """The sample new tokens go to."""
        return self.samples[-1]

    @property
    def kept(self) -> bool:
        return self.end_state in KEPT_STATES

    @property
    def model_tokens(self) -> int:
        return sum(s.model_tokens for s in self.samples)

    @property
    def oldest_version(self) -> int:
        return min(self.turn_versions, default=self.policy_version)

    @property
    def newest_version(self) -> int:
        return max(self.turn_versions, default=self.policy_version)

    @property
    def total_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.samples)

    @property
    def duration_s(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    # Single-sample views, for callers that know their template never splits.
    @property
    def tokens(self) -> list[int]:
        return [t for s in self.samples for t in s.tokens]

    @property
    def loss_mask(self) -> list[int]:
        return [m for s in self.samples for m in s.loss_mask]

    @property
    def logprobs(self) -> list[float]:
        return [p for s in self.samples for p in s.logprobs]

    def enter(self, stage: str) -> None:
        self.stage, self.stage_since = stage, time.monotonic()

    def end(self, state: EpisodeEnd, reason: str | None) -> None:
        self.end_state, self.end_reason = state, reason
        self.finished = time.monotonic()
        self.enter("finished")

    def to_record(self, tokenizer: Tokenizer, *, step: int) -> TrajectoryRecord:
        """The readable form: decoded text split where the loss mask changes."""
        return TrajectoryRecord(
            episode_id=self.episode_id,
            step=step,
            policy_version=self.policy_version,
            group=self.group,
            reward=self.reward,
            turns=self.turns,
            end_state=self.end_state,
            end_reason=self.end_reason,
            model_tokens=self.model_tokens,
            total_tokens=self.total_tokens,
            duration_s=round(self.duration_s, 6),
            segments=tuple(seg for s in self.samples for seg in segments(s, tokenizer)),
            sampling=dict(self.sampling),
            info={**_jsonable(self.info), **({"error": self.error} if self.error else {})},
        )


def segments(sample: Sample, tokenizer: Tokenizer) -> list[TextSegment]:
    """Runs of equal mask, decoded with special tokens kept (role markers are readable)."""
    out: list[TextSegment] = []
    start = 0
    for i in range(1, len(sample.tokens) + 1):
        if i == len(sample.tokens) or sample.loss_mask[i] != sample.loss_mask[start]:
            text = tokenizer.decode(sample.tokens[start:i], skip_special=False)
            out.append(TextSegment(text=text, trained=bool(sample.loss_mask[start])))
            start = i
    return out


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    # Environment info is free-form; keep what JSON can carry, stringify the rest.
    out: dict[str, Any] = {}
    for key, value in info.items():
        if value is None or isinstance(value, str | int | float | bool | list | dict):
            out[str(key)] = value
        else:
            out[str(key)] = repr(value)
    return out


__all__ = ["END_STATES", "KEPT_STATES", "Sample", "Trajectory", "segments"]
