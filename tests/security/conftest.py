"""The security tests run the control plane as tests/app does: real PostgreSQL, the app's
lifespan, a client over ASGI. Its fixtures are imported here so pytest finds them."""

from __future__ import annotations

from tests.app.conftest import anyio_backend, app_database

__all__ = ["anyio_backend", "app_database"]
