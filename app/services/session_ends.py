"""What a session's client is told once its session's gateway is gone: its run has
ended, or the worker serving it died and the run went on in another attempt.

A session's key is HMAC-SHA256 of its session id under the run's gateway token,
URL-safe base64 without padding (`rl_core.sessions.broker.SessionBroker.session_key`;
the worker's gateway derives them so). The control plane keeps that token, encrypted,
after the run ends, so it can tell a session's real key from any other string, and
answer the run's end to that session's client alone: the session routes take no API
key, and to a caller without the key a run's existence and state stay untold (404).

A session lives in its worker's memory (its calls are the trajectory being built), so
no other worker can go on with it. A claim keeps the attempt before's token, so once a
new attempt holds the run, a call with a key of the attempt that died is answered 410
"lost": the client plays the episode again in a new session, and the group is filled
by the new attempt as any group is.
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


async def session_gone(
    session: AsyncSession, run_id: str, session_id: str, key: str, box: SecretBox
) -> Gone | None:
    """410 when ``key`` is session ``session_id``'s of run ``run_id`` and the session is
    gone for good: the run has ended (naming how), or the attempt that served the session
    has been replaced by a new one (lost: play the episode again). None otherwise (the
    caller answers its 404)."""
    run = await session.scalar(select(Run).where(Run.id == run_id))
    if run is None:
        return None
    context = f"gateway:{run.id}"
    current, previous = run.gateway_token_encrypted, run.gateway_token_previous_encrypted
    ended = run.status in run_states.TERMINAL
    if ended and current and _holds(box, current, context, session_id, key):
        failed = run.status == run_states.FAILED and run.error
        how = f"{run.status}: {run.error}" if failed else run.status
        return Gone(
            f"run {run_id} has ended ({how}); session {session_id!r} ended with it. Open "
            "no more sessions of this run",
            field="run_id",
        )
    if previous and _holds(box, previous, context, session_id, key):
        return SessionLost(
            f"session {session_id!r} was lost: the worker serving it stopped and run "
            f"{run_id} went on in a new attempt ({run.attempts}), which does not have the "
            "session's calls. Its episode is not kept: open a new session and play the "
            "episode again",
            field="sid",
        )
    return None


class SessionLost(Gone):
    code = "session_lost"


def _holds(box: SecretBox, sealed: str, context: str, session_id: str, key: str) -> bool:
    token = box.decrypt(sealed, context=context)
    return hmac.compare_digest(session_key(token, session_id).encode(), key.encode())


__all__ = ["SessionLost", "session_gone", "session_key"]
