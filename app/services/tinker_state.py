"""Saved training state of Tinker models (the SDK's save_state, load_state,
create_training_client_from_state and the RestClient's checkpoint calls; docs/tinker.md).

A save is written by the model's worker straight into the artifact store
(`rl_core.training.slot_state`: adapter, Adam moments, step count), once, in a folder of
its own under the tenant's prefix (``tinker/<tenant>/<checkpoint id>/``); the control
plane names that folder, and records the save here once the worker has written it
(`TinkerCheckpoint`: its ``tinker://<model>/weights/<name>`` path, the bytes written). A
load names the path; this module finds the record (another tenant's path is a 404, as one
that does not exist) and hands the folder's key to whichever worker serves the base.

The store is the artifact store (``RLAAS_ARTIFACT_STORE``) when one is set, else the
artifacts folder as one, which the API and a worker on the embedded default share.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Tenant, TinkerCheckpoint
from app.errors import BadRequest, Forbidden, NotFound
from app.services.exports import artifact_store
from app.services.quotas import Quotas, artifact_bytes_used
from app.services.tinker import WorkerRefusal
from app.settings import Settings
from rl_core.artifacts import TINKER_STATE_MARKER
from rl_core.store import ArtifactStore, open_store
from rl_core.store.folders import delete_folder

log = logging.getLogger(__name__)

PATH_PREFIX = "tinker://"
WEIGHTS = "weights"  # tinker://<model>/weights/<name>: the SDK's training checkpoints
SAMPLER_WEIGHTS = "sampler_weights"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
# The SDK's ServiceClient names a model it creates from a saved state itself:
# "<session id>:train:<n>", with the session id this API handed out (create_session).
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_MODEL_SEQ = 1_000_000


def state_store(settings: Settings) -> ArtifactStore:
    """Where saved states lie: the artifact store, else the artifacts folder as one."""
    if settings.artifact_store:
        return artifact_store(settings)
    return _folder_store(str(settings.artifacts_dir().absolute()))


@functools.cache
def _folder_store(folder: str) -> ArtifactStore:
    return open_store(f"file://{folder}")


def weights_path(model_id: str, name: str) -> str:
    return f"{PATH_PREFIX}{model_id}/{WEIGHTS}/{name}"


def check_name(name: Any, field: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadRequest(
            f"{field} must be a name of 1 to 200 letters, digits, '.', '_' or '-'", field=field
        )
    return name


def parse_path(path: Any, field: str = "path") -> tuple[str, str]:
    """``tinker://<model>/weights/<name>`` as (model id, name); else a 400 naming ``field``
    that says what a saved state's path looks like."""
    shape = f"{PATH_PREFIX}<model id>/{WEIGHTS}/<name>, as save_state answered"
    if not isinstance(path, str) or not path.startswith(PATH_PREFIX):
        raise BadRequest(f"{field} must be a path of saved state: {shape}", field=field)
    parts = path.removeprefix(PATH_PREFIX).split("/")
    if len(parts) == 3 and parts[1] == SAMPLER_WEIGHTS:
        raise BadRequest(
            f"{path} is sampler weights (save_weights_for_sampler), which hold no training "
            f"state; load a path save_state answered ({shape})",
            field=field,
        )
    if len(parts) != 3 or parts[1] != WEIGHTS or not parts[0] or not _NAME.match(parts[2]):
        raise BadRequest(f"{field} {path!r} is not a path of saved state: {shape}", field=field)
    return parts[0], parts[2]


async def owned(
    session: AsyncSession, tenant_id: str, path: Any, field: str = "path"
) -> TinkerCheckpoint:
    """The tenant's saved state at ``path``: 400 for a malformed path, 404 for one that is
    not the tenant's (another tenant's is as one never saved)."""
    parse_path(path, field)
    found = await session.scalar(
        select(TinkerCheckpoint).where(
            TinkerCheckpoint.path == path, TinkerCheckpoint.tenant_id == tenant_id
        )
    )
    if found is None:
        raise NotFound(f"no saved state at {path}", field=field)
    return found


async def at_path(session: AsyncSession, path: str) -> TinkerCheckpoint | None:
    found: TinkerCheckpoint | None = await session.scalar(
        select(TinkerCheckpoint).where(TinkerCheckpoint.path == path)
    )
    return found


async def admit_save(session: AsyncSession, settings: Settings, tenant_id: str) -> None:
    """Refuse a save while the tenant's stored artifacts are at their quota (403: waiting
    frees nothing; deleting does)."""
    used = await artifact_bytes_used(session, tenant_id)
    quota = Quotas.of(await session.get(Tenant, tenant_id), settings).artifact_bytes
    if used >= quota:
        refusal = Forbidden(
            f"this tenant's stored artifacts take {used} bytes and the quota is {quota} "
            "(artifact_bytes: runs' checkpoints and exports, adapters, saved Tinker states); "
            "nothing was saved: delete a saved state (RestClient.delete_checkpoint) or other "
            "artifacts first, or ask for a higher quota",
            field="quota.artifact_bytes",
        )
        refusal.extra = {"quota": {"name": "artifact_bytes", "limit": quota, "used": used}}
        raise refusal


