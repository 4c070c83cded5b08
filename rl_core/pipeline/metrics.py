"""Per-step scalars: what one training step consumed, and how the pipeline spent its time.

Counters that run for the whole pipeline (stage totals, engine time, gate
counts) are reported as per-step deltas; `StepMeter` keeps the previous
reading. Names, all floats:

- ``reward/{mean,std,min,max}``, ``episode/*``: over the trajectories trained on;
  ``episode/<end state>`` counts every episode that ended during the step.
- ``failures/<reason>``: episodes removed from the batch (not the policy's
  doing), by end reason; ``groups/{dropped_failed,dropped_stale,requeued}``.
- ``groups/dropped_equal`` and ``groups/dropped_equal_frac``: groups dynamic
  sampling dropped for equal rewards (`rl_core.pipeline.dynamic`), and their
  share of the groups the step took from the queue (trained + dropped);
  ``groups/trained_equal``: groups trained although their rewards were all equal
  (every such group without the option; with it, those past its cap);
  ``reward/drawn_mean``: the mean reward over the kept episodes of the groups
  the step took, dropped ones included (``reward/mean`` leaves them out, so with
  the option it stays away from 0 and 1 whatever the policy does).
- ``reward/mean/<source>``, ``episode/trained/<source>``: per ``data_source`` of
  the episodes' info (the ``dataset`` environment's rows), over the trajectories
  trained on; the first `SOURCES_MAX` names a run meets, each made a metric name
  (`source_name`), the rest under ``other``.
- ``staleness/{mean,max}`` and ``staleness/bucket_<k>`` for k = 0..max_staleness:
  the histogram, over the episodes trained on, of the oldest token trained on
  (see `rl_core.pipeline.queue`); ``stale/calls_masked``: model calls left out
  of the loss for being older than the bound; ``stale/episodes_untrained``:
  finished episodes of consumed groups with no call fresh enough to train on;
  ``groups/split``: groups whose finished members went to the trainer ahead of
  their stragglers.
- ``tokens_per_s``, ``trajectories_per_s``: model tokens and finished
  episodes over the step's wall time; ``queue/depth``.
- ``trainer/{busy,blocked,idle}_frac``: computing (train step, weight sync) /
  waiting for trajectories or for the device / anything else;
  ``engine/{busy,blocked,idle}_frac``: running a batch / a batch waiting for
  the device thread / nothing asked of it; ``engine/prompt_tokens``: prompt
  tokens the built-in engine prefilled, ``engine/prefix_reused_frac``: the share
  of prompt tokens whose keys and values came from the prefix pool instead
  (an agent's earlier turns; `rl_core.rollout.prefix_pool`).
- ``time/<stage>_s``: seconds in each stage (episode stages summed over episodes).
- ``loop/lag_ms_{mean,max}``: how late the event loop wakes a sleeper.
- ``env/...``: what the environment itself counts, when it does (a webhook's failed
  requests by reason, its concurrency limit and breaker: `WebhookEnvironment.step_metrics`);
  added by the pipeline, not here. Except ``env/observation_truncated``, counted here
  for any environment: episodes of the step ended because an observation did not fit
  ``agent.max_context`` (their info's ``observation_truncated`` says by how much).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from rl_core.agent.ledger import END_STATES, Trajectory
from rl_core.host.telemetry import fractions
from rl_core.pipeline.dynamic import carries_signal
from rl_core.pipeline.queue import GateCounts, Group
from rl_core.records import STAGES

# The end reasons of episodes removed from the batch (rl_core.agent.agent), always reported.
FAILURE_REASONS = ("episode_timeout", "env_timeout", "env_reset", "env_step", "cancelled")
# Distinct data sources with metrics of their own: each costs two series per step.
SOURCES_MAX = 32
OTHER_SOURCE = "other"
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_SOURCE_CHARS = 64


def source_name(source: str) -> str:
    """``source`` as one segment of a metric name: runs of anything but letters, digits,
    ``_ . -`` become ``_`` (a ``/`` would nest), at most 64 characters."""
    # Cut before and after: a long name costs no more than a short one.
    return _NOT_IN_NAME.sub("_", source[: 4 * _SOURCE_CHARS]).strip("_")[:_SOURCE_CHARS] or "_"


class SourceNames:
    """The metric names of data sources: the first ``limit`` distinct names met get their
    own (two sources that read alike share one), the rest `OTHER_SOURCE`."""

    def __init__(self, limit: int = SOURCES_MAX) -> None:
        self.limit = limit
        self._given: set[str] = set()

    def __call__(self, source: str) -> str:
        name = source_name(source)
        if name in self._given:
            return name
        if len(self._given) < self.limit:
            self._given.add(name)
            return name
        return OTHER_SOURCE


def source_metrics(trajectories: Sequence[Trajectory], names: SourceNames) -> dict[str, float]:
    """``reward/mean/<source>`` and ``episode/trained/<source>`` over the trajectories whose
    info names a ``data_source``; none for trajectories without one."""
    rewards: dict[str, list[float]] = {}
    for t in trajectories:
        source = t.info.get("data_source")
        if isinstance(source, str):
            rewards.setdefault(names(source), []).append(t.reward)
    out: dict[str, float] = {}
    for name, values in sorted(rewards.items()):
        out[f"reward/mean/{name}"] = _mean(values)
        out[f"episode/trained/{name}"] = float(len(values))
    return out


@dataclasses.dataclass
class Readings:
    """Monotonic counters read once per step."""

    stages: dict[str, float]
    engine_busy_s: float
    engine_blocked_s: float
    dropped_failed: int
    gate: GateCounts
    prompt_tokens: tuple[int, int] = (0, 0)  # (prefilled, reused from the prefix pool)


class StepMeter:
    def __init__(self, first: Readings, *, turn_credit: bool = False) -> None:
        self._last = first
        self.turn_credit = turn_credit  # what makes a group's rewards "equal" (dynamic.py)
        self.sources = SourceNames()

    def measure(
        self,
        *,
        groups: Sequence[Group],
        finished: Sequence[Trajectory],
        staleness: Sequence[int],
        max_staleness: int,
        train: Mapping[str, float],
        readings: Readings,
        wall_s: float,
        trainer_busy_s: float,
        trainer_blocked_s: float,
        queue_depth: int,
        lag_s: Sequence[float],
        policy_version: int,
        dropped_equal: Sequence[Group] = (),
    ) -> dict[str, float]:
        last, self._last = self._last, readings
        used = [t for g in groups for t in g.to_train]
        drawn = used + [t for g in dropped_equal for t in g.to_train]
        equal = sum(not carries_signal(g, turn_credit=self.turn_credit) for g in groups)
        rewards = np.array([t.reward for t in used] or [0.0], np.float64)
        ends = Counter(t.end_state for t in finished)
        failures = Counter(t.end_reason or t.end_state for t in finished if not t.kept)
        stale = np.array(staleness or [0], np.float64)
        hist = Counter(staleness)
        t_busy, t_blocked, t_idle = fractions(trainer_busy_s, trainer_blocked_s, wall_s)
        e_busy, e_blocked, e_idle = fractions(
            readings.engine_busy_s - last.engine_busy_s,
            readings.engine_blocked_s - last.engine_blocked_s,
            wall_s,
        )
        prefilled = readings.prompt_tokens[0] - last.prompt_tokens[0]
        reused = readings.prompt_tokens[1] - last.prompt_tokens[1]
        out: dict[str, float] = {name: float(v) for name, v in train.items()}
        out.update(
            {
                "reward/mean": float(rewards.mean()),
                "reward/std": float(rewards.std()),
                "reward/min": float(rewards.min()),
                "reward/max": float(rewards.max()),
                "reward/drawn_mean": _mean([t.reward for t in drawn]),
                "episode/trained": float(len(used)),
                "episode/turns_mean": _mean([t.turns for t in used]),
                "episode/length_mean": _mean([t.total_tokens for t in used]),
                "episode/model_tokens_mean": _mean([t.model_tokens for t in used]),
                "episode/samples_mean": _mean([len(t.samples) for t in used]),
                "episode/duration_s_mean": _mean([t.duration_s for t in used]),
                **{f"episode/{state}": float(ends.get(state, 0)) for state in END_STATES},
                **{f"failures/{reason}": 0.0 for reason in FAILURE_REASONS},
                **{f"failures/{reason}": float(n) for reason, n in sorted(failures.items())},
                "failures/total": float(sum(failures.values())),
                # Observations past agent.max_context (rl_core.agent.agent._observation_cut).
                "env/observation_truncated": float(
                    sum("observation_truncated" in t.info for t in finished)
                ),
                "groups/trained": float(len(groups)),
                "groups/dropped_failed": float(readings.dropped_failed - last.dropped_failed),
                "groups/dropped_stale": float(
                    readings.gate.dropped_stale - last.gate.dropped_stale
                ),
                "groups/requeued": float(readings.gate.requeued - last.gate.requeued),
                "groups/split": float(readings.gate.split - last.gate.split),
                "groups/dropped_equal": float(len(dropped_equal)),
                "groups/dropped_equal_frac": len(dropped_equal)
                / max(len(dropped_equal) + len(groups), 1),
                "groups/trained_equal": float(equal),
                "stale/calls_masked": float(
                    readings.gate.calls_masked_stale - last.gate.calls_masked_stale
                ),
                "stale/episodes_untrained": float(
                    readings.gate.episodes_untrained_stale - last.gate.episodes_untrained_stale
                ),
                "staleness/mean": float(stale.mean()),
                "staleness/max": float(stale.max()),
                **{
                    f"staleness/bucket_{k}": float(hist.get(k, 0)) for k in range(max_staleness + 1)
                },
                "tokens_per_s": sum(t.model_tokens for t in finished) / max(wall_s, 1e-9),
                "trajectories_per_s": len(finished) / max(wall_s, 1e-9),
                "queue/depth": float(queue_depth),
                "trainer/busy_frac": t_busy,
                "trainer/blocked_frac": t_blocked,
                "trainer/idle_frac": t_idle,
                "engine/busy_frac": e_busy,
                "engine/blocked_frac": e_blocked,
                "engine/idle_frac": e_idle,
                "engine/prompt_tokens": float(prefilled),
                "engine/prefix_reused_frac": reused / max(prefilled + reused, 1),
                **{
                    f"time/{stage}_s": readings.stages.get(stage, 0.0) - last.stages.get(stage, 0.0)
                    for stage in STAGES
                },
                "loop/lag_ms_mean": 1e3 * _mean(lag_s),
                "loop/lag_ms_max": 1e3 * max(lag_s, default=0.0),
                "policy_version": float(policy_version),
                "step_time_s": wall_s,
                **source_metrics(used, self.sources),
            }
        )
        return out


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


__all__ = [
    "OTHER_SOURCE",
    "SOURCES_MAX",
    "Readings",
    "SourceNames",
    "StepMeter",
    "source_metrics",
    "source_name",
]
