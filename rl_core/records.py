"""What a run reports besides step metrics: spans, trajectories, checkpoints, in-flight work.

These are the records that cross the boundary between the RL core and whatever
listens to it (a JSONL file, the control plane over HTTP, a test). They are
plain frozen dataclasses with a ``to_json`` that gives the exact wire shape the
worker posts to ``/internal/runs/{id}/...``, so the control plane, the worker and
the files written by ``rlaas train`` all agree on one format. Pure Python: the
control plane may import this module (it imports no JAX).

The wire shape is validated by the models of ``rl_core.protocol.internal``
(``SpanIn``, ``TrajectoryIn``, ``InflightIn``, ...); these stay dataclasses
because the pipeline makes them on its hot path, where validation would cost
for nothing (tests/rl_core/protocol/test_records_wire.py holds the two to one shape).

Times are integers in microseconds. ``start_us`` is wall-clock (Unix epoch),
so spans from several processes line up on one timeline; durations come from
a monotonic clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

# The stage names of the run timeline (README.md). The same names annotate jax.profiler traces.
STAGES = (
    "rollout",  # one whole episode, reset to close
    "model_call",  # one generate call of one episode (its wait for the engine included)
    "env_step",  # one environment reset/step/close call
    "reward",  # scoring a finished episode, where that is separate from the env
    "queue_wait",  # the trainer waiting for enough trajectories
    "train_step",  # one optimiser step (all its mini-batches)
    "weight_sync",  # pushing new weights to the rollout engine
    "engine_paused",  # the engine serving no request while it loads new weights (vLLM)
    "engine_batch",  # one device call of the rollout engine (prefill or decode chunk)
    "checkpoint",  # saving a checkpoint
)
Stage = str

EpisodeEnd = Literal["done", "truncated", "timeout", "env_error", "cancelled"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One timed stage. ``track`` groups spans into rows of the timeline.

    Tracks: ``trainer``, ``engine``, ``collector``, or ``episode/<episode_id>``
    (a viewer may fold episode tracks into lanes). ``step`` is the training step
    the span belongs to: for the trainer the step it computes, for an episode
    the policy version it started with.
    """

    name: Stage
    start_us: int
    dur_us: int
    track: str
    step: int
    args: Mapping[str, str | int | float | bool] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "start_us": self.start_us,
            "dur_us": self.dur_us,
            "track": self.track,
            "step": self.step,
        }
        if self.args:
            out["args"] = dict(self.args)
        return out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TextSegment:
    """A run of the rendered episode text; ``trained`` marks model-produced tokens (mask 1)."""

    text: str
    trained: bool

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "trained": self.trained}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryRecord:
    """A sampled trajectory as a person reads it (not the token arrays the trainer uses).

    ``step`` is the training step that consumed it (0 if it was dropped before
    any step did); ``policy_version`` the policy that started it;
    ``segments`` the decoded text split where the loss mask changes.
    """

    episode_id: str
    step: int
    policy_version: int
    group: int
    reward: float
    turns: int
    end_state: EpisodeEnd
    end_reason: str | None
    model_tokens: int
    total_tokens: int
    duration_s: float
    segments: tuple[TextSegment, ...]
    sampling: Mapping[str, float | int]
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "step": self.step,
            "policy_version": self.policy_version,
            "group": self.group,
            "reward": self.reward,
            "turns": self.turns,
            "end_state": self.end_state,
            "end_reason": self.end_reason,
            "model_tokens": self.model_tokens,
            "total_tokens": self.total_tokens,
            "duration_s": self.duration_s,
            "segments": [s.to_json() for s in self.segments],
            "sampling": dict(self.sampling),
            "info": dict(self.info),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrajectoryRecord:
        """The inverse of `to_json`; keys it does not know (a stored row's ``id``) are ignored."""
        return cls(
            episode_id=data["episode_id"],
            step=int(data["step"]),
            policy_version=int(data["policy_version"]),
            group=int(data["group"]),
            reward=float(data["reward"]),
            turns=int(data["turns"]),
            end_state=data["end_state"],
            end_reason=data.get("end_reason"),
            model_tokens=int(data["model_tokens"]),
            total_tokens=int(data["total_tokens"]),
            duration_s=float(data["duration_s"]),
            segments=tuple(
                TextSegment(text=s["text"], trained=bool(s["trained"])) for s in data["segments"]
            ),
            sampling=dict(data.get("sampling", {})),
            info=dict(data.get("info", {})),
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRecord:
    """A checkpoint that is complete on storage (written, then recorded; never the reverse)."""

    step: int
    uri: str
    size_bytes: int | None = None
    # What all of the run's kept checkpoints and exports take once this one is saved, its
    # exports made and retention done: what the run holds in storage (the tenant's quota
    # artifact_bytes counts it). None: not measured (a host without an artifacts folder).
    stored_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"step": self.step, "uri": self.uri, "size_bytes": self.size_bytes}
        if self.stored_bytes is not None:  # absent for a control plane of the release before
            data["stored_bytes"] = self.stored_bytes
        return data


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InflightEpisode:
    episode_id: str
    stage: str  # "model_call" | "env_step" | "queued" | ...
    since_s: float  # seconds in that stage so far
    turn: int

    def to_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "stage": self.stage,
            "since_s": self.since_s,
            "turn": self.turn,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InflightSnapshot:
    """What the run is waiting on right now: the answer to "where is it stuck?"."""

    step: int
    # "training" | "waiting_for_trajectories" | "syncing_weights" | "evaluating" | "idle"
    trainer: str
    trainer_since_s: float
    queue_depth: int
    episodes: tuple[InflightEpisode, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "trainer": self.trainer,
            "trainer_since_s": self.trainer_since_s,
            "queue_depth": self.queue_depth,
            "episodes": [e.to_json() for e in self.episodes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InflightSnapshot:
        """The inverse of `to_json`; unknown keys are ignored."""
        return cls(
            step=int(data["step"]),
            trainer=data["trainer"],
            trainer_since_s=float(data["trainer_since_s"]),
            queue_depth=int(data["queue_depth"]),
            episodes=tuple(
                InflightEpisode(
                    episode_id=e["episode_id"],
                    stage=e["stage"],
                    since_s=float(e["since_s"]),
                    turn=int(e["turn"]),
                )
                for e in data.get("episodes", [])
            ),
        )


__all__ = [
    "STAGES",
    "CheckpointRecord",
    "EpisodeEnd",
    "InflightEpisode",
    "InflightSnapshot",
    "Span",
    "Stage",
    "TextSegment",
    "TrajectoryRecord",
]
