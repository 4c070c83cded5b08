"""GET /metrics: Prometheus text format (no API key; keep it off the public listener)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.deps import StateDep
from app.observability import Observability

router = APIRouter(tags=["operations"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request, app_state: StateDep) -> Response:
    obs: Observability = request.app.state.observability
    return Response(await obs.render(app_state.sessions), media_type=CONTENT_TYPE_LATEST)
