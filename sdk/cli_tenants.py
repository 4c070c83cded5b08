"""``rlaas tenants``: the operator's tenants and their own quotas (talks to the database
directly, as ``rlaas workers`` does: there is no operator API; the API's callers are tenants).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, NoReturn

import typer

from sdk.cli_workers import settings_migrated

tenants_cli = typer.Typer(
    help="Manage tenants (talks to the database directly).", no_args_is_help=True
)


def _fail(message: str) -> NoReturn:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@tenants_cli.command("create")
def create(name: str) -> None:
    """Create a tenant and print its API key (shown once: keep it). On the embedded
    default (SQLite under RLAAS_DATA_DIR) it first brings the schema up to date, as
    `rlaas migrate` does, so that it works on a fresh machine."""
    from app.admin import create_tenant
    from app.errors import AppError

    settings = settings_migrated()
    try:
        tenant_id, key = asyncio.run(create_tenant(settings, name))
    except AppError as exc:
        _fail(str(exc))
    typer.echo(f"tenant {name} ({tenant_id})", err=True)
    typer.echo(key)


@tenants_cli.command("quota")
def quota(
    tenant: Annotated[str, typer.Argument(help="The tenant's id (ten_...) or name.")],
    assignments: Annotated[
        list[str] | None,
        typer.Argument(
            help="NAME=VALUE to set (a whole number) or NAME=default to go back to the "
            "deployment's setting; none: show the tenant's quotas.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show a tenant's quotas, or set its own: `rlaas tenants quota acme
    tinker_calls_in_flight=64 tinker_tokens_per_minute=default`. The Tinker limits take 0
    (no limit for this tenant); the others 1 or more. All are set, or none."""
    from app.admin import tenant_quotas_set
    from app.errors import AppError
    from app.services.tenant_quotas import parse_assignments

    settings = settings_migrated()
    try:
        changes = parse_assignments(assignments or [])
        tenant_id, rows = asyncio.run(tenant_quotas_set(settings, tenant, changes))
    except AppError as exc:
        _fail(str(exc))
    typer.echo(f"tenant {tenant_id}", err=True)
    typer.echo("quota\tvalue\tfrom")
    for row in rows:
        value = "no limit" if row.value is None else str(row.value)
        whose = "this tenant's own" if row.own else f"default ({row.setting})"
        typer.echo(f"{row.name}\t{value}\t{whose}")
