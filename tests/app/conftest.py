"""The control plane against a real PostgreSQL, migrated with Alembic once per session.

Each test gets a clean database (tables truncated), an app whose dispatcher
records what it would send to Celery, and a TestClient that runs the lifespan.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.ext.asyncio import AsyncSession

from app.admin import migrate
from app.api.deps import AppState
from app.dispatch import RecordingDispatcher
from app.main import create_app
from app.services.tenants import create_tenant
from app.settings import Settings

T = TypeVar("T")
WORKER_TOKEN = "test-worker-token"
TABLES = "metric_points, ingest_batches, run_events, runs, api_keys, tenants"


@pytest.fixture(scope="session")
def app_database(postgres_url: str) -> str:
    name = f"app_{uuid.uuid4().hex[:10]}"
    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{postgres_url.rpartition('/')[0]}/{name}"
    migrate(Settings(database_url=url, worker_token=WORKER_TOKEN))
    return url


@dataclass
class Api:
    client: TestClient
    dispatcher: RecordingDispatcher
    state: AppState

    def db(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``work`` in its own committed transaction on the app's engine."""

        async def run() -> T:
            async with self.state.sessions() as session:
                result = await work(session)
                await session.commit()
                return result

        return self.client.portal.call(run)  # type: ignore[union-attr]

    def tenant(self, name: str | None = None) -> dict[str, str]:
        """A new tenant; returns its Authorization header."""
        _, key = self.db(lambda s: create_tenant(s, name or f"t-{uuid.uuid4().hex[:8]}"))
        return {"Authorization": f"Bearer {key}"}

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return self.client.portal.call(fn, *args)  # type: ignore[union-attr]


WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}


@pytest.fixture
def api(app_database: str) -> Iterator[Api]:
    with psycopg.connect(app_database.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute(f"TRUNCATE {TABLES} CASCADE")
    settings = Settings(
        database_url=app_database, worker_token=WORKER_TOKEN, reaper_interval_s=3600
    )
    dispatcher = RecordingDispatcher()
    app = create_app(settings, dispatcher=dispatcher)
    with TestClient(app) as client:
        yield Api(client=client, dispatcher=dispatcher, state=app.state.rlaas)


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"environment": {"name": "guess_number"}, "train": {"steps": 3}}
    base.update(overrides)
    return base
