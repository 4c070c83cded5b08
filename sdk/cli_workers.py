"""``rlaas workers``: the operator's worker credentials (talks to the database directly).

Each worker enrols with a credential of its own: ``issue`` prints one (shown once; the
database keeps its hash), the worker is started with it as ``RLAAS_WORKER_CREDENTIAL``,
and ``revoke`` shuts out that worker alone (docs/lifecycle.md, "Worker credentials").
There is no operator API yet: the API's callers are tenants, so these need the database
settings (``RLAAS_DATABASE_URL``) that ``rlaas migrate`` needs.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from app.settings import Settings

workers_cli = typer.Typer(
    help="Worker credentials: issue, list, revoke (talks to the database directly).",
    no_args_is_help=True,
)


def settings_migrated() -> Settings:
    """The settings; on the embedded default the schema is brought up to date first, as
    `rlaas migrate` does, so that the operator's commands (these and `rlaas tenants`) work
    on a fresh machine."""
    from app.admin import migrate
    from app.settings import Settings

    settings = Settings()
    if settings.embedded:
        settings.prepare_data_dir()
        migrate(settings)
    return settings


@workers_cli.command("issue")
def issue(name: str) -> None:
    """Enrol a worker: print a credential for it (shown once: keep it) to set as
    RLAAS_WORKER_CREDENTIAL on that worker. NAME says which worker (its host)."""
    from app.admin import issue_worker_credential
    from app.errors import AppError

    settings = settings_migrated()
    try:
        credential_id, credential = asyncio.run(issue_worker_credential(settings, name))
    except AppError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"worker credential {credential_id} ({name.strip()})", err=True)
    typer.echo(credential)


@workers_cli.command("list")
def list_() -> None:
    """Every worker credential (never its secret): id, name, issued, last used, revoked."""
    from app.admin import list_worker_credentials

    settings = settings_migrated()
    rows = asyncio.run(list_worker_credentials(settings))
    if not rows:
        typer.echo("no worker credentials; `rlaas workers issue NAME` enrols a worker", err=True)
        return
    typer.echo("id\tname\tissued\tlast used\trevoked")
    for row in rows:
        cells = (row.created_at, row.last_used_at, row.revoked_at)
        typer.echo("\t".join([row.id, row.name, *(_when(c) for c in cells)]))


@workers_cli.command("revoke")
def revoke(credential_id: str) -> None:
    """Revoke a worker's credential: its next call is refused (401), other workers go on,
    and runs it holds lose their lease (the reaper queues them again)."""
    from app.admin import revoke_worker_credential
    from app.errors import AppError

    settings = settings_migrated()
    try:
        row, ended = asyncio.run(revoke_worker_credential(settings, credential_id))
    except AppError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"revoked {row.id} ({row.name}) at {_when(row.revoked_at)}")
    if ended:
        typer.echo(f"leases ended (runs queued again by the reaper): {', '.join(ended)}")


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(timespec="seconds")
