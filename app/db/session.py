"""Engine and session factory, made in the lifespan and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.ext.asyncio import AsyncSession as AsyncSession


def make_engine(url: str) -> AsyncEngine:
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:":
            # SQLite makes the file but not its folder (the data dir on a first start).
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(conn: Any, _record: Any) -> None:
            # WAL lets readers go on while a writer commits; foreign keys are
            # off by default in SQLite and the schema relies on them.
            cursor = conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_async_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
