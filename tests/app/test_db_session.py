"""The pool pings a connection only after it sat idle, and replaces a dead one unseen."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.db.session import make_engine

pytestmark = pytest.mark.anyio


async def _terminate(database_url: str, pid: int) -> None:
    killer = make_engine(database_url)
    try:
        async with killer.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        await killer.dispose()


async def test_a_connection_killed_while_idle_is_replaced_before_the_query(
    app_database: str,
) -> None:
    engine = make_engine(app_database, ping_after_idle_s=0.0)
    try:
        async with engine.connect() as conn:
            pid = await conn.scalar(text("SELECT pg_backend_pid()"))
        # Another client kills the pooled one, as a server restart or an idle timeout would.
        await _terminate(app_database, pid)
        async with engine.connect() as conn:
            assert await conn.scalar(text("SELECT 1")) == 1
            assert await conn.scalar(text("SELECT pg_backend_pid()")) != pid
    finally:
        await engine.dispose()


async def test_a_connection_used_moments_ago_is_not_pinged(app_database: str) -> None:
    # The contrast that shows the ping is what saves the query above: within the idle
    # window the pool hands the (dead) connection out as it is, without a round trip.
    engine = make_engine(app_database, ping_after_idle_s=3600.0)
    try:
        async with engine.connect() as conn:
            pid = await conn.scalar(text("SELECT pg_backend_pid()"))
        await _terminate(app_database, pid)
        with pytest.raises(DBAPIError):
            async with engine.connect() as conn:
                await conn.scalar(text("SELECT 1"))
    finally:
        await engine.dispose()
