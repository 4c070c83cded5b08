"""The control plane against a real PostgreSQL, migrated with Alembic once per session.

Each test gets a clean database (tables truncated), an app whose dispatcher
records what it would have sent to Celery, and an ``httpx.AsyncClient`` over
ASGI with the app's lifespan running (engine, reaper and all). Tests are
``async`` and run on anyio's asyncio backend (``pytestmark = pytest.mark.anyio``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.admin import migrate
from app.api.deps import AppState
from app.db.models import Tenant, WorkerCredential, utcnow
from app.dispatch import Dispatcher, RecordingDispatcher
from app.main import create_app
from app.security import hash_key, parse_worker_prefix
from app.services.tenants import authenticate, create_tenant
from app.settings import Settings

T = TypeVar("T")
# The shared worker token: configured, but off unless a test turns it on (a control plane
# on a database server refuses it by default).
WORKER_TOKEN = "test-worker-token"
# The worker credential the tests' workers claim with: enrolled in each test's database.
WORKER_CREDENTIAL = "rlaas_worker_7e577e577e57_test-only-worker-credential"
WORKER_CREDENTIAL_ID = "wcr_test_worker"
WORKER = {"Authorization": f"Bearer {WORKER_CREDENTIAL}"}
SECRET_KEY = "test-only-Jf3kQ9vX2mLp8RtW5yZb7NcH4sDg6"  # encrypts environment secrets at rest
TABLES = (
    "metric_points, ingest_batches, run_events, runs, api_keys, tenants, worker_reports, "
    "worker_credentials"
)


def plain(url: str) -> str:
    """The libpq form of a SQLAlchemy URL, for psycopg directly."""
    return url.replace("postgresql+psycopg://", "postgresql://")


def fresh_database(postgres_url: str, prefix: str) -> str:
    """An empty database on the session's server; returns its SQLAlchemy URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(plain(postgres_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{postgres_url.rpartition('/')[0]}/{name}"


@pytest.fixture(scope="session")
def app_database(postgres_url: str) -> str:
    url = fresh_database(postgres_url, "app")
    migrate(Settings(database_url=url, worker_token=WORKER_TOKEN))
    return url


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # SQLAlchemy's asyncio extension and psycopg's async mode


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"environment": {"name": "guess_number"}, "train": {"steps": 3}}
    base.update(overrides)
    return base


@dataclass
class Api:
    app: FastAPI
    client: httpx.AsyncClient
    dispatcher: RecordingDispatcher
    state: AppState
    leases: dict[str, str] = field(default_factory=dict)  # run id -> newest claim's lease token

    async def db(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``work`` in its own committed transaction on the app's engine."""
        async with self.state.sessions() as session:
            result = await work(session)
            await session.commit()
            return result

    async def tenant(self, name: str | None = None) -> dict[str, str]:
        """A new tenant; returns its Authorization header."""
        _, key = await self.db(lambda s: create_tenant(s, name or f"t-{uuid.uuid4().hex[:8]}"))
        return {"Authorization": f"Bearer {key}"}

    async def submit(self, auth: dict[str, str], **overrides: Any) -> str:
        r = await self.client.post("/v1/runs", json={"spec": spec(**overrides)}, headers=auth)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def internal(
        self, run_id: str, action: str, *, lease_token: str | None = None, **body: Any
    ) -> httpx.Response:
        """A worker's call, as worker/ makes it: the claim with the worker's credential
        (the lease token it answers is kept), any other action with ``lease_token``, by
        default the one the run's newest claim here answered."""
        if action == "claim":
            headers = WORKER
        else:
            headers = lease(lease_token or self.leases.get(run_id, "never-claimed-here"))
        r = await self.client.post(f"/internal/runs/{run_id}/{action}", json=body, headers=headers)
        if action == "claim" and r.status_code == 200:
            self.leases[run_id] = r.json()["lease_token"]
        return r


def lease(token: str) -> dict[str, str]:
    """The Authorization header of a run-scoped worker route."""
    return {"Authorization": f"Bearer {token}"}


def app_settings(database_url: str, **overrides: Any) -> Settings:
    # The reaper is driven by hand in tests (app.main.reap_once), never by the clock.
    values: dict[str, Any] = {
        "database_url": database_url,
        "secret_key": SECRET_KEY,
        "reaper_interval_s": 3600,
        # A lost run is queued again at once unless a test asks for a backoff.
        "requeue_backoff_s": 0.0,
        # Each of the hundreds of apps a test process starts would collect its whole heap.
        "gc_freeze": False,
    }
    return Settings(**{**values, **overrides})


@contextlib.asynccontextmanager
async def running_api(
    database_url: str, dispatcher: Dispatcher | None = None, **settings: Any
) -> AsyncIterator[Api]:
    """The app on a clean database, its lifespan running, and a client over ASGI."""
    recorder = RecordingDispatcher()
    app = create_app(app_settings(database_url, **settings), dispatcher=dispatcher or recorder)
    async with app.router.lifespan_context(app):
        app_state: AppState = app.state.rlaas
        async with app_state.sessions() as session:
            await session.execute(text(f"TRUNCATE {TABLES} CASCADE"))
            session.add(
                WorkerCredential(
                    id=WORKER_CREDENTIAL_ID,
                    name="test-worker",
                    prefix=parse_worker_prefix(WORKER_CREDENTIAL),
                    secret_hash=hash_key(WORKER_CREDENTIAL),
                    created_at=utcnow(),
                )
            )
            await session.commit()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rlaas.test") as client:
            yield Api(app=app, client=client, dispatcher=recorder, state=app_state)


@pytest.fixture
async def api(app_database: str) -> AsyncIterator[Api]:
    async with running_api(app_database) as running:
        yield running


async def set_quota(api: Api, auth: dict[str, str], **quota: int | None) -> None:
    """Override the tenant's quotas (``runs_in_flight=1``: its ``quota_runs_in_flight``)."""
    key = auth["Authorization"].removeprefix("Bearer ")

    async def apply(session: Any) -> None:
        tenant_id = await authenticate(session, key)
        values = {f"quota_{name}": value for name, value in quota.items()}
        await session.execute(update(Tenant).where(Tenant.id == tenant_id).values(**values))

    await api.db(apply)


@pytest.fixture
async def tinker_api(app_database: str) -> AsyncIterator[Api]:
    """The control plane with a static Tinker worker URL nothing listens on: for refusals
    made before any call would reach a worker."""
    async with running_api(
        app_database, tinker_worker_url="http://127.0.0.1:9", tinker_worker_token="s3cret"
    ) as running:
        yield running


async def tml(api: Api) -> dict[str, str]:
    """A fresh tenant's key as the Tinker SDK sends it."""
    key = (await api.tenant())["Authorization"].removeprefix("Bearer ")
    return {"X-API-Key": f"tml-{key}"}
