"""A checkpoint's download: which export folder a tenant may have, and that folder as a tar.

The worker writes a checkpoint's exports beside it, once, before it reports the checkpoint
(`rl_core.training.exports`; the layout is `rl_core.artifacts`): merged Hugging Face
safetensors (``hf``) always, a PEFT adapter (``peft``) for a LoRA run. The control plane
computes nothing: it checks the request against the run and streams the folder's files,
from the artifacts folder or, when one is configured, from the artifact store
(docs/storage.md), where an export counts only once its marker object is there.
The archive is a plain tar (safetensors do not compress) made on the fly, with its
length known before the first byte, so a client sees progress and a cut download.
"""

from __future__ import annotations

import asyncio
import functools
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact
from app.errors import NotFound, Unprocessable
from app.services.runs import get_run
from app.settings import Settings
from rl_core.artifacts import EXPORT_MARKER, ExportFormat, export_dir, export_key
from rl_core.store import ArtifactStore, open_store

_BLOCK = 512
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Member:
    """One file of the archive: its name there, size, time, and its bytes in chunks."""

    name: str
    size: int
    mtime: float
    read: Callable[[], Iterator[bytes]]


@dataclass(frozen=True)
class Archive:
    """A tar of ``files``, ``size`` bytes long."""

    name: str
    files: list[Member]
    size: int

    def chunks(self) -> Iterator[bytes]:
        """The archive's bytes, a file at a time in 1 MiB reads (never a whole file in memory)."""
        for member in self.files:
            yield _header(member)
            size = 0
            for block in member.read():
                size += len(block)
                yield block
            if size != member.size:  # changed under us: a cut archive beats a corrupt one
                raise OSError(f"{member.name} is {size} bytes, not the {member.size} announced")
            yield b"\0" * _padding(size)
        yield b"\0" * (2 * _BLOCK)  # the end-of-archive marker


async def checkpoint_export(
    session: AsyncSession,
    tenant_id: str,
    run_id: str,
    step: int,
    fmt: ExportFormat,
    *,
    settings: Settings,
) -> Archive:
    """The ``fmt`` export of the run's checkpoint at ``step``; 404 for another tenant's run."""
    run = await get_run(session, tenant_id, run_id)
    steps = list(
        await session.scalars(
            select(Artifact.step)
            .where(Artifact.run_id == run.id, Artifact.kind == "checkpoint")
            .order_by(Artifact.step)
        )
    )
    if step not in steps:
        have = f"its checkpoints are at steps {steps}" if steps else "it has no checkpoint yet"
        raise NotFound(f"run {run.id} has no checkpoint at step {step}; {have}", field="step")
    model = run.spec.get("model") if isinstance(run.spec, dict) else None
    if fmt == "peft" and not (isinstance(model, dict) and model.get("lora")):
        raise Unprocessable(
            f"run {run.id} trains all of the model's weights (its spec has no model.lora), so "
            "it has no LoRA adapter to export; ask for format=hf (the whole model)",
            field="format",
        )
    prefix = f"{run.id}-step-{step}-{fmt}"
    if settings.artifact_store:
        store = artifact_store(settings)
        found, adapter = await asyncio.to_thread(_stored, store, run.id, step, fmt, prefix)
    else:
        found = _local(export_dir(settings.artifacts_dir() / run.id, step, fmt), prefix)
        adapter = export_dir(settings.artifacts_dir() / run.id, step, "peft").is_dir()
    if found is None and fmt == "hf" and adapter:
        raise NotFound(
            f"run {run.id} keeps the merged (hf) export of its newest checkpoint only; "
            f"ask for step {steps[-1]}, or for format=peft at step {step} and merge the "
            "adapter onto the base (docs/exports.md)",
            field="format",
        )
    if found is None:
        raise NotFound(
            f"the checkpoint at step {step} of run {run.id} has no {fmt} export: the worker "
            "that wrote it made none (a release before exports, a model no Hugging Face "
            "family expresses, or the export failed: the worker's log says why)",
            field="format",
        )
    size = sum(len(_header(m)) + _padded(m.size) for m in found) + 2 * _BLOCK
    return Archive(name=f"{prefix}.tar", files=found, size=size)


