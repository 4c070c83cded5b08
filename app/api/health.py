"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.api.deps import StateDep

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(app_state: StateDep) -> JSONResponse:
    try:
        async with app_state.sessions() as session:
            await session.execute(text("SELECT 1"))
    except Exception as exc:
        return JSONResponse({"status": "unavailable", "database": str(exc)[:200]}, status_code=503)
    return JSONResponse({"status": "ready"})
