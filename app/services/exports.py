"""A checkpoint's download: which export folder a tenant may have, and that folder as a tar.

The worker writes a checkpoint's exports beside it, once, before it reports the checkpoint
(`rl_core.training.exports`; the layout is `rl_core.artifacts`): merged Hugging Face
safetensors (``hf``) always, a PEFT adapter (``peft``) for a LoRA run. The control plane
computes nothing: it checks the request against the run and streams the folder's files.
The archive is a plain tar (safetensors do not compress) made on the fly, with its
length known before the first byte, so a client sees progress and a cut download.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact
from app.errors import NotFound, Unprocessable
from app.services.runs import get_run
from app.settings import Settings
from rl_core.artifacts import ExportFormat, export_dir

_BLOCK = 512
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Archive:
    """A tar of ``files`` (name in the archive, path), ``size`` bytes long."""

    name: str
    files: list[tuple[str, Path]]
    size: int

    def chunks(self) -> Iterator[bytes]:
        """The archive's bytes, a file at a time in 1 MiB reads (never a whole file in memory)."""
        for name, path in self.files:
            yield _header(name, path)
            size = 0
            with path.open("rb") as f:
                while block := f.read(_CHUNK):
                    size += len(block)
                    yield block
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
    folder = export_dir(settings.artifacts_dir() / run.id, step, fmt)
    adapter = export_dir(settings.artifacts_dir() / run.id, step, "peft")
    if fmt == "hf" and not folder.is_dir() and adapter.is_dir():
        raise NotFound(
            f"run {run.id} keeps the merged (hf) export of its newest checkpoint only; "
            f"ask for step {steps[-1]}, or for format=peft at step {step} and merge the "
            "adapter onto the base (docs/exports.md)",
            field="format",
        )
    if not folder.is_dir():
        raise NotFound(
            f"the checkpoint at step {step} of run {run.id} has no {fmt} export: the worker "
            "that wrote it made none (a release before exports, a model no Hugging Face "
            "family expresses, or the export failed: the worker's log says why)",
            field="format",
        )
    prefix = f"{run.id}-step-{step}-{fmt}"
    files = [(f"{prefix}/{p.name}", p) for p in sorted(folder.iterdir()) if p.is_file()]
    size = sum(len(_header(n, p)) + _padded(p.stat().st_size) for n, p in files) + 2 * _BLOCK
    return Archive(name=f"{prefix}.tar", files=files, size=size)


def _header(name: str, path: Path) -> bytes:
    info = tarfile.TarInfo(name)
    stat = path.stat()
    info.size, info.mtime, info.mode = stat.st_size, int(stat.st_mtime), 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> int:
    return -size % _BLOCK


def _padded(size: int) -> int:
    return size + _padding(size)
