"""Deleting a finished run's artifacts: the way a tenant frees its storage quota.

A run's checkpoints and exports (and its TensorBoard files) live under ``<run>/`` in the
artifact store, or in the data folder on the embedded default. Deleting them keeps the
run itself (its metrics, trajectories, events, lineage of what was trained), drops its
checkpoint rows so no listing or download names a file that is gone, stops any server
of its checkpoints, and sets its storage use to 0. Only a finished run: a live one's
worker would write again, and resumes from what is there.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact, CheckpointServer
from app.errors import Conflict
from app.services import run_states
from app.services.exports import artifact_store
from app.services.runs import get_run
from app.settings import Settings
from rl_core.store import ArtifactStore

KINDS = ("checkpoint", "export")  # the rows of files deleted here (profiles stay)


@dataclass(frozen=True)
class Deleted:
    run_id: str
    freed_bytes: int  # the run's storage use before (as its worker last measured it)
    checkpoints: int  # checkpoint rows removed


async def delete_run_artifacts(
    session: AsyncSession, tenant_id: str, run_id: str, *, settings: Settings
) -> Deleted:
    run = await get_run(session, tenant_id, run_id)
    if run.status not in run_states.TERMINAL:
        raise Conflict(
            f"run {run.id} is {run.status}: its worker still writes checkpoints; cancel it "
            f"(POST /v1/runs/{run.id}/cancel) and delete its artifacts once it has ended",
            field="run_id",
        )
    if settings.artifact_store:
        store = artifact_store(settings)
        await asyncio.to_thread(_delete_prefix, store, run.id)
    # The embedded default's copy, and the API host's cache of a store's (none elsewhere).
    await asyncio.to_thread(shutil.rmtree, settings.artifacts_dir() / run.id, True)
    removed = await session.execute(
        delete(Artifact).where(Artifact.run_id == run.id, Artifact.kind.in_(KINDS))
    )
    await session.execute(delete(CheckpointServer).where(CheckpointServer.run_id == run.id))
    freed = run.stored_bytes or 0
    run.stored_bytes = 0
    checkpoints = int(getattr(removed, "rowcount", 0) or 0)
    return Deleted(run_id=run.id, freed_bytes=freed, checkpoints=checkpoints)


def _delete_prefix(store: ArtifactStore, run_id: str) -> None:
    keys = [obj.key for obj in store.list(run_id)]
    for start in range(0, len(keys), 1000):  # S3's DeleteObjects takes 1,000 keys a call
        store.delete(keys[start : start + 1000])


__all__ = ["Deleted", "delete_run_artifacts"]