def check_same_store(answer: dict[str, Any], store: ArtifactStore) -> None:
    """Refuse a save the worker wrote to another store than this API reads (their
    RLAAS_ARTIFACT_STORE differ): recorded, it could never be loaded nor deleted here."""
    written = answer.get("store")
    if written != store.url:
        # The stores' addresses are the deployment's (buckets, paths): the log has them,
        # the tenant is told what is wrong and who mends it.
        log.error("tinker save_weights: worker wrote to %s, this API keeps %s", written, store.url)
        raise WorkerRefusal(
            "the model worker wrote the state to another artifact store than this API "
            "keeps saved state in, so it could never be loaded nor deleted here; the "
            "operator sets RLAAS_ARTIFACT_STORE (and RLAAS_S3_ENDPOINT) the same on the API "
            "and its Tinker workers (docs/tinker.md); nothing was recorded",
            "server",
        )


async def record(
    sessions: async_sessionmaker[AsyncSession],
    store: ArtifactStore,
    checkpoint: TinkerCheckpoint,
    *,
    replace: bool,
) -> None:
    """Record a save the worker has written (its own transaction: the request has ended).
    With ``replace``, a state saved before at the same path gives way, its folder deleted
    once the new record is committed. A state saved at the path meanwhile by another call
    (without ``replace``) wins: this one's folder is deleted and the call refused."""
    old_key: str | None = None
    try:
        async with sessions() as session:
            old = await at_path(session, checkpoint.path)
            if old is not None and replace:
                old_key = old.store_key
                await session.delete(old)
                await session.flush()
            session.add(checkpoint)
            await session.commit()
    except IntegrityError:
        await asyncio.to_thread(_delete, store, checkpoint.store_key)
        raise WorkerRefusal(
            f"a state was saved at {checkpoint.path} meanwhile by another call; save with "
            "overwrite=True to replace it, or under another name",
            "user",
        ) from None
    if old_key is not None:
        await asyncio.to_thread(_delete, store, old_key)


async def forget(store: ArtifactStore, key: str) -> None:
    """Delete a folder a worker may have written that will never be recorded."""
    await asyncio.to_thread(_delete, store, key)


def _delete(store: ArtifactStore, key: str) -> None:
    try:
        delete_folder(store, key, marker=TINKER_STATE_MARKER)
    except Exception:  # a leftover folder is invisible (no record) and costs only space
        log.exception("could not delete the saved Tinker state at %s", key)


async def delete(session: AsyncSession, settings: Settings, checkpoint: TinkerCheckpoint) -> None:
    """Delete a saved state: its folder (marker first: a load that reads it after fails
    saying it is gone), then its record, in the request's transaction."""
    store = state_store(settings)
    await asyncio.to_thread(delete_folder, store, checkpoint.store_key, marker=TINKER_STATE_MARKER)
    await session.delete(checkpoint)


async def of_model(session: AsyncSession, tenant_id: str, model_id: str) -> list[TinkerCheckpoint]:
    query = select(TinkerCheckpoint).where(
        TinkerCheckpoint.tenant_id == tenant_id, TinkerCheckpoint.model_id == model_id
    )
    return list(await session.scalars(query.order_by(TinkerCheckpoint.created_at.desc())))


async def of_tenant(
    session: AsyncSession, tenant_id: str, limit: int, offset: int
) -> tuple[list[TinkerCheckpoint], int]:
    """A page of the tenant's saved states, newest first, and how many there are."""
    mine = TinkerCheckpoint.tenant_id == tenant_id
    total = await session.scalar(select(func.count()).select_from(TinkerCheckpoint).where(mine))
    page = await session.scalars(
        select(TinkerCheckpoint)
        .where(mine)
        .order_by(TinkerCheckpoint.created_at.desc(), TinkerCheckpoint.id)
        .limit(limit)
        .offset(offset)
    )
    return list(page), int(total or 0)


def as_sdk(checkpoint: TinkerCheckpoint) -> dict[str, Any]:
    """A saved state as the SDK's ``Checkpoint``."""
    return {
        "checkpoint_id": f"{WEIGHTS}/{checkpoint.name}",
        "checkpoint_type": "training",
        "time": checkpoint.created_at.isoformat(),
        "tinker_path": checkpoint.path,
        "size_bytes": checkpoint.size_bytes,
        "public": False,
        "user_metadata": checkpoint.user_metadata,
        "expires_at": None,
        "training_run_id": checkpoint.model_id,
    }
