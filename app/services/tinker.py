"""Futures of the Tinker-compatible API: stored in the database, answered by the model worker.

A work route writes a `TinkerFuture` row (pending) and answers its id at once; a task of
this process then makes the call on the worker that holds the model (worker/tinker_server.py:
one that registered its URL, or the operator's ``RLAAS_TINKER_WORKER_URL``) and writes
the answer, already
in the form ``retrieve_future`` sends (protobuf for sample and forward_backward, JSON for
the rest), or the worker's refusal. ``retrieve_future`` long-polls the row.

A pending future whose task is not in this process (the API restarted meanwhile) is
answered 410, which makes the client send the call again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.crypto import SecretBox
from app.db.models import TinkerFuture, TinkerModel, TinkerWorker, utcnow
from app.errors import AppError, BadRequest, Gone
from app.settings import Settings

log = logging.getLogger(__name__)

JSON_TYPE = "application/json"
WORKER_TIMEOUT_S = 600.0  # one call: a base model's first load, or a large batch on CPU

Encode = Callable[[dict[str, Any]], tuple[bytes, str]]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def as_json(answer: dict[str, Any]) -> tuple[bytes, str]:
    return json.dumps(answer).encode(), JSON_TYPE


class WorkerUnavailable(AppError):
    status_code = 503
    code = "worker_unavailable"


@dataclass(frozen=True)
class Target:
    """A model worker: where it listens, its secret, and its row (None: the static one)."""

    url: str
    token: str
    worker_id: str | None


async def pick(session: AsyncSession, settings: Settings, box: SecretBox, base: str) -> Target:
    """The worker for a new model (or a base's sampling) on ``base``: the operator's
    ``RLAAS_TINKER_WORKER_URL`` when set, else the newest registered worker offering it."""
    if settings.tinker_worker_url:
        if base in static_bases(settings):
            return Target(
                settings.tinker_worker_url.rstrip("/"), settings.tinker_worker_token or "", None
            )
    else:
        rows = await session.scalars(
            select(TinkerWorker).order_by(TinkerWorker.registered_at.desc())
        )
        for row in rows:
            if base in row.bases:
                return _target(row, box)
    offered = await offered_bases(session, settings)
    if offered:
        raise BadRequest(
            f"base_model {base!r} is not served; use one of {offered}", field="base_model"
        )
    raise WorkerUnavailable(
        "this deployment serves no Tinker models: start a tinker worker "
        "(python -m worker.tinker_server) or set RLAAS_TINKER_WORKER_URL (docs/tinker.md)"
    )


async def holder(
    session: AsyncSession, settings: Settings, box: SecretBox, model: TinkerModel
) -> Target:
    """The worker that holds ``model``."""
    if model.worker_id is not None:
        row = await session.get(TinkerWorker, model.worker_id)
        if row is not None:
            return _target(row, box)
    elif settings.tinker_worker_url:
        return Target(
            settings.tinker_worker_url.rstrip("/"), settings.tinker_worker_token or "", None
        )
    raise Gone(
        f"the worker that held model {model.id} has gone, and its weights with it; "
        "create the model again",
        field="model_id",
    )


def _target(row: TinkerWorker, box: SecretBox) -> Target:
    return Target(row.url, box.decrypt(row.token_sealed, context=f"tinker-worker:{row.id}"), row.id)


def static_bases(settings: Settings) -> list[str]:
    return [b.strip() for b in settings.tinker_bases.split(",") if b.strip()]


async def offered_bases(session: AsyncSession, settings: Settings) -> list[str]:
    if settings.tinker_worker_url:
        return static_bases(settings)
    rows = await session.scalars(select(TinkerWorker))
    return sorted({base for row in rows for base in row.bases})


async def register(
    session: AsyncSession,
    box: SecretBox,
    url: str,
    token: str,
    bases: list[str],
    credential_id: str | None = None,
) -> str:
    worker_id = new_id("tw")
    sealed = box.encrypt(token, context=f"tinker-worker:{worker_id}")
    session.add(
        TinkerWorker(
            id=worker_id,
            url=url.rstrip("/"),
            token_sealed=sealed,
            bases=bases,
            credential_id=credential_id,
        )
    )
    return worker_id


class TinkerCalls:
    """The calls in flight from this process to model workers."""

    def __init__(self) -> None:
        self.in_flight: dict[str, asyncio.Task[None]] = {}

    async def post(self, target: Target, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The worker's answer, or a `WorkerRefusal` with its message."""
        async with httpx.AsyncClient(timeout=WORKER_TIMEOUT_S) as client:
            r = await client.post(
                f"{target.url}{path}",
                json=body,
                headers={"Authorization": f"Bearer {target.token}"},
            )
        answer: dict[str, Any] = r.json()
        if r.status_code != 200:
            raise WorkerRefusal(str(answer.get("error")), str(answer.get("category", "server")))
        return answer

    def start(
        self,
        sessions: async_sessionmaker[AsyncSession],
        future_id: str,
        call: Callable[[], Awaitable[dict[str, Any]]],
        encode: Encode = as_json,
    ) -> None:
        """Run ``call`` and store its encoded answer (or refusal) on the future's row."""

        async def run() -> None:
            values: dict[str, Any]
            try:
                result, media_type = encode(await call())
                values = {"state": "done", "result": result, "media_type": media_type}
            except WorkerRefusal as exc:
                values = {"state": "failed", "error": exc.message, "error_category": exc.category}
            except Exception as exc:
                log.exception("tinker future %s failed", future_id)
                values = {
                    "state": "failed",
                    "error": f"the model worker could not be reached or failed: {exc}",
                    "error_category": "server",
                }
            async with sessions() as session:
                await session.execute(
                    update(TinkerFuture)
                    .where(TinkerFuture.id == future_id)
                    .values(finished_at=utcnow(), **values)
                )
                await session.commit()
            self.in_flight.pop(future_id, None)

        self.in_flight[future_id] = asyncio.create_task(run(), name=f"tinker-{future_id}")

    async def close(self) -> None:
        for task in list(self.in_flight.values()):
            task.cancel()


class WorkerRefusal(Exception):
    def __init__(self, message: str, category: str) -> None:
        super().__init__(message)
        self.message, self.category = message, category
