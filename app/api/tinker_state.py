"""Saved training state over the Tinker-compatible API (docs/tinker.md, "Saved state").

- ``POST /api/v1/save_weights`` (``TrainingClient.save_state``): the model's worker writes
  its adapter, Adam moments and step count into the artifact store, in turn with the
  model's other calls; answered ``tinker://<model>/weights/<name>``.
- ``POST /api/v1/load_weights``: into the tenant's model (``load_state``: weights, Adam
  restarting; ``load_state_with_optimizer``), or, addressed by the SDK's session and model
  number, into a new model on the newest worker serving the base
  (``ServiceClient.create_training_client_from_state[_with_optimizer]``).
- The RestClient's reads of training checkpoints and runs, and ``delete_checkpoint``.

Another tenant's path is a 404, as a path never saved.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import func, select

from app.api.deps import SessionDep
from app.api.tinker import (
    PATH_PREFIX,
    TenantDep,
    _admit,
    _body,
    _field,
    _future,
    _holder,
    _model,
    _owned_path,
    _pick,
    calls_of,
    start_model,
)
from app.db.models import TinkerCheckpoint, TinkerModel
from app.errors import BadRequest, NotFound
from app.services import tinker_state as saved
from app.services.tinker import new_id
from app.services.tinker_limits import admit_call
from rl_core.artifacts import tinker_state_key

router = APIRouter(prefix="/api/v1", tags=["tinker"], include_in_schema=False)

Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0)]


@router.post("/save_weights")
async def save_weights(
    request: Request, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    calls = calls_of(request)
    settings = request.app.state.rlaas.settings
    body = await _body(request)
    model = await _model(session, tenant_id, _field(body, "model_id"))
    target = await _holder(request, session, model)
    seq_id = body.get("seq_id")
    name = saved.check_name(body.get("path") or f"state-{seq_id}", "path")
    if body.get("ttl_seconds") is not None:
        raise BadRequest(
            "ttl_seconds is not served: a saved state is kept until it is deleted "
            "(RestClient.delete_checkpoint)",
            field="ttl_seconds",
        )
    metadata = body.get("user_metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise BadRequest("user_metadata must map names to strings", field="user_metadata")
    overwrite = body.get("overwrite") is True
    path = saved.weights_path(model.id, name)
    if not overwrite and await saved.at_path(session, path) is not None:
        # 400, not 409: the SDK sends a 409 again for five minutes before it gives up.
        raise BadRequest(
            f"a state is already saved at {path}; save with overwrite=True to replace it, "
            "or under another name",
            field="path",
        )
    await saved.admit_save(session, settings, tenant_id)
    await _admit(request, session, tenant_id)
    checkpoint_id = new_id("tc")
    key = tinker_state_key(tenant_id, checkpoint_id)
    future_id = await _future(session, tenant_id, "save_weights")
    sessions, store = request.app.state.rlaas.sessions, saved.state_store(settings)

    async def call() -> dict[str, Any]:
        order = {"seq_id": seq_id, "key": key}
        try:
            answer = await calls.post(target, f"/models/{model.id}/save_state", order)
        except BaseException:
            await saved.forget(store, key)  # whatever part of it was written
            raise
        saved.check_same_store(answer, store)
        row = TinkerCheckpoint(
            id=checkpoint_id,
            tenant_id=tenant_id,
            model_id=model.id,
            name=name,
            path=path,
            store_key=key,
            base_model=model.base_model,
            lora_rank=model.lora_rank,
            size_bytes=int(answer["size_bytes"]),
            user_metadata=metadata,
        )
        await saved.record(sessions, store, row, replace=overwrite)
        return {"type": "save_weights", "path": path}

    calls.start(sessions, future_id, call)
    return {"request_id": future_id, "model_id": model.id}


@router.post("/load_weights")
async def load_weights(
    request: Request, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    calls = calls_of(request)
    body = await _body(request)
    optimizer = body.get("optimizer", False)
    if not isinstance(optimizer, bool):
        raise BadRequest("optimizer must be a boolean", field="optimizer")
    if body.get("weights_access_token"):
        raise BadRequest(
            "weights_access_token is not served: a tenant loads the states it saved",
            field="weights_access_token",
        )
    checkpoint = await saved.owned(session, tenant_id, body.get("path"))
    path = checkpoint.path
    state = {"key": checkpoint.store_key, "optimizer": optimizer}
    if body.get("session_id") is not None or body.get("model_seq_id") is not None:
        return await _create_from(request, session, tenant_id, body, checkpoint, state)

    model = await _model(session, tenant_id, _field(body, "model_id"))
    if (model.base_model, model.lora_rank) != (checkpoint.base_model, checkpoint.lora_rank):
        raise BadRequest(
            f"the state at {path} was saved from a rank-{checkpoint.lora_rank} LoRA model on "
            f"{checkpoint.base_model!r}; model {model.id} is rank {model.lora_rank} on "
            f"{model.base_model!r}: load it into a model of the same base and rank, or "
            "create one from it (ServiceClient.create_training_client_from_state)",
            field="path",
        )
    target = await _holder(request, session, model)
    await _admit(request, session, tenant_id)
    future_id = await _future(session, tenant_id, "load_weights")

    async def call() -> dict[str, Any]:
        order = {"seq_id": body.get("seq_id"), **state}
        await calls.post(target, f"/models/{model.id}/load_state", order)
        return {"type": "load_weights", "path": path, "model_id": model.id}

    calls.start(request.app.state.rlaas.sessions, future_id, call)
    return {"request_id": future_id, "model_id": model.id}


async def _create_from(
    request: Request,
    session: SessionDep,
    tenant_id: str,
    body: dict[str, Any],
    checkpoint: TinkerCheckpoint,
    state: dict[str, Any],
) -> dict[str, Any]:
    """create_training_client_from_state: a new model, named as the SDK names it, on the
    newest worker serving the state's base, its slot filled from the state."""
    session_id = _field(body, "session_id")
    if not saved.SESSION_ID.match(session_id):
        raise BadRequest("session_id must be the id create_session answered", field="session_id")
    seq = body.get("model_seq_id")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= saved.MAX_MODEL_SEQ:
        raise BadRequest(
            f"model_seq_id must be an integer from 0 to {saved.MAX_MODEL_SEQ}",
            field="model_seq_id",
        )
    base = body.get("base_model") or checkpoint.base_model
    if base != checkpoint.base_model:
        raise BadRequest(
            f"base_model {base!r} is not the base the state at {checkpoint.path} was saved on "
            f"({checkpoint.base_model!r}); leave it out, or name that one",
            field="base_model",
        )
    config = body.get("optimizer_config")
    if config is not None and not (isinstance(config, dict) and config.get("type") == "adamw"):
        raise BadRequest(
            "optimizer_config: only Adam ({'type': 'adamw'}) is served", field="optimizer_config"
        )
    model_id = f"{session_id}:train:{seq}"
    if await session.get(TinkerModel, model_id) is not None:
        raise BadRequest(  # not 409, which the SDK would send again for five minutes
            f"model {model_id} exists already; a ServiceClient numbers its models afresh",
            field="model_seq_id",
        )
    target = await _pick(request, session, base)
    await admit_call(session, request.app.state.rlaas.settings, tenant_id, new_model_on=base)
    rank = checkpoint.lora_rank
    order = {"model_id": model_id, "base_model": base, "rank": rank, "seed": 0, "state": state}
    answer = {"type": "load_weights", "path": checkpoint.path, "model_id": model_id}
    future_id = await start_model(request, session, tenant_id, target, order, answer)
    return {"request_id": future_id, "model_id": model_id}


