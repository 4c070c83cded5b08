"""The SDK's errors. Every answer of the API that is not a success becomes one.

::

    RlaasError
    ├── ApiError                 the API answered with an error: status, code, field, message
    │   ├── BadRequest (400)     a query parameter or header is wrong (``field`` names it)
    │   ├── Unauthorized (401)   missing or unknown API key
    │   ├── NotFound (404)       no such run/environment for this key (other tenants' too)
    │   ├── Conflict (409)       the resource's state forbids it (the message says the state)
    │   ├── PayloadTooLarge (413)
    │   ├── Unprocessable (422)  the body is invalid; ``problems`` lists every field
    │   ├── RateLimited (429)    over a quota; ``retry_after_s`` says when to try again
    │   └── ServerError (5xx)
    └── Unreachable              no answer at all (refused, reset, timed out), after retries

The message is the server's, which says what to change.
"""

from __future__ import annotations

from typing import Any

import httpx


class RlaasError(Exception):
    """Anything the SDK raises on purpose."""


class ApiError(RlaasError):
    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        *,
        code: str = "error",
        details: dict[str, Any] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        where = f" (field: {field})" if field else ""
        super().__init__(f"HTTP {status} {code}: {message}{where}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        # Whatever else the error body carried (a quota's numbers, a 422's problems).
        self.details = details or {}
        self.retry_after_s = retry_after_s

    @property
    def problems(self) -> list[dict[str, Any]]:
        """A 422's every problem: [{field, in, reason}]."""
        return list(self.details.get("problems", []))


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class PayloadTooLarge(ApiError):
    pass


class Unprocessable(ApiError):
    pass


class RateLimited(ApiError):
    pass


class ServerError(ApiError):
    pass


class Unreachable(RlaasError):
    """The control plane gave no answer; the cause is chained (``__cause__``)."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: Unprocessable,
    429: RateLimited,
}


def error_from_response(response: httpx.Response) -> ApiError:
    """The typed error for an answer of 400 or more (its body must have been read)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        # Not our error shape: a route this server lacks ({"detail": ...}), or a proxy's page.
        detail = body.get("detail") if isinstance(body, dict) else None
        text = str(detail) if detail else response.text[:500] or response.reason_phrase
        error = {"code": "no_route" if response.status_code == 404 else "http", "message": text}
    status = response.status_code
    kind = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    extra = {k: v for k, v in error.items() if k not in ("code", "message", "field")}
    return kind(
        status,
        str(error.get("message") or response.reason_phrase),
        error.get("field"),
        code=str(error.get("code") or "error"),
        details=extra,
        retry_after_s=_retry_after(response),
    )


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare enough here to leave to the caller's own backoff
