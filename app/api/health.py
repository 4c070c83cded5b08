"""Liveness and readiness.

``/readyz`` also lists each worker's sandbox wall, from its last report
(app.services.worker_reports): ``bwrap`` runs tenant code; behind a weaker wall a worker
either refuses it (``tenant_code: refused``, the deployed default) or runs it because
its operator accepted that (``runs_on_weak_wall``). The list is the operator's, as
``/metrics`` is: answered to loopback clients, or with ``RLAAS_METRICS_TOKEN``.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.api.deps import StateDep
from app.services import worker_reports

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(
    request: Request,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    body: dict[str, Any] = {"status": "ready"}
    try:
        async with app_state.sessions() as session:
            await session.execute(text("SELECT 1"))
            if _operator(request, authorization, app_state.settings.metrics_token):
                body["workers"] = [
                    {
                        "worker_id": w.worker_id,
                        "queue": w.queue,
                        "sandbox_wall": w.sandbox_wall,
                        "tenant_code": w.tenant_code,
                        "reported_at": w.reported_at.isoformat(),
                    }
                    for w in await worker_reports.newest(session)
                ]
    except Exception as exc:
        return JSONResponse({"status": "unavailable", "database": str(exc)[:200]}, status_code=503)
    return JSONResponse(body)


def _operator(request: Request, authorization: str | None, token: str | None) -> bool:
    """The rule of /metrics: the metrics token where one is set, else a loopback client."""
    if token:
        given = (authorization or "").removeprefix("Bearer ")
        return hmac.compare_digest(given.encode(), token.encode())
    try:
        return request.client is not None and ipaddress.ip_address(request.client.host).is_loopback
    except ValueError:
        return False