# --- the RestClient's reads and deletes ----------------------------------------------------


def _training_run(
    run_id: str,
    tenant_id: str,
    base: str,
    rank: int,
    last_time: datetime,
    last: TinkerCheckpoint | None,
) -> dict[str, Any]:
    """The SDK's ``TrainingRun``: a model (or, once unloaded, what its saved states say)."""
    return {
        "training_run_id": run_id,
        "base_model": base,
        "model_owner": tenant_id,
        "is_lora": True,
        "corrupted": False,
        "lora_rank": rank,
        "last_request_time": last_time.isoformat(),
        "last_checkpoint": saved.as_sdk(last) if last is not None else None,
        "last_sampler_checkpoint": None,
        "user_metadata": None,
    }


@router.get("/training_runs")
async def list_training_runs(
    session: SessionDep, tenant_id: TenantDep, limit: Limit = 20, offset: Offset = 0
) -> dict[str, Any]:
    """The tenant's models (unloaded ones are gone), newest first."""
    mine = TinkerModel.tenant_id == tenant_id
    total = await session.scalar(select(func.count()).select_from(TinkerModel).where(mine))
    models = list(
        await session.scalars(
            select(TinkerModel)
            .where(mine)
            .order_by(TinkerModel.created_at.desc(), TinkerModel.id)
            .limit(limit)
            .offset(offset)
        )
    )
    runs = []
    for model in models:
        last = next(iter(await saved.of_model(session, tenant_id, model.id)), None)
        runs.append(
            _training_run(
                model.id, tenant_id, model.base_model, model.lora_rank, model.created_at, last
            )
        )
    cursor = {"offset": offset, "limit": limit, "total_count": int(total or 0)}
    return {"training_runs": runs, "cursor": cursor}


