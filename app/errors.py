"""The control plane's typed errors, rendered by one handler in ``app.main``.

::

    AppError (400)
    ├── BadRequest (400)        a query parameter or header is wrong: ``field`` names it
    ├── Unauthorized (401)      missing or unknown API key / worker token
    ├── NotFound (404)          no such resource for this caller (other tenants' ids too)
    ├── Conflict (409)          the resource's state forbids the request (says the state)
    └── Unprocessable (422)     the body is well-formed JSON but invalid

Every message tells the caller what to change.
"""

from __future__ import annotations


class AppError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class BadRequest(AppError):
    pass


class Unauthorized(AppError):
    status_code = 401
    code = "unauthorized"


class NotFound(AppError):
    status_code = 404
    code = "not_found"


class Conflict(AppError):
    status_code = 409
    code = "conflict"


class Unprocessable(AppError):
    status_code = 422
    code = "invalid"
