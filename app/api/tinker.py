"""Tinker-compatible routes (``/api/v1/...``): the official ``tinker`` SDK, pointed at rlaas
by ``base_url``, runs unchanged (docs/tinker.md).

Auth is the SDK's ``X-API-Key``; the SDK refuses a key that does not start ``tml-``, so a
tenant sends its rlaas key with that prefix (``tml-rlaas_...``) and we drop it. Every call
spends one request of the tenant's quota, as any ``/v1`` call.

Work calls (create_model, forward_backward, optim_step, save_weights_for_sampler, asample,
unload_model) answer a future id at once (app.services.tinker); ``retrieve_future``
long-polls it for up to ``RLAAS_TINKER_LONG_POLL_S`` (30 s), then answers ``try_again``.
Another tenant's model, sampler or future is a 404, as one that does not exist. Models per
base, calls in flight and tokens per minute are limited per tenant
(app.services.tinker_limits): 429.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from datetime import UTC
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response
from sqlalchemy import delete, select

from app.api.deps import SessionDep, StateDep, WorkerIdentityDep, _authenticated
from app.db.models import TinkerFuture, TinkerModel, TinkerSampler, utcnow
from app.db.models import TinkerWorker as TinkerWorkerRow
from app.errors import BadRequest, Gone, NotFound, Unauthorized
from app.security import parse_prefix
from app.services import tinker_wire as wire
from app.services.tinker import (
    Target,
    TinkerCalls,
    WorkerRefusal,
    as_json,
    holder,
    new_id,
    offered_bases,
    pick,
    register,
)
from app.services.tinker_limits import LOST_AFTER, admit_call, take_tokens
from rl_core.errors import UnsupportedSpec
from rl_core.protocol import internal as protocol
from rl_core.protocol import tinker_losses, tinker_sampling

router = APIRouter(prefix="/api/v1", tags=["tinker"], include_in_schema=False)
# Model workers register here (worker/tinker_server.py), with their own worker credential.
internal_router = APIRouter(prefix="/internal/tinker", tags=["internal"])

POLL_EVERY_S = 0.2  # a call another API process makes: read its row this often
PATH_PREFIX = "tinker://"


async def tinker_tenant(
    request: Request,
    session: SessionDep,
    app_state: StateDep,
    x_api_key: Annotated[str | None, Header()] = None,
) -> str:
    if not x_api_key:
        raise Unauthorized("missing X-API-Key; send 'tml-' + your rlaas key", field="X-API-Key")
    key = x_api_key.removeprefix("tml-")
    tenant_id = await _authenticated(request, session, app_state, f"Bearer {key}")
    await app_state.limits.take_request(session, tenant_id)
    return tenant_id


TenantDep = Annotated[str, Depends(tinker_tenant, scope="function")]


def calls_of(request: Request) -> TinkerCalls:
    calls: TinkerCalls | None = getattr(request.app.state, "tinker", None)
    if calls is None:
        calls = request.app.state.tinker = TinkerCalls()
    return calls


async def _holder(request: Request, session: SessionDep, model: TinkerModel) -> Target:
    app_state = request.app.state.rlaas
    return await holder(session, app_state.settings, app_state.secrets, model)


async def _pick(request: Request, session: SessionDep, base: str) -> Target:
    app_state = request.app.state.rlaas
    return await pick(session, app_state.settings, app_state.secrets, base)


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise BadRequest("body must be a JSON object", field="body") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object", field="body")
    return body


def _field(body: dict[str, Any], name: str, kind: type = str) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BadRequest(f"{name} must be a {kind.__name__}", field=name)
    return value


async def _model(session: SessionDep, tenant_id: str, model_id: str) -> TinkerModel:
    found = await session.get(TinkerModel, model_id)
    if found is None or found.tenant_id != tenant_id:
        raise NotFound(f"no model {model_id}", field="model_id")
    return found


async def _admit(request: Request, session: SessionDep, tenant_id: str) -> None:
    await admit_call(session, request.app.state.rlaas.settings, tenant_id)


async def _future(session: SessionDep, tenant_id: str, kind: str) -> str:
    future_id = new_id("tf")
    session.add(TinkerFuture(id=future_id, tenant_id=tenant_id, kind=kind, state="pending"))
    await session.commit()  # durable before the task that finishes it starts
    return future_id


# --- what the SDK asks before any work ---------------------------------------------------


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.post("/client/config")
async def client_config(
    app_state: StateDep,
    _tenant: TenantDep,
    x_api_key: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    # The SDK splits forward_backward into chunks of at most this many bytes (by its own
    # estimate); half the tenant's body quota keeps each chunk's body under it.
    key = (x_api_key or "").removeprefix("tml-")
    limit = await app_state.limits.body_limit(app_state.sessions, parse_prefix(key))
    return {
        "use_pyqwest_transport": False,  # httpx, not the SDK's optional transport
        "proto_compress_fwdbwd": False,
        "fwdbwd_max_chunk_bytes_count": max(1, limit // 2),
    }


@router.post("/create_session")
async def create_session(_tenant: TenantDep) -> dict[str, Any]:
    return {"type": "create_session", "session_id": new_id("tss")}


@router.post("/session_heartbeat")
async def session_heartbeat(_tenant: TenantDep) -> dict[str, Any]:
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: str, _tenant: TenantDep) -> Response:
    """The SDK's ``ServiceClient.close()`` (and the end of ``with ServiceClient(...)``):
    sessions are not kept, so there is nothing to end; a 404 here failed a loop that had
    done all its work."""
    return Response(status_code=204)


@router.post("/telemetry")
async def telemetry(_tenant: TenantDep) -> dict[str, Any]:
    return {"status": "accepted"}  # the SDK's own telemetry: not kept


@router.get("/get_server_capabilities")
async def capabilities(
    app_state: StateDep, session: SessionDep, _tenant: TenantDep
) -> dict[str, Any]:
    bases = await offered_bases(session, app_state.settings)
    return {
        "supported_models": [
            {"model_name": b, "trainable": True, "sampleable": True} for b in bases
        ]
    }


# --- training ----------------------------------------------------------------------------


@router.post("/create_model")
async def create_model(
    request: Request, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    body = await _body(request)
    base = _field(body, "base_model")
    target = await _pick(request, session, base)
    lora = body.get("lora_config") or {}
    rank = lora.get("rank", 8)
    if not isinstance(rank, int) or not 1 <= rank <= 256:
        raise BadRequest(
            "lora_config.rank must be an integer from 1 to 256", field="lora_config.rank"
        )
    settings = request.app.state.rlaas.settings
    await admit_call(session, settings, tenant_id, new_model_on=base)
    model_id = new_id("tm")
    order = {"model_id": model_id, "base_model": base, "rank": rank, "seed": lora.get("seed") or 0}
    answer = {"model_id": model_id, "type": "create_model"}
    future_id = await start_model(request, session, tenant_id, target, order, answer)
    return {"request_id": future_id, "model_id": model_id}


async def start_model(
    request: Request,
    session: SessionDep,
    tenant_id: str,
    target: Target,
    order: dict[str, Any],
    answer: dict[str, Any],
) -> str:
    """Record the tenant's new model on ``target`` and have the worker make it (``order``,
    its ``POST /models`` body) behind a future that answers ``answer``; the future's id.
    create_model and create_training_client_from_state (app.api.tinker_state) both."""
    model_id = str(order["model_id"])
    session.add(
        TinkerModel(
            id=model_id,
            tenant_id=tenant_id,
            base_model=str(order["base_model"]),
            lora_rank=int(order["rank"]),
            worker_id=target.worker_id,
        )
    )
    future_id = await _future(session, tenant_id, str(answer["type"]))
    calls, sessions = calls_of(request), request.app.state.rlaas.sessions

    async def call() -> dict[str, Any]:
        try:
            await calls.post(target, "/models", order)
        except WorkerRefusal:
            # A model the worker refused to make holds none of the tenant's model slots. One
            # it did not answer for (unreachable, timed out) may be there: it stays, and
            # answers 410 once that worker has gone, until the tenant unloads it.
            async with sessions() as cleanup:
                await cleanup.execute(delete(TinkerModel).where(TinkerModel.id == model_id))
                await cleanup.commit()
            raise
        return answer

    calls.start(sessions, future_id, call)
    return future_id


@router.post("/get_info")
async def get_info(request: Request, session: SessionDep, tenant_id: TenantDep) -> dict[str, Any]:
    model = await _model(session, tenant_id, _field(await _body(request), "model_id"))
    return {
        "type": "get_info",
        "model_id": model.id,
        "model_data": {"arch": "rlaas-decoder", "model_name": model.base_model},
        "is_lora": True,
        "lora_rank": model.lora_rank,
        "model_name": model.base_model,
    }


@router.post("/forward_backward")
async def forward_backward(
    request: Request, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    calls = calls_of(request)
    if wire.PROTOBUF not in request.headers.get("content-type", ""):
        raise BadRequest("forward_backward takes a protobuf body (tinker SDK 0.38)", field="body")
    if request.headers.get("content-encoding"):
        raise BadRequest("send forward_backward uncompressed", field="Content-Encoding")
    order = wire.read_forward_backward(await request.body())
    try:  # a loss or config the trainer would refuse is refused here, before any work
        tinker_losses.resolve_config(order["loss_fn"], order["loss_fn_config"])
    except UnsupportedSpec as exc:
        raise BadRequest(str(exc), field=exc.field) from None
    model = await _model(session, tenant_id, order.pop("model_id"))
    target = await _holder(request, session, model)
    await _admit(request, session, tenant_id)
    tokens = sum(len(datum["tokens"]) for datum in order["data"])
    await take_tokens(request.app.state.rlaas.limits, session, tenant_id, tokens)
    future_id = await _future(session, tenant_id, "forward_backward")

    def encode(answer: dict[str, Any]) -> tuple[bytes, str]:
        return wire.write_forward_backward_output(answer["logprobs"], answer["loss"]), wire.PROTOBUF

    async def call() -> dict[str, Any]:
        return await calls.post(target, f"/models/{model.id}/forward_backward", order)

    calls.start(request.app.state.rlaas.sessions, future_id, call, encode)
    return {"request_id": future_id, "model_id": model.id}


@router.post("/optim_step")
async def optim_step(request: Request, session: SessionDep, tenant_id: TenantDep) -> dict[str, Any]:
    calls = calls_of(request)
    body = await _body(request)
    model = await _model(session, tenant_id, _field(body, "model_id"))
    target = await _holder(request, session, model)
    adam = body.get("adam_params")
    if not isinstance(adam, dict):
        raise BadRequest("adam_params must be an object (only Adam is served)", field="adam_params")
    order = {"seq_id": body.get("seq_id"), "adam": adam}
    await _admit(request, session, tenant_id)
    future_id = await _future(session, tenant_id, "optim_step")

    async def call() -> dict[str, Any]:
        answer = await calls.post(target, f"/models/{model.id}/optim_step", order)
        return {"type": "optim_step", "metrics": answer["metrics"]}

    calls.start(request.app.state.rlaas.sessions, future_id, call)
    return {"request_id": future_id, "model_id": model.id}


@router.post("/save_weights_for_sampler")
async def save_for_sampler(
    request: Request, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    calls = calls_of(request)
    body = await _body(request)
    model = await _model(session, tenant_id, _field(body, "model_id"))
    target = await _holder(request, session, model)
    seq_id = body.get("seq_id")
    name = body.get("path") or f"snapshot-{seq_id}"
    if not isinstance(name, str) or "/" in name:
        raise BadRequest("path must be a name without '/'", field="path")
    path = f"{PATH_PREFIX}{model.id}/sampler_weights/{name}"
    sampler_id = None
    if body.get("path") is None:  # the SDK's save_weights_and_get_sampling_client
        sampler_id = new_id("ts")
        session.add(
            TinkerSampler(
                id=sampler_id, tenant_id=tenant_id, base_model=model.base_model, model_path=path
            )
        )
    await _admit(request, session, tenant_id)
    future_id = await _future(session, tenant_id, "save_weights_for_sampler")

    async def call() -> dict[str, Any]:
        order = {"seq_id": seq_id, "path": path}
        await calls.post(target, f"/models/{model.id}/save_for_sampler", order)
        return {"type": "save_weights_for_sampler", "path": path, "sampling_session_id": sampler_id}

    calls.start(request.app.state.rlaas.sessions, future_id, call)
    return {"request_id": future_id, "model_id": model.id}


@router.post("/unload_model")
async def unload_model(
    request: Request, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    """Free one of the tenant's model slots on its base (RLAAS_TINKER_MAX_MODELS_PER_BASE):
    the model, its sampler weights and sampling sessions on them are gone at once (404
    from now on); the worker drops them from its memory in the future's call. Not held
    to the calls-in-flight limit: it is how a tenant at a limit makes room."""
    calls = calls_of(request)
    model = await _model(session, tenant_id, _field(await _body(request), "model_id"))
    model_id = model.id
    target: Target | None
    try:
        target = await _holder(request, session, model)
    except Gone:
        target = None  # its worker has gone, and its weights with it: only the rows are left
    await session.execute(
        delete(TinkerSampler).where(
            TinkerSampler.tenant_id == tenant_id,
            TinkerSampler.model_path.startswith(f"{PATH_PREFIX}{model_id}/", autoescape=True),
        )
    )
    await session.delete(model)
    future_id = await _future(session, tenant_id, "unload_model")

    async def call() -> dict[str, Any]:
        if target is not None:
            await calls.post(target, f"/models/{model_id}/unload", {})
        return {"type": "unload_model", "model_id": model_id}

    calls.start(request.app.state.rlaas.sessions, future_id, call)
    return {"request_id": future_id, "model_id": model_id}


# --- sampling ----------------------------------------------------------------------------


async def _owned_path(session: SessionDep, tenant_id: str, path: str) -> TinkerModel:
    if not path.startswith(PATH_PREFIX):
        raise BadRequest(f"model_path must start {PATH_PREFIX}", field="model_path")
    model_id = path.removeprefix(PATH_PREFIX).split("/", 1)[0]
    try:
        return await _model(session, tenant_id, model_id)
    except NotFound:
        raise NotFound(f"no sampler weights at {path}", field="model_path") from None


@router.post("/create_sampling_session")
async def create_sampling_session(
    request: Request, session: SessionDep, tenant_id: TenantDep
) -> dict[str, Any]:
    body = await _body(request)
    path, base = body.get("model_path"), body.get("base_model")
    if path:
        base = (await _owned_path(session, tenant_id, _field(body, "model_path"))).base_model
    else:
        await _pick(request, session, _field(body, "base_model"))  # refuses a base not served
    sampler_id = new_id("ts")
    session.add(TinkerSampler(id=sampler_id, tenant_id=tenant_id, base_model=base, model_path=path))
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, session: SessionDep, tenant_id: TenantDep) -> dict[str, Any]:
    found = await session.get(TinkerSampler, sampler_id)
    if found is None or found.tenant_id != tenant_id:
        raise NotFound(f"no sampler {sampler_id}", field="sampler_id")
    return {"sampler_id": found.id, "base_model": found.base_model, "model_path": found.model_path}


@router.post("/asample")
async def asample(request: Request, session: SessionDep, tenant_id: TenantDep) -> dict[str, Any]:
    calls = calls_of(request)
    body = await _body(request)
    path, base = body.get("model_path"), body.get("base_model")
    if body.get("sampling_session_id"):
        found = await session.get(TinkerSampler, body["sampling_session_id"])
        if found is None or found.tenant_id != tenant_id:
            raise NotFound(
                f"no sampling session {body['sampling_session_id']}", field="sampling_session_id"
            )
        path, base = found.model_path, found.base_model
    if path:
        target = await _holder(request, session, await _owned_path(session, tenant_id, path))
    elif isinstance(base, str):
        target = await _pick(request, session, base)
    else:
        raise BadRequest("base_model must be a string (or send model_path)", field="base_model")
    tokens: list[int] = []
    for chunk in (body.get("prompt") or {}).get("chunks") or []:
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise BadRequest("only encoded_text prompt chunks are served", field="prompt.chunks")
        tokens.extend(int(t) for t in chunk.get("tokens") or [])
    if not tokens:
        raise BadRequest("prompt has no tokens", field="prompt")
    params = body.get("sampling_params") or {}
    stop = params.get("stop")
    if isinstance(stop, str) or (stop and any(isinstance(s, str) for s in stop)):
        raise BadRequest(
            "stop strings are not served yet; pass stop token ids", field="sampling_params.stop"
        )
    n = body.get("num_samples", 1)
    if not isinstance(n, int) or not 1 <= n <= 64:
        raise BadRequest("num_samples must be an integer from 1 to 64", field="num_samples")
    max_tokens = params.get("max_tokens") or 16
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(
            "sampling_params.max_tokens must be a positive integer",
            field="sampling_params.max_tokens",
        )
    try:  # prompt logprobs and top-k: what is served, checked before any work
        scoring = tinker_sampling.read_scoring(body, len(tokens))
    except UnsupportedSpec as exc:
        raise BadRequest(str(exc), field=exc.field) from None
    order = {
        "base_model": base,
        "model_path": path,
        "prompt": tokens,
        "prompt_logprobs": scoring.prompt_logprobs,
        "prompt_logprobs_last_n": scoring.last_n,
        "topk_prompt_logprobs": scoring.topk_prompt,
        "topk_sample_logprobs": scoring.topk_sample,
        "num_samples": n,
        "max_tokens": max_tokens,
        "temperature": params.get("temperature", 1.0),
        "top_k": params.get("top_k", -1),
        "top_p": params.get("top_p", 1.0),
        # No seed: fresh randomness for each call, as Tinker samples. (The worker seeds
        # sample i with seed + i, so a loop sampling one at a time without a seed would
        # otherwise get the same completion every time.)
        "seed": params.get("seed") if params.get("seed") is not None else secrets.randbits(31),
        "stop_ids": stop or [],
    }
    await _admit(request, session, tenant_id)
    # What the engine handles: the prompt, and up to max_tokens for each sample.
    cost = len(tokens) + max_tokens * n
    await take_tokens(request.app.state.rlaas.limits, session, tenant_id, cost)
    future_id = await _future(session, tenant_id, "sample")

    def encode(answer: dict[str, Any]) -> tuple[bytes, str]:
        body = wire.write_sample_response(
            answer["sequences"],
            prompt_logprobs=answer.get("prompt_logprobs"),
            topk_prompt=answer.get("topk_prompt_logprobs"),
        )
        return body, wire.PROTOBUF

    async def call() -> dict[str, Any]:
        return await calls.post(target, "/sample", order)

    calls.start(request.app.state.rlaas.sessions, future_id, call, encode)
    return {"request_id": future_id, "sample_sequence_ids": [f"{future_id}-{i}" for i in range(n)]}


# --- futures -----------------------------------------------------------------------------


@router.post("/retrieve_future")
async def retrieve_future(request: Request, session: SessionDep, tenant_id: TenantDep) -> Response:
    future_id = _field(await _body(request), "request_id")
    found = await session.get(TinkerFuture, future_id)
    if found is None or found.tenant_id != tenant_id:
        raise NotFound(f"no future {future_id}", field="request_id")
    await session.commit()  # what follows reads with sessions of its own
    sessions = request.app.state.rlaas.sessions
    long_poll_s = request.app.state.rlaas.settings.tinker_long_poll_s
    task = calls_of(request).in_flight.get(future_id)
    if task is not None:  # this process makes the call: wake when it ends
        await asyncio.wait({task}, timeout=long_poll_s)
    deadline = time.monotonic() + (0 if task is not None else long_poll_s)
    while True:
        async with sessions() as poll:
            row = await poll.scalar(select(TinkerFuture).where(TinkerFuture.id == future_id))
        assert row is not None
        if row.state == "done":
            return Response(row.result or b"", media_type=row.media_type)
        if row.state == "failed":
            body, _ = as_json({"error": row.error, "category": row.error_category or "unknown"})
            return Response(body, media_type="application/json")
        created = row.created_at  # SQLite (the embedded default) gives it back naive
        created = created if created.tzinfo is not None else created.replace(tzinfo=UTC)
        if task is None and utcnow() - created > LOST_AFTER:
            # No process is making this call any more (the API restarted meanwhile).
            raise Gone(f"future {future_id} was lost; send the call again")
        if time.monotonic() >= deadline:
            body, _ = as_json(
                {"type": "try_again", "request_id": future_id, "queue_state": "active"}
            )
            return Response(body, media_type="application/json")
        await asyncio.sleep(POLL_EVERY_S)


# --- model workers -----------------------------------------------------------------------


@internal_router.post("/workers", status_code=201)
async def register_worker(
    body: protocol.TinkerWorkerBody,
    session: SessionDep,
    app_state: StateDep,
    identity: WorkerIdentityDep,
) -> protocol.TinkerWorkerRead:
    """A model worker's URL, its secret (which the control plane sends as its bearer) and
    the bases it offers; new models on those bases go to the newest worker offering them."""
    worker_id = await register(
        session, app_state.secrets, body.url, body.token, body.bases, identity.credential_id
    )
    return protocol.TinkerWorkerRead(id=worker_id)


@internal_router.delete("/workers/{worker_id}", status_code=204)
async def deregister_worker(
    worker_id: str, session: SessionDep, identity: WorkerIdentityDep
) -> Response:
    """The worker stops: its models' calls answer 410 from now on (their weights are gone).
    Only the credential that registered it may: another worker's is told it has no such
    worker (404), as one that never was."""
    found = await session.get(TinkerWorkerRow, worker_id)
    if found is None or found.credential_id != identity.credential_id:
        raise NotFound(f"no tinker worker {worker_id}", field="worker_id")
    await session.delete(found)
    return Response(status_code=204)
