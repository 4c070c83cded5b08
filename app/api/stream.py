"""The live metrics stream: GET /v1/runs/{id}/metrics/stream (server-sent events)."""

from __future__ import annotations

import contextlib
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.api.deps import SessionDep, StateDep, TenantDep
from app.errors import BadRequest
from app.live import stream as service
from app.live.fanout import Hub
from app.schemas.results import INT32
from app.services.runs import get_run

router = APIRouter(prefix="/v1/runs", tags=["results"])


class EventStreamResponse(StreamingResponse):
    """A stream that ends when the client goes, whatever the ASGI server's spec version.

    Starlette stops listening for the disconnect on ASGI 2.4 servers and learns of it
    at the next send; a quiet stream would then hold its subscription until the next
    keep-alive. Here the disconnect cancels the stream at once, and the generator is
    closed so its subscription is released.
    """

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    with contextlib.suppress(OSError):  # the client went mid-send
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            closer = getattr(self.body_iterator, "aclose", None)
            if closer is not None:
                await closer()


def _after(last_event_id: str | None, after_step: int | None) -> int:
    # A reconnecting EventSource sends Last-Event-ID with the URL it first opened: the
    # header is the newer position, so it wins over ?after_step=.
    if last_event_id is not None and last_event_id.strip():
        try:
            step = int(last_event_id.strip())
        except ValueError:
            step = -2
        if not -1 <= step <= INT32:
            raise BadRequest(
                "Last-Event-ID must be the id of an event of this stream (a step number)",
                field="Last-Event-ID",
            )
        return step
    return -1 if after_step is None else after_step


@router.get(
    "/{run_id}/metrics/stream",
    response_class=EventStreamResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
)
async def stream_metrics(
    run_id: str,
    request: Request,
    session: SessionDep,
    tenant_id: TenantDep,
    app_state: StateDep,
    after_step: Annotated[int | None, Query(ge=-1, le=INT32)] = None,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
) -> EventStreamResponse:
    after = _after(last_event_id, after_step)
    await get_run(session, tenant_id, run_id)
    hub: Hub = request.app.state.fanout
    events = service.metrics_events(
        hub, run_id, after=after, keepalive_s=app_state.settings.stream_keepalive_s
    )
    return EventStreamResponse(
        events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
