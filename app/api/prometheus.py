"""GET /metrics: Prometheus text format, for the operator only.

Not a tenant's route (no API key): with ``RLAAS_METRICS_TOKEN`` set the scraper sends
``Authorization: Bearer <token>``; without it only loopback clients are answered, so a
public listener never shows request counts, routes and queue depths to anyone.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.deps import StateDep
from app.errors import Forbidden, Unauthorized
from app.observability import Observability

router = APIRouter(tags=["operations"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(
    request: Request,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    token = app_state.settings.metrics_token
    if token:
        given = (authorization or "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise Unauthorized(
                "GET /metrics needs 'Authorization: Bearer <RLAAS_METRICS_TOKEN>'",
                field="Authorization",
            )
    elif not _loopback(request.client.host if request.client else None):
        raise Forbidden(
            "GET /metrics answers loopback clients only; set RLAAS_METRICS_TOKEN to scrape "
            "it from another host"
        )
    obs: Observability = request.app.state.observability
    return Response(await obs.render(app_state.sessions), media_type=CONTENT_TYPE_LATEST)


def _loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
