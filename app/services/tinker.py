"""Futures of the Tinker-compatible API: stored in the database, answered by the model worker.

A work route writes a `TinkerFuture` row (pending) and answers its id at once; a task of
this process then makes the call on the worker that holds the model
(worker/tinker_server.py, at ``RLAAS_TINKER_WORKER_URL``) and writes the answer, already
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
from typing import Any

import httpx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import TinkerFuture, utcnow
from app.errors import AppError

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


class TinkerCalls:
    """The calls in flight from this process to the model worker."""

    def __init__(self, url: str | None, token: str | None) -> None:
        self.url = url.rstrip("/") if url else None
        self.token = token or ""
        self.in_flight: dict[str, asyncio.Task[None]] = {}

    def require(self) -> None:
        if self.url is None:
            raise WorkerUnavailable(
                "this deployment serves no Tinker models: set RLAAS_TINKER_WORKER_URL to a "
                "running tinker worker (docs/tinker.md)"
            )

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The worker's answer, or a `WorkerRefusal` with its message."""
        async with httpx.AsyncClient(timeout=WORKER_TIMEOUT_S) as client:
            r = await client.post(
                f"{self.url}{path}", json=body, headers={"Authorization": f"Bearer {self.token}"}
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
