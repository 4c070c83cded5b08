"""Operator commands that talk to the database directly (the CLI's `tenants`, `migrate`,
`secrets reseal`, `workers`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import select

from app.crypto import DecryptionError, SecretBox
from app.db.models import Environment, Run, WorkerCredential
from app.db.session import make_engine, make_sessionmaker
from app.services import tenant_quotas, worker_credentials
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


async def tenant_quotas_set(
    settings: Settings, ref: str, changes: dict[str, int | None]
) -> tuple[str, list[tenant_quotas.QuotaRow]]:
    """Set (None: clear) a tenant's own quotas, all or none; returns (its id, every quota as
    it now holds for it). No changes: only reads them."""
    engine = make_engine(settings.resolved_database_url())
    try:
        async with make_sessionmaker(engine)() as session:
            if changes:
                tenant = await tenant_quotas.set_quotas(session, ref, changes)
                await session.commit()
            else:
                tenant = await tenant_quotas.find(session, ref)
            return tenant.id, tenant_quotas.rows(tenant, settings)
    finally:
        await engine.dispose()


async def issue_worker_credential(settings: Settings, name: str) -> tuple[str, str]:
    """Enrol a worker; returns (credential id, plaintext credential shown once)."""
    engine = make_engine(settings.resolved_database_url())
    try:
        async with make_sessionmaker(engine)() as session:
            row, credential = await worker_credentials.issue(session, name)
            await session.commit()
            return row.id, credential
    finally:
        await engine.dispose()


async def list_worker_credentials(settings: Settings) -> list[WorkerCredential]:
    engine = make_engine(settings.resolved_database_url())
    try:
        async with make_sessionmaker(engine)() as session:
            return await worker_credentials.list_credentials(session)
    finally:
        await engine.dispose()


async def revoke_worker_credential(
    settings: Settings, credential_id: str
) -> tuple[WorkerCredential, list[str]]:
    """Revoke a worker's credential; returns (its row, the runs whose leases it ended)."""
    engine = make_engine(settings.resolved_database_url())
    try:
        async with make_sessionmaker(engine)() as session:
            row, ended = await worker_credentials.revoke(session, credential_id)
            await session.commit()
            return row, ended
    finally:
        await engine.dispose()


@dataclasses.dataclass
class ResealReport:
    resealed: int = 0  # sealed again under the current key
    current: int = 0  # already under it
    unreadable: list[str] = dataclasses.field(default_factory=list)  # under no key given


async def reseal_secrets(settings: Settings) -> ResealReport:
    """Seal every stored secret (environment secrets, runs' gateway tokens) under the
    current RLAAS_SECRET_KEY, opening them with it or RLAAS_OLD_SECRET_KEYS. A row no
    key opens is left as it is and reported; run it again after setting the right key."""
    box = SecretBox(settings.resolved_secret_key(), old_keys=settings.resolved_old_secret_keys())
    report = ResealReport()
    engine = make_engine(settings.resolved_database_url())
    try:
        async with make_sessionmaker(engine)() as session:
            envs = await session.scalars(select(Environment).with_for_update())
            for env in envs:
                env.secret_encrypted = _reseal(box, env.secret_encrypted, env.id, report)
            runs = await session.scalars(
                select(Run)
                .where(
                    Run.gateway_token_encrypted.is_not(None)
                    | Run.gateway_token_previous_encrypted.is_not(None)
                )
                .with_for_update()
            )
            for run in runs:
                context = f"gateway:{run.id}"
                if run.gateway_token_encrypted is not None:
                    run.gateway_token_encrypted = _reseal(
                        box, run.gateway_token_encrypted, context, report
                    )
                if run.gateway_token_previous_encrypted is not None:
                    run.gateway_token_previous_encrypted = _reseal(
                        box, run.gateway_token_previous_encrypted, context, report
                    )
            await session.commit()
    finally:
        await engine.dispose()
    return report


def _reseal(box: SecretBox, stored: str, context: str, report: ResealReport) -> str:
    try:
        again = box.reseal(stored, context=context)
    except DecryptionError:
        report.unreadable.append(context)
        return stored
    if again is None:
        report.current += 1
        return stored
    report.resealed += 1
    return again
