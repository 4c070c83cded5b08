"""A run's checkpoint served for chat completions: which step, and where it answers.

``POST /v1/runs/{id}/chat/completions`` names the checkpoint in ``model`` (``"latest"``,
``"step-12"`` or ``"12"``). The first call for a (run, step) makes a `CheckpointServer`
row with a fresh secret and sends a worker of the serve queue the order to load it
(worker/serving.py); the calls meanwhile answer 503 with ``Retry-After`` (the official
``openai`` client waits and retries). Once the worker has loaded it, it registers its
server's URL on the row, and calls are proxied there with the secret. The worker
deletes the row when it stops (idle); a row whose worker stopped answering is dropped
at the failed call, and one never registered within `LOAD_TIMEOUT_S` is asked again,
so a lost worker costs a reload, not a dead route. docs/serving.md.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.crypto import SecretBox
from app.db.models import Artifact, CheckpointServer, Run
from app.errors import BadRequest, Conflict, NotFound, Unauthorized, Unavailable
from app.services.runs import get_run

LOAD_TIMEOUT_S = 600.0  # a request no worker registered within this is sent again
RETRY_AFTER_S = 3  # loading the tiny model takes seconds; a large one, a minute or more
_STEP = re.compile(r"(?:step-)?(\d{1,10})")


class Target(NamedTuple):
    """Where the step answers, and the secret its server takes."""

    server_id: str
    url: str
    token: str
    step: int


def requested_model(body: bytes) -> str:
    """The request's ``model``: which checkpoint it asks for."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}", field="body") from exc
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object (a chat completion request)", field="body")
    model = data.get("model")
    if not isinstance(model, str):
        raise BadRequest(
            'model must name the checkpoint to answer with: "latest", "step-12" or "12"',
            field="model",
        )
    return model


def pick_step(model: str, steps: list[int], run_id: str) -> int:
    """The checkpoint step ``model`` names among the run's ``steps`` (ascending)."""
    if not steps:
        raise Conflict(
            f"run {run_id} has no checkpoint yet: it is saved every train.checkpoint_interval "
            "steps and at the end; call again once one is listed at "
            f"/v1/runs/{run_id}/checkpoints",
            field="model",
        )
    if model == "latest":
        return steps[-1]
    match = _STEP.fullmatch(model.strip())
    if match is None or int(match.group(1)) not in steps:
        raise NotFound(
            f"run {run_id} has no checkpoint {model!r}; model must be one of "
            f'{", ".join(f"step-{s}" for s in steps)}, or "latest" (step-{steps[-1]})',
            field="model",
        )
    return int(match.group(1))


async def target(
    session: AsyncSession, tenant_id: str, run_id: str, model: str, box: SecretBox
) -> Target | dict[str, Any]:
    """The server answering the run's checkpoint ``model`` names; or, when none serves it
    and none was asked for, the order to send a worker once this transaction commits
    (the caller then answers 503). 404 for another tenant's run, as for an unknown one."""
    run = await get_run(session, tenant_id, run_id)
    checkpoints = {
        a.step: a
        for a in await session.scalars(
            select(Artifact).where(Artifact.run_id == run.id, Artifact.kind == "checkpoint")
        )
    }
    step = pick_step(model, sorted(checkpoints), run.id)
    server = await session.scalar(
        select(CheckpointServer).where(
            CheckpointServer.run_id == run.id, CheckpointServer.step == step
        )
    )
    now = datetime.now(UTC)
    if server is not None and server.error is not None:
        error = server.error
        await session.delete(server)  # the next call asks again (a worker may do better)
        await session.commit()
        raise Conflict(
            f"the worker could not load the checkpoint of step {step} of run {run.id}: {error}",
            field="model",
        )
    if server is not None and server.url is not None:
        token = box.decrypt(server.token_encrypted, context=f"serving:{server.id}")
        return Target(server.id, server.url, token, step)
    if server is not None and _aware(server.requested_at) > now - timedelta(seconds=LOAD_TIMEOUT_S):
        raise loading(run.id, step)
    if server is not None:  # asked long ago and never registered: its worker is gone
        await session.delete(server)
        await session.flush()
    return await _ask(session, run, step, checkpoints[step].uri, box)


async def _ask(
    session: AsyncSession, run: Run, step: int, uri: str, box: SecretBox
) -> dict[str, Any]:
    server_id, token = f"srv_{secrets.token_hex(12)}", secrets.token_urlsafe(32)
    session.add(
        CheckpointServer(
            id=server_id,
            run_id=run.id,
            step=step,
            token_encrypted=box.encrypt(token, context=f"serving:{server_id}"),
        )
    )
    try:
        await session.flush()
    except IntegrityError as exc:  # a concurrent call asked first: it sends the order
        raise loading(run.id, step) from exc
    return {
        "server_id": server_id,
        "token": token,  # travels on the broker, which only the deployment's parts reach
        "run_id": run.id,
        "step": step,
        "uri": uri,
        "spec": run.spec,
    }


def loading(run_id: str, step: int) -> Unavailable:
    return Unavailable(
        f"the checkpoint of step {step} of run {run_id} is being loaded by a worker; "
        f"retry after {RETRY_AFTER_S} s (the openai client does so on its own)",
        retry_after_s=RETRY_AFTER_S,
        field="model",
    )


async def dropped(session: AsyncSession, server_id: str) -> None:
    """The server stopped answering (its worker died or went idle as the call came):
    forget it, so that the next call asks for another."""
    await session.execute(delete(CheckpointServer).where(CheckpointServer.id == server_id))


# --- the worker's side: /internal/serving/{id}, behind the order's secret --------------


async def _own(
    session: AsyncSession, server_id: str, token: str, box: SecretBox
) -> CheckpointServer:
    server = await session.get(CheckpointServer, server_id)
    if server is None:
        raise NotFound(
            f"no checkpoint server {server_id}: the API no longer waits for it (stop)",
            field="server_id",
        )
    expected = box.decrypt(server.token_encrypted, context=f"serving:{server.id}")
    if not secrets.compare_digest(expected.encode(), token.encode()):
        raise Unauthorized("this route takes the serving order's token")
    return server


async def wanted(session: AsyncSession, server_id: str, token: str, box: SecretBox) -> None:
    await _own(session, server_id, token, box)


async def register(
    session: AsyncSession, server_id: str, token: str, url: str, box: SecretBox
) -> CheckpointServer:
    server = await _own(session, server_id, token, box)
    server.url, server.ready_at = url, datetime.now(UTC)
    await session.flush()
    return server


async def failed(
    session: AsyncSession, server_id: str, token: str, error: str, box: SecretBox
) -> None:
    server = await _own(session, server_id, token, box)
    server.error = error
    await session.flush()


async def deregister(session: AsyncSession, server_id: str, token: str, box: SecretBox) -> None:
    server = await _own(session, server_id, token, box)
    await session.delete(server)
    await session.flush()


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


__all__ = [
    "Target",
    "deregister",
    "dropped",
    "failed",
    "loading",
    "pick_step",
    "register",
    "requested_model",
    "target",
    "wanted",
]