async def tensorboard_files(
    session: AsyncSession, tenant_id: str, run_id: str, *, settings: Settings
) -> Archive:
    """The run's TensorBoard event files as a tar of one folder (``tensorboard --logdir``
    on it): from the artifact store when there is one (the worker copies them there as the
    run goes, docs/trackers.md), else from the data folder. 404 for another tenant's run,
    and for a run that wrote none, saying why."""
    run = await get_run(session, tenant_id, run_id)
    name = f"{run.id}-tensorboard"
    if settings.artifact_store:
        store = artifact_store(settings)
        key = f"{run.id}/trackers/tensorboard"
        objects = await asyncio.to_thread(store.list, key)
        found: list[Member] | None = [
            Member(f"{name}/{o.key[len(key) + 1 :]}", o.size, o.mtime, _streamed(store, o.key))
            for o in objects
        ] or None
    else:
        found = _local(settings.artifacts_dir() / run.id / "trackers" / "tensorboard", name)
    if not found:
        trackers = run.spec.get("trackers") if isinstance(run.spec, dict) else None
        named = any(isinstance(t, dict) and t.get("kind") == "tensorboard" for t in trackers or [])
        why = (
            "none has been written yet (the worker copies them at its first steps and then "
            "every minute)"
            if named
            else "its spec names no tensorboard tracker (add {kind: tensorboard} to trackers)"
        )
        raise NotFound(f"run {run.id} has no TensorBoard files: {why}", field="run_id")
    size = sum(len(_header(m)) + _padded(m.size) for m in found) + 2 * _BLOCK
    return Archive(name=f"{name}.tar", files=found, size=size)


def _streamed(store: ArtifactStore, key: str) -> Callable[[], Iterator[bytes]]:
    return lambda: store.stream(key, _CHUNK)


def folder_archive(folder: Path, name: str) -> Archive | None:
    """A tar of the files of ``folder`` under ``name/``; None when there is no folder."""
    found = _local(folder, name)
    if found is None:
        return None
    size = sum(len(_header(m)) + _padded(m.size) for m in found) + 2 * _BLOCK
    return Archive(name=f"{name}.tar", files=found, size=size)


def artifact_store(settings: Settings) -> ArtifactStore:
    """The configured artifact store (``RLAAS_ARTIFACT_STORE``; callers check it is set)."""
    assert settings.artifact_store
    return _store(settings.artifact_store, settings.s3_endpoint)


@functools.cache
def _store(url: str, endpoint: str | None) -> ArtifactStore:
    """One client per store for the process (its connection pool is reused)."""
    return open_store(url, endpoint=endpoint)


def _local(folder: Path, prefix: str) -> list[Member] | None:
    """The folder's files (renamed into place whole by the worker), None when absent."""
    if not folder.is_dir():
        return None

    def reader(path: Path) -> Callable[[], Iterator[bytes]]:
        def read() -> Iterator[bytes]:
            with path.open("rb") as f:
                while block := f.read(_CHUNK):
                    yield block

        return read

    members = []
    for path in sorted(folder.iterdir()):
        if path.is_file():
            stat = path.stat()
            members.append(
                Member(f"{prefix}/{path.name}", stat.st_size, stat.st_mtime, reader(path))
            )
    return members


def _stored(
    store: ArtifactStore, run_id: str, step: int, fmt: ExportFormat, prefix: str
) -> tuple[list[Member] | None, bool]:
    """The export's objects in the store (None unless its marker is there, i.e. it was
    uploaded whole), and whether the step's adapter is there."""

    def complete(f: ExportFormat) -> list[Member] | None:
        key = export_key(run_id, step, f)
        objects = store.list(key)
        if not any(o.key == f"{key}/{EXPORT_MARKER}" for o in objects):
            return None
        return [
            Member(
                f"{prefix}/{o.key[len(key) + 1 :]}",
                o.size,
                o.mtime,
                _streamed(store, o.key),
            )
            for o in objects
            if o.key != f"{key}/{EXPORT_MARKER}"
        ]

    found = complete(fmt)
    return found, (fmt == "hf" and found is None and complete("peft") is not None)


def _header(member: Member) -> bytes:
    info = tarfile.TarInfo(member.name)
    info.size, info.mtime, info.mode = member.size, int(member.mtime), 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> int:
    return -size % _BLOCK


def _padded(size: int) -> int:
    return size + _padding(size)
