"""Uploaded datasets: store, read, delete, pin to a run, and hand to the run's worker.

Storage. The content is a file in the data folder, ``datasets/<tenant>/<sha256>.jsonl``
(the folder where the embedded control plane keeps everything; the artifact store of
issue #32 replaces it). An upload streams into ``datasets/tmp/`` while `JsonlCheck`
validates and hashes it, and is moved into place with one ``os.replace`` only once
every line passed: a refused upload leaves nothing behind. A Parquet upload is
received whole into ``datasets/tmp/`` first, then read row group by row group into
the same JSONL form (`app.services.upload_parquet`): the content stored is always JSONL.

Pinning. A run that names ``dataset: ds_...`` gets the dataset's current SHA-256
written into its spec at submit (``environment.config.sha256``); the worker fetches
exactly that content (``GET /internal/runs/{id}/datasets/{sha256}``). An upload under
an existing name replaces that dataset's content (same id, new hash) and never
changes a run already submitted: the old content stays while an unfinished run pins it.

Deleting. Refused (409, naming the runs) while a queued or running run uses the
dataset, as for environments: the run would lose its rows at its next claim.

Content no dataset row and no unfinished run refers to is removed at the tenant's
next upload or delete (under the tenant's row lock, which submits also take, so a
submit cannot pin content that is being removed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Dataset, Run, Tenant, utcnow
from app.errors import Conflict, NotFound, PayloadTooLarge, Unprocessable
from app.security import LeaseProof
from app.services import run_states
from app.services.quotas import Quotas
from app.services.upload import PARQUET_MAGIC, Caps, JsonlCheck
from app.services.upload_parquet import ParquetReceive
from app.settings import Settings
from rl_core.protocol.datasets import PROCEDURAL_FIELDS, SERVER_KEYS, SHA256, DatasetConfig

log = logging.getLogger(__name__)

ID_PREFIX = "ds_"
ENV_NAME = "dataset"
_UNFINISHED = (run_states.QUEUED, run_states.STARTING, run_states.RUNNING)


def root(settings: Settings) -> Path:
    return settings.data_dir / "datasets"


def content_path(settings: Settings, tenant_id: str, sha256: str) -> Path:
    return root(settings) / tenant_id / f"{sha256}.jsonl"


async def upload(
    session: AsyncSession,
    tenant_id: str,
    name: str,
    chunks: AsyncIterator[bytes],
    *,
    settings: Settings,
    required: tuple[str, ...] = (),
    parquet: bool = False,
) -> tuple[Dataset, bool]:
    """Check and store an upload; returns (dataset, created). See the module docstring.
    ``parquet``: the body was declared Parquet (its content type); a body that begins with
    Parquet's magic bytes is read as Parquet too."""
    caps = Caps(
        max_bytes=settings.dataset_max_bytes,
        max_rows=settings.dataset_max_rows,
        max_line_bytes=settings.dataset_max_line_bytes,
    )
    tmp_dir = root(settings) / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    _sweep_parts(tmp_dir)
    token = uuid.uuid4().hex
    tmp = tmp_dir / f"{token}.part"
    raw = tmp_dir / f"{token}.parquet.part"  # a Parquet body as received, before reading
    try:
        with tmp.open("wb") as out:
            check = await _receive(chunks, out, raw, caps, required, parquet=parquet)
            # Reading a Parquet file's row groups takes a while: off the event loop.
            checked = await asyncio.to_thread(check.finish)
        # Under the tenant's lock (submits take it too: app.services.quotas.admit_run).
        await session.scalar(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
        existing = await session.scalar(
            select(Dataset).where(Dataset.tenant_id == tenant_id, Dataset.name == name)
        )
        await _check_quota(session, tenant_id, settings, checked.size_bytes, existing)
        await _collect(session, settings, tenant_id)
        final = content_path(settings, tenant_id, checked.sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
    finally:
        for path in (tmp, raw):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    fmt = "parquet" if isinstance(check, ParquetReceive) else "jsonl"
    now = utcnow()
    if existing is not None:
        existing.sha256, existing.size_bytes = checked.sha256, checked.size_bytes
        existing.rows, existing.fields, existing.updated_at = checked.rows, checked.fields, now
        existing.format = fmt
        await session.flush()
        return existing, False
    dataset = Dataset(
        id=f"{ID_PREFIX}{uuid.uuid4().hex}",
        tenant_id=tenant_id,
        name=name,
        format=fmt,
        sha256=checked.sha256,
        size_bytes=checked.size_bytes,
        rows=checked.rows,
        fields=checked.fields,
        created_at=now,
        updated_at=now,
    )
    try:
        async with session.begin_nested():
            session.add(dataset)
    except IntegrityError:  # the tenant lock makes this a race with a deleted tenant only
        raise Conflict(
            f"a dataset named {name!r} was made meanwhile; retry", field="name"
        ) from None
    return dataset, True


async def _receive(
    chunks: AsyncIterator[bytes],
    out: BinaryIO,
    raw: Path,
    caps: Caps,
    required: tuple[str, ...],
    *,
    parquet: bool,
) -> JsonlCheck | ParquetReceive:
    """The body fed to the check its format takes: Parquet when declared so or when it
    begins with ``PAR1`` (no JSONL line can), JSONL otherwise."""
    check: JsonlCheck | ParquetReceive | None = None
    head = b""  # the body's first bytes, until there are enough to see the magic
    async for chunk in chunks:
        if check is None:
            head += chunk
            if len(head) < len(PARQUET_MAGIC):
                continue
            chunk, head = head, b""
            check = _check_for(chunk, out, raw, caps, required, parquet=parquet)
        # Parsing a 64 KiB chunk's lines takes a while: off the event loop.
        await asyncio.to_thread(check.feed, chunk)
    if check is None:  # a body shorter than the magic
        check = _check_for(head, out, raw, caps, required, parquet=parquet)
        check.feed(head)
    return check


def _check_for(
    head: bytes,
    out: BinaryIO,
    raw: Path,
    caps: Caps,
    required: tuple[str, ...],
    *,
    parquet: bool,
) -> JsonlCheck | ParquetReceive:
    if parquet or head.startswith(PARQUET_MAGIC):
        return ParquetReceive(raw, out, caps, required)
    return JsonlCheck(out, caps, required)


def _sweep_parts(tmp_dir: Path, older_than_s: float = 24 * 3600) -> None:
    """Remove uploads' temporary files an API process that died mid-upload left behind
    (a live upload's file is younger: no upload streams for a day)."""
    cutoff = time.time() - older_than_s
    for part in tmp_dir.glob("*.part"):
        with contextlib.suppress(FileNotFoundError):
            if part.stat().st_mtime < cutoff:
                part.unlink()


async def bytes_used(session: AsyncSession, tenant_id: str) -> int:
    """The bytes the tenant's datasets take (the quota ``dataset_bytes`` counts them)."""
    total = await session.scalar(
        select(func.coalesce(func.sum(Dataset.size_bytes), 0)).where(Dataset.tenant_id == tenant_id)
    )
    return int(total or 0)


async def _check_quota(
    session: AsyncSession,
    tenant_id: str,
    settings: Settings,
    size: int,
    replaced: Dataset | None,
) -> None:
    used = await bytes_used(session, tenant_id)
    used -= replaced.size_bytes if replaced is not None else 0
    # The tenant's own override (tenants.quota_dataset_bytes), else the deployment's.
    quota = Quotas.of(await session.get(Tenant, tenant_id), settings).dataset_bytes
    if used + size > quota:
        error = PayloadTooLarge(
            f"this tenant's datasets would take {used + size} bytes and the quota is {quota} "
            "(quota dataset_bytes); nothing was stored: delete a dataset first, or ask for "
            "a higher quota",
            limit_bytes=quota,
        )
        error.extra["quota"] = {"name": "dataset_bytes", "limit": quota, "used": used}
        raise error


async def _pinned(session: AsyncSession, tenant_id: str) -> dict[str, list[Run]]:
    """The unfinished runs of ``tenant_id`` that use a dataset, by the content they pin."""
    runs = await session.scalars(
        select(Run).where(Run.tenant_id == tenant_id, Run.status.in_(_UNFINISHED))
    )
    by_hash: dict[str, list[Run]] = {}
    for run in runs:
        config = _dataset_config(run.spec)
        sha = config.get("sha256") if config is not None else None
        if isinstance(sha, str):
            by_hash.setdefault(sha, []).append(run)
    return by_hash


async def _collect(session: AsyncSession, settings: Settings, tenant_id: str) -> None:
    """Remove the tenant's content files nothing refers to (see the module docstring)."""
    folder = root(settings) / tenant_id
    if not folder.is_dir():
        return
    kept = set(await session.scalars(select(Dataset.sha256).where(Dataset.tenant_id == tenant_id)))
    kept |= set(await _pinned(session, tenant_id))
    for path in folder.glob("*.jsonl"):
        if path.stem not in kept:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


async def list_for(session: AsyncSession, tenant_id: str) -> list[Dataset]:
    query = select(Dataset).where(Dataset.tenant_id == tenant_id)
    return list(await session.scalars(query.order_by(Dataset.created_at, Dataset.id)))


async def get(session: AsyncSession, tenant_id: str, dataset_id: str) -> Dataset:
    dataset = await session.scalar(
        select(Dataset).where(Dataset.id == dataset_id, Dataset.tenant_id == tenant_id)
    )
    if dataset is None:
        raise NotFound(f"no dataset {dataset_id!r}", field="dataset_id")
    return dataset


async def delete(
    session: AsyncSession, tenant_id: str, dataset_id: str, *, settings: Settings
) -> None:
    """Refused while an unfinished run uses the dataset (409 naming the runs)."""
    await session.scalar(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
    dataset = await get(session, tenant_id, dataset_id)
    pinned = await _pinned(session, tenant_id)
    users = [
        run
        for runs in pinned.values()
        for run in runs
        if (_dataset_config(run.spec) or {}).get("dataset") == dataset_id
    ]
    if users:
        named = ", ".join(f"{run.id} ({run.status})" for run in users[:10])
        raise Conflict(
            f"{dataset_id} is used by {named}; cancel them or wait for them to end, then delete it",
            field="dataset_id",
        )
    await _collect(session, settings, tenant_id)
    await session.delete(dataset)
    await session.flush()
    # The content goes now unless another of the tenant's datasets has the same bytes or
    # an unfinished run pinned them (through a dataset since replaced). Were the commit to
    # fail after this, the dataset would stay listed without content, and a run naming it
    # would fail at its claim saying so: a rare, loud case.
    others = await session.scalar(
        select(func.count())
        .select_from(Dataset)
        .where(Dataset.tenant_id == tenant_id, Dataset.sha256 == dataset.sha256)
    )
    if not others and dataset.sha256 not in pinned:
        with contextlib.suppress(FileNotFoundError):
            content_path(settings, tenant_id, dataset.sha256).unlink()


def _dataset_config(spec: dict[str, Any]) -> dict[str, Any] | None:
    env = spec.get("environment")
    if not isinstance(env, dict) or env.get("name") != ENV_NAME:
        return None
    config = env.get("config")
    return config if isinstance(config, dict) else None


_CONFIG_FIELD = "spec.environment.config"


async def pin(session: AsyncSession, tenant_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its dataset's content hash pinned (a ``dataset`` environment's only;
    a procedural source, ``reasoning_gym:<task>``, is checked and has nothing to pin).

    422 naming the key for a config the environment cannot run: a key the server sets,
    a dataset that is not the tenant's, an unknown reasoning-gym task, a prompt or answer
    field its rows lack.
    """
    config = _dataset_config(spec)
    if config is None:
        return spec
    for key in SERVER_KEYS:
        if key in config:
            raise Unprocessable(
                f"{key!r} is set by the service (the content pinned at submit, the worker's "
                "copy); name the dataset with 'dataset: ds_...' only",
                field=f"{_CONFIG_FIELD}.{key}",
            )
    try:
        parsed = DatasetConfig.model_validate(config)
        needed = parsed.needed_fields()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Unprocessable(
            f"dataset config: {where or 'config'}: {first['msg']}",
            field=f"{_CONFIG_FIELD}.{where}" if where else _CONFIG_FIELD,
        ) from None
    except ValueError as exc:
        raise Unprocessable(f"dataset config: {exc}", field=f"{_CONFIG_FIELD}.prompt") from None
    train = spec.get("train")
    if parsed.split is None and isinstance(train, dict) and train.get("eval_interval"):
        # Held-out evaluation plays only held-out rows; on training rows it would flatter.
        raise Unprocessable(
            "train.eval_interval evaluates on the dataset's held-out rows and this config "
            "holds none out; give split (e.g. {eval: 0.05}) or set train.eval_interval to 0",
            field=f"{_CONFIG_FIELD}.split",
        )
    if parsed.task is not None:  # generated by the worker: nothing to look up or pin
        _fields_among(parsed, needed, PROCEDURAL_FIELDS, f"{parsed.dataset}'s rows")
        return spec
    dataset_id = parsed.dataset
    dataset = await session.scalar(
        select(Dataset).where(Dataset.id == dataset_id, Dataset.tenant_id == tenant_id)
    )
    if dataset is None:
        raise Unprocessable(
            f"no dataset {dataset_id!r}; upload one with POST /v1/datasets and use the id it "
            "returns",
            field=f"{_CONFIG_FIELD}.dataset",
        )
    _fields_among(parsed, needed, dataset.fields, f"dataset {dataset.id}")
    env = dict(spec["environment"])
    env["config"] = {**config, "sha256": dataset.sha256}
    return {**spec, "environment": env}


def _fields_among(
    parsed: DatasetConfig, needed: list[str], fields: Sequence[str], source: str
) -> None:
    for name in needed:
        if name not in fields:
            key = "answer" if name == parsed.answer else "prompt"
            raise Unprocessable(
                f"{source} has no field {name!r} in every row (its fields: "
                f"{', '.join(fields) or 'none'}); name one of those",
                field=f"{_CONFIG_FIELD}.{key}",
            )


async def content_for_run(
    session: AsyncSession, run_id: str, lease: LeaseProof, sha256: str, *, settings: Settings
) -> Path:
    """The file of the content ``run_id`` pinned, for its lease holder only."""
    run = await session.get(Run, run_id)
    if run is None or not lease.opens(run.lease_token_hash):
        raise lease.refusal(run_id)
    config = _dataset_config(run.spec) or {}
    if not SHA256.match(sha256) or config.get("sha256") != sha256:
        raise NotFound(f"run {run_id} pins no dataset content {sha256!r}", field="sha256")
    path = content_path(settings, run.tenant_id, sha256)
    if not path.is_file():
        raise NotFound(
            f"the content {sha256} of run {run_id}'s dataset is gone from the data folder; "
            "upload the dataset again and submit a new run",
            field="sha256",
        )
    return path
