"""Operator commands that talk to the database directly (the CLI's `tenants`, `migrate`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from app.db.session import make_engine, make_sessionmaker
from app.services.tenants import create_tenant as _create_tenant
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def alembic_config(settings: Settings) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", settings.resolved_database_url().replace("%", "%%"))
    return config


def migrate(settings: Settings) -> None:
    """Alembic ``upgrade head`` on the configured database (any cwd: paths are the package's)."""
    command.upgrade(alembic_config(settings), "head")


async def create_tenant(settings: Settings, name: str) -> tuple[str, str]:
    """Create a tenant; returns (tenant id, plaintext API key shown once)."""
    engine = make_engine(settings.resolved_database_url())
    try:
        async with make_sessionmaker(engine)() as session:
            tenant, key = await _create_tenant(session, name)
            await session.commit()
            return tenant.id, key
    finally:
        await engine.dispose()