@router.get("/training_runs/{run_id}")
async def get_training_run(
    run_id: str, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    checkpoints = await saved.of_model(session, tenant_id, run_id)
    last = checkpoints[0] if checkpoints else None
    model = await session.get(TinkerModel, run_id)
    if model is not None and model.tenant_id == tenant_id:
        return _training_run(
            run_id, tenant_id, model.base_model, model.lora_rank, model.created_at, last
        )
    if last is None:
        raise NotFound(f"no training run {run_id}", field="training_run_id")
    return _training_run(run_id, tenant_id, last.base_model, last.lora_rank, last.created_at, last)


@router.get("/training_runs/{run_id}/checkpoints")
async def list_checkpoints(
    run_id: str, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    """The model's saved states, newest first. Sampler weights are not listed: they live
    in the worker's memory, not the store (docs/tinker.md)."""
    checkpoints = await saved.of_model(session, tenant_id, run_id)
    if not checkpoints:
        model = await session.get(TinkerModel, run_id)
        if model is None or model.tenant_id != tenant_id:
            raise NotFound(f"no training run {run_id}", field="training_run_id")
    return {"checkpoints": [saved.as_sdk(c) for c in checkpoints], "cursor": None}


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}", status_code=204)
async def delete_checkpoint(
    request: Request, run_id: str, checkpoint_id: str, session: SessionDep, tenant_id: TenantDep
) -> Response:
    """Delete a saved state: its bytes leave the store and the tenant's artifact_bytes."""
    kind, _, name = checkpoint_id.partition("/")
    if kind != saved.WEIGHTS:
        raise BadRequest(
            f"checkpoint_id {checkpoint_id!r}: only saved states (weights/<name>) are kept in "
            "the store and deleted here; sampler weights go when their model is unloaded",
            field="checkpoint_id",
        )
    path = saved.weights_path(run_id, name)
    checkpoint = await saved.owned(session, tenant_id, path, field="checkpoint_id")
    await saved.delete(session, request.app.state.rlaas.settings, checkpoint)
    return Response(status_code=204)


@router.get("/checkpoints")
async def list_user_checkpoints(
    session: SessionDep, tenant_id: TenantDep, limit: Limit = 100, offset: Offset = 0
) -> dict[str, Any]:
    """Every saved state of the tenant's, newest first, a page at a time."""
    page, total = await saved.of_tenant(session, tenant_id, limit, offset)
    cursor = {"offset": offset, "limit": limit, "total_count": total}
    return {"checkpoints": [saved.as_sdk(c) for c in page], "cursor": cursor}


@router.post("/weights_info")
async def weights_info(
    request: Request, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    """What loading a path takes: its base and LoRA rank (saved state or sampler weights)."""
    path = _field(await _body(request), "tinker_path")
    if path.startswith(PATH_PREFIX) and path.split("/")[3:4] == [saved.SAMPLER_WEIGHTS]:
        model = await _owned_path(session, tenant_id, path)
        base, rank = model.base_model, model.lora_rank
    else:
        checkpoint = await saved.owned(session, tenant_id, path, field="tinker_path")
        base, rank = checkpoint.base_model, checkpoint.lora_rank
    return {
        "base_model": base,
        "optimizer_config": {"type": "adamw"},
        "is_lora": True,
        "lora_rank": rank,
        "train_unembed": False,
        "train_mlp": False,
        "train_attn": True,
    }
