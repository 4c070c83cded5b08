"""Uploaded PEFT adapters: store, check, list, delete, and hand to a run's worker.

Why not a dataset: a dataset is rows the control plane validates line by line and pins by
hash because a name's content can be replaced; an adapter is two files of another format
(PEFT's ``adapter_config.json`` and ``adapter_model.safetensors``) whose meaning depends on
the base model. So an upload is its own thing, and never replaced: another upload is
another id, and a run naming ``adapter:<id>`` needs no pin.

The body is a tar holding the two files (any folder inside), the same archive the export
download of a LoRA run's checkpoint answers (``GET /v1/runs/{id}/checkpoints/{step}/export
?format=peft``): an adapter downloaded from rlaas goes back up as is, and one PEFT saved
goes up as ``tar -C <folder> -cf - adapter_config.json adapter_model.safetensors``. The
body is streamed to ``adapters/tmp/`` under a size cap, the two files are taken out (regular
files of those names only; nothing else is extracted) and checked: PEFT type LORA, a rank
and alpha, and a safetensors header whose tensors are ``lora_A``/``lora_B`` of the
projections rlaas adapts, with shapes that fit the rank. Shapes against a base model are
checked by the worker (rl_core.training.adapter_init), which has the base. The folder
then moves into ``adapters/<tenant>/<id>/`` in the data folder with one rename.

Deleting is refused (409, naming them) while a queued or running run starts from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import tarfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Run, Tenant, UploadedAdapter, utcnow
from app.errors import Conflict, NotFound, PayloadTooLarge, Unprocessable
from app.services import run_states
from app.services.quotas import Quotas, artifact_bytes_used
from app.settings import Settings
from rl_core.spec import parse_init_from

ID_PREFIX = "ad_"
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
FILES = (CONFIG_FILE, WEIGHTS_FILE)
# The projections rlaas adapts (rl_core.training.lora.KNOWN_TARGETS) by their Hugging Face
# module names; rl_core.training.lora imports JAX, which the control plane never does.
PROJECTIONS = {
    "q_proj": "q",
    "k_proj": "k",
    "v_proj": "v",
    "o_proj": "o",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
}
_TENSOR = re.compile(r"^base_model\.model\.(?:.+\.)?(\w+)\.lora_([AB])\.weight$")
_UNFINISHED = (run_states.QUEUED, run_states.STARTING, run_states.RUNNING)
_CHUNK = 1 << 20
_MAX_HEADER = 100_000_000  # safetensors' own cap on a header


def root(settings: Settings) -> Path:
    return settings.data_dir / "adapters"


def folder_of(settings: Settings, adapter: UploadedAdapter) -> Path:
    return root(settings) / adapter.tenant_id / adapter.id


@dataclass(frozen=True)
class Checked:
    rank: int
    alpha: float
    targets: list[str]
    size_bytes: int


async def upload(
    session: AsyncSession,
    tenant_id: str,
    name: str,
    chunks: AsyncIterator[bytes],
    *,
    settings: Settings,
) -> UploadedAdapter:
    """Check and store an uploaded adapter (see the module docstring)."""
    import asyncio

    tmp_dir = root(settings) / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    work = tmp_dir / uuid.uuid4().hex
    work.mkdir()
    try:
        archive = work / "upload.tar"
        size = 0
        with archive.open("wb") as out:
            async for chunk in chunks:
                size += len(chunk)
                if size > settings.adapter_max_bytes:
                    raise PayloadTooLarge(
                        f"the upload is over {settings.adapter_max_bytes} bytes "
                        "(RLAAS_ADAPTER_MAX_BYTES)",
                        limit_bytes=settings.adapter_max_bytes,
                    )
                out.write(chunk)
        files = work / "files"
        checked = await asyncio.to_thread(_unpack_and_check, archive, files)
        # Under the tenant's lock (submits and deletes take it too).
        await session.scalar(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
        await _check_quota(session, tenant_id, settings, checked.size_bytes)
        adapter = UploadedAdapter(
            id=f"{ID_PREFIX}{uuid.uuid4().hex}",
            tenant_id=tenant_id,
            name=name,
            rank=checked.rank,
            alpha=checked.alpha,
            targets=checked.targets,
            size_bytes=checked.size_bytes,
            created_at=utcnow(),
        )
        final = folder_of(settings, adapter)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(files, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    session.add(adapter)
    await session.flush()
    return adapter


def _unpack_and_check(archive: Path, into: Path) -> Checked:
    into.mkdir()
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                name = Path(member.name).name
                if member.isfile() and name in FILES and not (into / name).exists():
                    source = tar.extractfile(member)
                    assert source is not None  # a regular file's
                    with source, (into / name).open("wb") as out:
                        shutil.copyfileobj(source, out, _CHUNK)
    except tarfile.TarError as exc:
        raise Unprocessable(
            f"the body is not a whole tar archive ({exc}); send a tar of {CONFIG_FILE} and "
            f"{WEIGHTS_FILE}",
            field="body",
        ) from None
    missing = [name for name in FILES if not (into / name).is_file()]
    if missing:
        raise Unprocessable(
            f"the archive holds no {' and no '.join(missing)}; a PEFT adapter is "
            f"{CONFIG_FILE} and {WEIGHTS_FILE}",
            field="body",
        )
    rank, alpha = _config(into / CONFIG_FILE)
    targets = _tensors(into / WEIGHTS_FILE, rank)
    size = sum((into / name).stat().st_size for name in FILES)
    return Checked(rank=rank, alpha=alpha, targets=targets, size_bytes=size)


def _config(path: Path) -> tuple[int, float]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Unprocessable(f"{CONFIG_FILE} is not JSON: {exc}", field=CONFIG_FILE) from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise Unprocessable(f"{CONFIG_FILE}: peft_type must be LORA", field=CONFIG_FILE)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= 1024:
        raise Unprocessable(f"{CONFIG_FILE}: r={rank!r} is not a rank of 1 to 1024", field="r")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not 0 < alpha < 1e9:
        raise Unprocessable(
            f"{CONFIG_FILE}: lora_alpha={alpha!r} is not positive", field="lora_alpha"
        )
    return rank, float(alpha)


def _tensors(path: Path, rank: int) -> list[str]:
    """The targets (rlaas's names) the safetensors header's tensors adapt, checked."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(_MAX_HEADER, size - 8):
            raise Unprocessable(f"{WEIGHTS_FILE} is not a safetensors file", field=WEIGHTS_FILE)
        try:
            header: dict[str, Any] = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise Unprocessable(
                f"{WEIGHTS_FILE} has no readable safetensors header", field=WEIGHTS_FILE
            ) from None
    targets: set[str] = set()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        match = _TENSOR.match(name)
        target = PROJECTIONS.get(match.group(1)) if match else None
        shape = info.get("shape") if isinstance(info, dict) else None
        if target is None or not isinstance(shape, list) or len(shape) != 2:
            raise Unprocessable(
                f"{WEIGHTS_FILE} has {name!r}: not the 2-d lora_A/lora_B weight of a projection "
                f"rlaas adapts ({', '.join(PROJECTIONS)})",
                field=WEIGHTS_FILE,
            )
        assert match is not None
        at = 0 if match.group(2) == "A" else 1  # lora_A [r, in], lora_B [out, r]
        if shape[at] != rank:
            raise Unprocessable(
                f"{WEIGHTS_FILE}: {name} is {shape}, which does not fit rank {rank} (r)",
                field=WEIGHTS_FILE,
            )
        targets.add(target)
    if not targets:
        raise Unprocessable(f"{WEIGHTS_FILE} holds no tensors", field=WEIGHTS_FILE)
    return sorted(targets)


async def _check_quota(
    session: AsyncSession, tenant_id: str, settings: Settings, size: int
) -> None:
    used = await artifact_bytes_used(session, tenant_id)
    quota = Quotas.of(await session.get(Tenant, tenant_id), settings).artifact_bytes
    if used + size > quota:
        error = PayloadTooLarge(
            f"this tenant's stored artifacts would take {used + size} bytes and the quota is "
            f"{quota} (quota artifact_bytes: runs' checkpoints and exports, and adapters); "
            "nothing was stored: delete an adapter first, or ask for a higher quota",
            limit_bytes=quota,
        )
        error.extra["quota"] = {"name": "artifact_bytes", "limit": quota, "used": used}
        raise error


async def list_for(session: AsyncSession, tenant_id: str) -> list[UploadedAdapter]:
    query = select(UploadedAdapter).where(UploadedAdapter.tenant_id == tenant_id)
    return list(await session.scalars(query.order_by(UploadedAdapter.created_at)))


async def get(session: AsyncSession, tenant_id: str, adapter_id: str) -> UploadedAdapter:
    adapter = await session.scalar(
        select(UploadedAdapter).where(
            UploadedAdapter.id == adapter_id, UploadedAdapter.tenant_id == tenant_id
        )
    )
    if adapter is None:
        raise NotFound(f"no adapter {adapter_id!r}", field="adapter_id")
    return adapter


async def delete(
    session: AsyncSession, tenant_id: str, adapter_id: str, *, settings: Settings
) -> None:
    """Refused while an unfinished run starts from the adapter (409 naming the runs)."""
    # Under the tenant's lock, which submits take too: no run can name it meanwhile.
    await session.scalar(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
    adapter = await get(session, tenant_id, adapter_id)
    runs = await session.scalars(
        select(Run).where(Run.tenant_id == tenant_id, Run.status.in_(_UNFINISHED))
    )
    users = [run for run in runs if _names(run.spec, adapter_id)]
    if users:
        named = ", ".join(f"{run.id} ({run.status})" for run in users[:10])
        raise Conflict(
            f"{adapter_id} is what {named} start from; cancel them or wait for them to end",
            field="adapter_id",
        )
    await session.delete(adapter)
    await session.flush()
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(folder_of(settings, adapter))


def _names(spec: Any, adapter_id: str) -> bool:
    try:
        value = spec["model"]["lora"]["init_from"]
        return parse_init_from(value)[:2] == ("adapter", adapter_id)
    except (KeyError, TypeError, ValueError):
        return False


__all__ = ["PROJECTIONS", "delete", "folder_of", "get", "list_for", "upload"]
