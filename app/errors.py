"""The control plane's typed errors, rendered by one handler in ``app.main``.

::

    AppError (400)
    ├── BadRequest (400)        a query parameter or header is wrong: ``field`` names it
    ├── Unauthorized (401)      missing or unknown API key / worker token
    ├── Forbidden (403)         authenticated, but not allowed this (says why)
    ├── NotFound (404)          no such resource for this caller (other tenants' ids too)
    ├── Conflict (409)          the resource's state forbids the request (says the state)
    ├── Gone (410)              the request came too late: nothing waits for it any more
    ├── PayloadTooLarge (413)   the body is over the caller's limit (names it)
    ├── UnsupportedMediaType (415) a body format the route does not take (says which it does)
    ├── Unprocessable (422)     the body is well-formed JSON but invalid
    └── TooManyRequests (429)   over a quota: ``Retry-After`` and the quota in the body

Every message tells the caller what to change.
"""

from __future__ import annotations

from typing import Any


class AppError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        # Rendered beside code/message/field, and as response headers.
        self.extra: dict[str, Any] = {}
        self.headers: dict[str, str] = {}


class BadRequest(AppError):
    pass


class Unauthorized(AppError):
    status_code = 401
    code = "unauthorized"


class Forbidden(AppError):
    status_code = 403
    code = "forbidden"


class NotFound(AppError):
    status_code = 404
    code = "not_found"


class Conflict(AppError):
    status_code = 409
    code = "conflict"


class Gone(AppError):
    status_code = 410
    code = "gone"


class Unprocessable(AppError):
    status_code = 422
    code = "invalid"


class PayloadTooLarge(AppError):
    status_code = 413
    code = "payload_too_large"

    def __init__(self, message: str, *, limit_bytes: int) -> None:
        super().__init__(message, field="body")
        self.extra = {"limit_bytes": limit_bytes}


class UnsupportedMediaType(AppError):
    status_code = 415
    code = "unsupported_media_type"


class Unavailable(AppError):
    """A part the request needs is not there now (a worker restarting); retry."""

    status_code = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after_s: int, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.extra = {"retry_after_s": retry_after_s}
        self.headers = {"Retry-After": str(retry_after_s)}


class TooManyRequests(AppError):
    status_code = 429
    code = "too_many_requests"

    def __init__(self, message: str, *, retry_after_s: int, quota: dict[str, Any]) -> None:
        super().__init__(message, field=None)
        self.extra = {"retry_after_s": retry_after_s, "quota": quota}
        self.headers = {"Retry-After": str(retry_after_s)}
