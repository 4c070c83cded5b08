"""Which attempt's update of each step a run's policy holds, from the links workers report.

Every applied update is a `StepUpdate` row linked to the policy it was applied to (its
base: the step before, or the checkpoint its attempt resumed from). Walking the links back
from the newest checkpoint gives the policy's lineage; the rows off that path are updates
of killed attempts that no checkpoint kept. Two checks make a step trained twice (or
lost) visible rather than silently overwritten:

- each link must go back exactly one step (a jump is a gap: steps missing);
- the optimiser's update count, which the trainer restores with its state, must grow
  by the same amount every step: a policy that resumed from a state already holding a
  step's update and trained that step again has more updates than its step says.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import StepUpdate
from app.services import ingest
from app.services.runs import get_run


async def lineage(session: AsyncSession, tenant_id: str, run_id: str) -> dict[str, Any]:
    run = await get_run(session, tenant_id, run_id)
    rows = list(
        await session.scalars(
            select(StepUpdate).where(StepUpdate.run_id == run.id).order_by(StepUpdate.step)
        )
    )
    newest = await ingest.newest_checkpoint(session, run.id)
    if newest is None:
        return {"policy_step": 0, "policy_attempt": None, "steps": [], "problems": []}
    chain, problems = walk(rows, newest.step, newest.attempt)
    by_step: dict[int, list[int]] = defaultdict(list)
    for row in rows:
        by_step[row.step].append(row.attempt)
    steps = [
        {
            "step": n.step,
            "attempt": n.attempt,
            "base_step": n.base_step,
            "base_attempt": n.base_attempt,
            "optimizer_updates": n.optimizer_updates,
            "replaced": sorted(a for a in by_step[n.step] if a != n.attempt),
        }
        for n in chain
    ]
    return {
        "policy_step": newest.step,
        "policy_attempt": newest.attempt,
        "steps": steps,
        "problems": problems,
    }


def walk(rows: list[StepUpdate], step: int, attempt: int) -> tuple[list[StepUpdate], list[str]]:
    """The updates the policy of (``step``, ``attempt``) holds, oldest first, and what is
    wrong with them (nothing, for a policy holding each step 1..``step`` once)."""
    nodes = {(r.step, r.attempt): r for r in rows}
    chain: list[StepUpdate] = []
    problems: list[str] = []
    key = (step, attempt)
    while key[0] > 0:
        node = nodes.get(key)
        if node is None:
            problems.append(f"no update of step {key[0]} by attempt {key[1]} was reported")
            break
        if node.base_step != node.step - 1:
            problems.append(
                f"step {node.step} (attempt {node.attempt}) was applied to the policy of step "
                f"{node.base_step}: the updates of the steps between are not in it"
            )
        chain.append(node)
        key = (node.base_step, node.base_attempt)  # base_step < step: the walk ends
    chain.reverse()
    problems += _count_problems(chain)
    return chain, problems


def _count_problems(chain: list[StepUpdate]) -> list[str]:
    counted = [n for n in chain if n.optimizer_updates is not None]
    if not counted or counted[0].step != 1 or counted[0].base_step != 0:
        return []  # no counts (an older worker), or the chain is already broken
    per_step = counted[0].optimizer_updates or 0
    return [
        f"step {n.step} (attempt {n.attempt}): the policy holds {n.optimizer_updates} optimiser "
        f"updates, {n.step * per_step} expected: a step's update is in it "
        + ("twice" if (n.optimizer_updates or 0) > n.step * per_step else "no longer")
        for n in counted
        if n.optimizer_updates != n.step * per_step
    ]
