"""``model.lora.init_from``: a run that starts from an adapter (one of the tenant's runs', or
an upload of the tenant's).

At submit (`pin`) the reference is checked against what the control plane knows, so most
mistakes are a 422 naming ``spec.model.lora.init_from`` before anything is queued: the run
must be the tenant's (another tenant's run answers as a missing one does: nothing says it
exists), a LoRA run, on the same ``model.source``, with the same rank and no target the new
spec leaves out, and have a checkpoint (at the step named, if one is). The step is then
pinned into the stored spec (``run:<id>@<step>``): every attempt of the run, a resumed one
included, starts from the same weights even while the source run goes on checkpointing.

The worker fetches that checkpoint's PEFT export (`adapter_for_run`, behind the run's lease
token, streamed like a tenant's download from the artifacts folder or the store) and rl_core
checks every tensor against the base (rl_core.training.adapter_init): a mismatch only
the weights show fails the run with the reason.

``adapter:<id>`` is an upload of the tenant's (app/services/adapters.py): checked at submit
against what its files said at upload (rank, targets), never replaced, so nothing to pin.

``file:<dir>`` names a folder on the submitter's own machine (``rlaas train``); through the
service it would be a path on the worker's disk, so it is refused.
"""

from __future__ import annotations

import copy
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact, Run, UploadedAdapter
from app.errors import NotFound, Unprocessable
from app.security import LeaseProof
from app.services import adapters
from app.settings import Settings
from rl_core.spec import parse_init_from

FIELD = "spec.model.lora.init_from"
DEFAULT_TARGETS = ["q", "k", "v", "o"]  # rl_core.spec.LoraSpec.targets' default


def _init_from(spec: dict[str, Any]) -> str | None:
    model = spec.get("model")
    lora = model.get("lora") if isinstance(model, dict) else None
    value = lora.get("init_from") if isinstance(lora, dict) else None
    return value if isinstance(value, str) else None


async def checkpoint_steps(session: AsyncSession, run_id: str) -> list[int]:
    return list(
        await session.scalars(
            select(Artifact.step)
            .where(Artifact.run_id == run_id, Artifact.kind == "checkpoint")
            .order_by(Artifact.step)
        )
    )


async def pin(session: AsyncSession, tenant_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with ``model.lora.init_from`` checked and pinned to a checkpoint's step;
    unchanged without one. 422 naming the field for anything that cannot start the run."""
    value = _init_from(spec)
    if value is None:
        return spec
    kind, source_id, step = parse_init_from(value)  # the spec's own validator passed it
    if kind == "adapter":
        await _check_uploaded(session, tenant_id, source_id, spec["model"]["lora"])
        return spec  # an upload is never replaced: nothing to pin
    if kind != "run":
        raise Unprocessable(
            f"{kind}: names a folder on your own machine (rlaas train); through the service, "
            "start from one of your runs: run:<run_id> or run:<run_id>@<step>",
            field=FIELD,
        )
    source = await session.scalar(
        select(Run).where(Run.id == source_id, Run.tenant_id == tenant_id)
    )
    if source is None:
        raise Unprocessable(f"you have no run {source_id!r} to start from", field=FIELD)
    model, theirs = spec["model"], source.spec.get("model") or {}
    lora, their_lora = model["lora"], theirs.get("lora")
    if not their_lora:
        raise Unprocessable(
            f"run {source_id} trains all of the model's weights (its spec has no model.lora): "
            "it has no adapter to start from",
            field=FIELD,
        )
    mine_source = model.get("source", "builtin:tiny")
    their_source = theirs.get("source", "builtin:tiny")
    if mine_source != their_source:
        raise Unprocessable(
            f"run {source_id} trained its adapter on model.source {their_source!r}, this run's "
            f"is {mine_source!r}: an adapter fits the base it was trained on",
            field=FIELD,
        )
    _check_fit(
        f"run {source_id}'s adapter",
        their_lora.get("rank", 8),
        their_lora.get("targets", DEFAULT_TARGETS),
        lora,
    )
    steps = await checkpoint_steps(session, source.id)
    if not steps:
        raise Unprocessable(
            f"run {source_id} has no checkpoint yet; start from it once it has one "
            f"(GET /v1/runs/{source_id}/checkpoints)",
            field=FIELD,
        )
    if step is not None and step not in steps:
        raise Unprocessable(
            f"run {source_id} has no checkpoint at step {step}; its checkpoints are at {steps}",
            field=FIELD,
        )
    out = copy.deepcopy(spec)
    out["model"]["lora"]["init_from"] = f"run:{source_id}@{step if step is not None else steps[-1]}"
    return out


async def _check_uploaded(
    session: AsyncSession, tenant_id: str, adapter_id: str, lora: dict[str, Any]
) -> None:
    """What the upload's config says against ``model.lora`` (the tensors' shapes against
    the base are the worker's to check: it has the base)."""
    adapter = await session.scalar(
        select(UploadedAdapter).where(
            UploadedAdapter.id == adapter_id, UploadedAdapter.tenant_id == tenant_id
        )
    )
    if adapter is None:
        raise Unprocessable(f"you have no adapter {adapter_id!r} to start from", field=FIELD)
    _check_fit(f"adapter {adapter_id}", adapter.rank, adapter.targets, lora)


def _check_fit(what: str, rank: int, targets: list[str], lora: dict[str, Any]) -> None:
    if rank != lora.get("rank", 8):
        raise Unprocessable(
            f"{what} has rank {rank}, model.lora.rank is {lora.get('rank', 8)}; "
            f"set model.lora.rank to {rank}",
            field=FIELD,
        )
    missing = sorted(set(targets) - set(lora.get("targets", DEFAULT_TARGETS)))
    if missing:
        raise Unprocessable(
            f"{what} trains {missing}, which model.lora.targets leaves out; add them",
            field=FIELD,
        )


async def adapter_for_run(
    session: AsyncSession, run_id: str, lease: LeaseProof, *, settings: Settings
) -> Any:
    """The PEFT export the run pinned (`pin`), as a tar `app.services.exports.Archive`, for
    the run's lease holder only; 404 when the run starts from none or it is gone."""
    from app.services.exports import checkpoint_export, folder_archive

    run = await session.get(Run, run_id)
    if run is None or not lease.opens(run.lease_token_hash):
        raise lease.refusal(run_id)
    value = _init_from(run.spec)
    if value is None:
        raise NotFound(f"run {run_id} starts from no adapter", field="model.lora.init_from")
    kind, source_id, step = parse_init_from(value)
    if kind == "adapter":
        adapter = await session.scalar(
            select(UploadedAdapter).where(
                UploadedAdapter.id == source_id, UploadedAdapter.tenant_id == run.tenant_id
            )
        )
        archive = (
            None
            if adapter is None
            else folder_archive(adapters.folder_of(settings, adapter), adapter.id)
        )
        if archive is None:
            raise NotFound(
                f"the adapter {source_id} run {run_id} starts from was deleted; upload it "
                "again and submit a new run",
                field="model.lora.init_from",
            )
        return archive
    if kind != "run" or step is None:
        raise NotFound(
            f"run {run_id}'s init_from {value!r} was not pinned at submit; submit it again",
            field="model.lora.init_from",
        )
    return await checkpoint_export(
        session, run.tenant_id, source_id, step, "peft", settings=settings
    )
