"""Alembic environment: async engines on Postgres (psycopg) and SQLite (aiosqlite)."""

from __future__ import annotations

import asyncio
import logging.config

from alembic import context
from sqlalchemy.engine import Connection

from app.db.models import Base
from app.db.session import make_engine
from app.settings import Settings

config = context.config
if config.config_file_name and not logging.getLogger().handlers:
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def database_url() -> str:
    """``alembic -x database_url=...``, else the URL `rlaas migrate` set, else the settings."""
    return (
        context.get_x_argument(as_dictionary=True).get("database_url")
        or config.get_main_option("sqlalchemy.url")
        or Settings().resolved_database_url()
    )


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite can't ALTER much
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_online() -> None:
    engine = make_engine(database_url())  # for SQLite, it makes the file's folder
    async with engine.connect() as connection:
        await connection.run_sync(run_with)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(run_online())
