"""What a session's client is told once its run has ended and its gateway is gone.

A session's key is HMAC-SHA256 of its session id under the run's gateway token,
URL-safe base64 without padding (`rl_core.sessions.broker.SessionBroker.session_key`;
the worker's gateway derives them so). The control plane keeps that token, encrypted,
after the run ends, so it can tell a session's real key from any other string, and
answer the run's end to that session's client alone: the session routes take no API
key, and to a caller without the key a run's existence and state stay untold (404).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.crypto import SecretBox
from app.db.models import Run
from app.errors import Gone
from app.services import run_states


def session_key(gateway_token: str, session_id: str) -> str:
    """The key the gateway gave session ``session_id`` (the module docstring)."""
    mac = hmac.new(gateway_token.encode(), session_id.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


async def run_ended(
    session: AsyncSession, run_id: str, session_id: str, key: str, box: SecretBox
) -> Gone | None:
    """410 naming how the run ended, when ``key`` is session ``session_id``'s of run
    ``run_id`` and the run has ended; None otherwise (the caller answers its 404)."""
    run = await session.scalar(select(Run).where(Run.id == run_id))
    if run is None or run.status not in run_states.TERMINAL or not run.gateway_token_encrypted:
        return None
    token = box.decrypt(run.gateway_token_encrypted, context=f"gateway:{run.id}")
    if not hmac.compare_digest(session_key(token, session_id).encode(), key.encode()):
        return None
    failed = run.status == run_states.FAILED and run.error
    how = f"{run.status}: {run.error}" if failed else run.status
    return Gone(
        f"run {run_id} has ended ({how}); session {session_id!r} ended with it. Open no "
        "more sessions of this run",
        field="run_id",
    )


__all__ = ["run_ended", "session_key"]
