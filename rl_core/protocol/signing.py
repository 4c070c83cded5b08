"""Request signatures of the environment webhook protocol (v1).

Every request between rlaas and an environment server, and every deferred
result an environment posts back, carries::

    X-Rlaas-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>

The timestamp is inside the MAC, so a captured request cannot be replayed
after the window (5 minutes) closes; replays inside the window are stopped by
the receiver's ``(episode_id, step)`` idempotency. Several ``v1=`` values may
appear (a secret being rotated); one match is enough.
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "X-Rlaas-Signature"
WINDOW_S = 300


class SignatureError(ValueError):
    """The signature header is missing, malformed, stale or wrong; the message says which."""


def sign(secret: str | bytes, body: bytes, *, timestamp: int | None = None) -> str:
    """The header value for ``body``, signed now (or at ``timestamp``)."""
    ts = int(time.time()) if timestamp is None else timestamp
    return f"t={ts},v1={_mac(secret, ts, body)}"


def verify(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    *,
    now: float | None = None,
    window_s: int = WINDOW_S,
) -> int:
    """Check ``header`` against ``body``; return its timestamp or raise `SignatureError`."""
    if not header:
        raise SignatureError(f"missing {HEADER} header")
    ts: int | None = None
    macs: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError(f"{HEADER}: {part.strip()!r} is not key=value")
        if key == "t":
            try:
                ts = int(value)
            except ValueError:
                raise SignatureError(f"{HEADER}: t={value!r} is not a Unix time") from None
        elif key == "v1":
            macs.append(value)
    if ts is None or not macs:
        raise SignatureError(f"{HEADER} must carry t=<unix seconds> and v1=<hex hmac>")
    current = time.time() if now is None else now
    if abs(current - ts) > window_s:
        raise SignatureError(
            f"{HEADER}: timestamp {ts} is {abs(current - ts):.0f}s from now; "
            f"the window is {window_s}s (check the sender's clock)"
        )
    expected = _mac(secret, ts, body)
    if not any(hmac.compare_digest(expected, mac) for mac in macs):
        raise SignatureError(f"{HEADER}: signature does not match the body and secret")
    return ts


def _mac(secret: str | bytes, ts: int, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    mac = hmac.new(key, f"{ts}.".encode(), hashlib.sha256)
    mac.update(body)  # the body as it is, not a copy behind the prefix
    return mac.hexdigest()


__all__ = ["HEADER", "WINDOW_S", "SignatureError", "sign", "verify"]
