"""Engine and session factory, made in the lifespan and passed down."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.ext.asyncio import AsyncSession as AsyncSession


def make_engine(
    url: str, *, ping_after_idle_s: float = 5.0, pool_size: int = 10, autocommit: bool = False
) -> AsyncEngine:
    """The engine for ``url``; ``autocommit`` (server databases) for one-statement reads."""
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
    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    engine = create_async_engine(url, pool_size=pool_size, max_overflow=2 * pool_size, **options)
    _ping_when_idle(engine, ping_after_idle_s)
    return engine


def _ping_when_idle(engine: AsyncEngine, after_s: float) -> None:
    """Check a pooled connection with a round trip only when it sat idle over ``after_s``.

    ``pool_pre_ping`` pings on every checkout: a round trip that cost more than a
    third of a status poll (B9). A connection that ran a query moments ago is
    alive; the ones at risk are those idle long enough for a server or proxy
    timeout to close them. A dead one is replaced before the request sees it
    (the pool retries on ``DisconnectionError``).
    """

    @event.listens_for(engine.sync_engine, "checkin")
    def _idle_from(_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkout")
    def _ping(conn: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("idle_since", -math.inf) <= after_s:
            return
        cursor = conn.cursor()
        try:
            cursor.execute("SELECT 1")
        except Exception as exc:
            raise DisconnectionError(f"pooled connection is gone: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                cursor.close()


# What a request may raise while the database is down or restarting: the driver's refused
# connection (asyncpg raises the OS's error, unwrapped), a pooled connection that died
# (DBAPIError with connection_invalidated), the server shutting down mid-query.
DATABASE_DOWN: tuple[type[Exception], ...] = (DBAPIError, DisconnectionError, ConnectionError)
DATABASE_RETRY_AFTER_S = 2


def database_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the database cannot be reached now, not that a query was wrong."""
    if isinstance(exc, (DisconnectionError, OSError)):  # ConnectionError is an OSError
        return True
    if isinstance(exc, DBAPIError):
        return bool(exc.connection_invalidated) or isinstance(
            exc, (OperationalError, InterfaceError)
        )
    return False


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
