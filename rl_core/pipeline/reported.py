"""The readable trajectories a step reports (``train.trajectories_per_step``, n).

- Up to n of the episodes the trainer got rows for, taken across the step's groups
  in turn (each group's first member, then each group's second, ...), so a step
  of one group still shows n of its members, and a step of many shows many tasks.
- Up to n of the episodes that ended without being trained (failed, timed out,
  cancelled, a session its client gave up), each only when it holds something to
  read (tokens, or an error): a slot no client ever opened is no row. Then, while
  there is room, episodes of groups dynamic sampling dropped for equal rewards
  (`rl_core.pipeline.dynamic`; their info says ``"dropped": "equal_rewards"``).

A segment's ``trained`` is what the trainer's loss mask was there: the model's
tokens of an episode it got rows for, less the calls masked as too stale
(`fresh_mask`); never anything of an episode it did not train on, whose model
text is as readable but taught the policy nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from rl_core.agent.ledger import Trajectory, segments
from rl_core.models.tokenizer import Tokenizer
from rl_core.pipeline.queue import Group, fresh_mask
from rl_core.records import TrajectoryRecord


def trained_records(
    groups: Sequence[Group], tokenizer: Tokenizer, *, step: int, n: int
) -> list[TrajectoryRecord]:
    """Up to ``n`` trained episodes of ``step``'s groups, one group's member at a time."""
    ordered = sorted(groups, key=lambda g: g.task)
    members = [sorted(g.to_train, key=lambda t: t.member) for g in ordered]
    records = []
    for group, traj in itertools.islice(_round_robin(ordered, members), n):
        masks = [fresh_mask(s, traj.turn_versions, group.fresh_from) for s in traj.samples]
        records.append(_record(traj, masks, tokenizer, step=step))
    return records


def untrained_records(
    finished: Sequence[Trajectory],
    tokenizer: Tokenizer,
    *,
    n: int,
    dropped: Sequence[Trajectory] = (),
) -> list[TrajectoryRecord]:
    """Up to ``n`` of ``finished`` that no step trained on and that hold something to
    read, then of ``dropped`` (played to the end, left out of the batch); reported at
    step 0 (no step consumed them), none of their text trained."""
    readable = [t for t in finished if not t.kept and (t.total_tokens or t.error)]
    readable += dropped
    return [
        _record(t, [[0] * len(s.tokens) for s in t.samples], tokenizer, step=0)
        for t in readable[:n]
    ]


def _round_robin(
    groups: list[Group], members: list[list[Trajectory]]
) -> list[tuple[Group, Trajectory]]:
    rounds = itertools.zip_longest(*members)
    return [(groups[i], traj) for row in rounds for i, traj in enumerate(row) if traj is not None]


def _record(
    traj: Trajectory, masks: list[list[int]], tokenizer: Tokenizer, *, step: int
) -> TrajectoryRecord:
    """``traj``'s record, its segments split by ``masks`` (what the trainer trained on)."""
    record = traj.to_record(tokenizer, step=step)
    if all(m is s.loss_mask for s, m in zip(traj.samples, masks, strict=True)):
        return record  # trained as sampled: the record's own segments say so
    trained = [
        dataclasses.replace(s, loss_mask=m) for s, m in zip(traj.samples, masks, strict=True)
    ]
    return dataclasses.replace(
        record, segments=tuple(seg for s in trained for seg in segments(s, tokenizer))
    )


__all__ = ["trained_records", "untrained_records"]
