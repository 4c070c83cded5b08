"""What to do with a run whose worker died: queue it again (after a backoff), or fail it.

A worker can die in two ways that look the same from here (its lease expired):

- it was *taken away* (a preemptible machine reclaimed, a node drained, an OOM kill of a
  neighbour): the run was making progress and should go on, however often it happens;
- it *crashes at the same place* every time (its own OOM at one step, a native crash in
  the model or the environment): another attempt ends the same way, and the tenant needs
  the reason rather than an endless queue.

The difference is progress. An attempt *made progress* if the control plane recorded a
checkpoint from it (the next attempt resumes past where this one started), or if it
trained a step no earlier attempt had reached (it got further than ever before, even if
its worker was taken before it could checkpoint). An attempt that did neither died where
the run had already been. ``crash_loop_attempts`` such attempts in a row fail the run:
a crash loop. Every other death queues the run again after a backoff that doubles with
each stalled attempt in a row, within ``attempt_budget`` attempts in all (the operator's
bound on what one run may cost in restarts).

Everything here is a pure function of the attempts' records, so the rule is tested
without a database (tests/app/test_crash_loop.py); ``app.services.leases`` reads the
records and applies the verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """What the control plane knows of one attempt (one claim) of a run."""

    number: int
    # The highest step whose update this attempt reported (its metrics carry one per
    # step); None if it reported none.
    trained_to: int | None
    # The control plane recorded a checkpoint this attempt wrote.
    saved_checkpoint: bool


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``requeue``: queue again ``delay_s`` after the lease expired; else fail with ``reason``."""

    requeue: bool
    delay_s: float = 0.0
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class Policy:
    """The operator's settings (``RLAAS_CRASH_LOOP_ATTEMPTS``, ``RLAAS_RUN_ATTEMPT_BUDGET``,
    ``RLAAS_REQUEUE_BACKOFF_S``, ``RLAAS_REQUEUE_BACKOFF_MAX_S``)."""

    crash_loop_attempts: int = 3
    attempt_budget: int = 20  # 0: no bound
    backoff_s: float = 5.0
    backoff_max_s: float = 300.0


def progress(attempts: Sequence[AttemptRecord]) -> list[bool]:
    """Whether each attempt (in claim order) made progress: saved a checkpoint, or trained
    a step beyond every step the attempts before it had trained."""
    reached = 0
    made = []
    for a in sorted(attempts, key=lambda a: a.number):
        further = a.trained_to is not None and a.trained_to > reached
        made.append(a.saved_checkpoint or further)
        if a.trained_to is not None:
            reached = max(reached, a.trained_to)
    return made


def stalled_in_a_row(attempts: Sequence[AttemptRecord]) -> int:
    """The attempts at the end that made no progress, in a row."""
    count = 0
    for made in reversed(progress(attempts)):
        if made:
            break
        count += 1
    return count


def decide(attempts: Sequence[AttemptRecord], policy: Policy) -> Verdict:
    """The verdict on a run whose last attempt's worker died; ``attempts`` are all of its
    attempts so far (the dead one last)."""
    ordered = sorted(attempts, key=lambda a: a.number)
    stalled = stalled_in_a_row(ordered)
    if stalled >= policy.crash_loop_attempts:
        tail = ordered[-stalled:]
        reached = max((a.trained_to or 0 for a in ordered), default=0)
        ends = ", ".join(_where(a) for a in tail)
        return Verdict(
            requeue=False,
            reason=(
                f"crash loop: the worker died on {stalled} attempts in a row without getting "
                f"past step {reached} or saving a checkpoint ({ends}). Dying at the same place "
                "every time is a crash, not preemption: the workers' log of these attempts "
                "says why (out of memory at one step is the usual cause; a smaller "
                "rollout.concurrency or max_context needs less)"
            ),
        )
    if policy.attempt_budget and len(ordered) >= policy.attempt_budget:
        return Verdict(
            requeue=False,
            reason=(
                f"its workers were taken away {len(ordered)} times, the most attempts this "
                "deployment gives a run (RLAAS_RUN_ATTEMPT_BUDGET); the operator can raise it"
            ),
        )
    delay = min(policy.backoff_s * 2**stalled, policy.backoff_max_s)
    return Verdict(requeue=True, delay_s=delay)


def _where(a: AttemptRecord) -> str:
    if a.trained_to is None:
        return f"attempt {a.number} trained no step"
    return f"attempt {a.number} died after step {a.trained_to}"


__all__ = ["AttemptRecord", "Policy", "Verdict", "decide", "progress", "stalled_in_a_row"]
