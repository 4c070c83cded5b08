"""`rlaas workers issue | list | revoke`, the operator's commands, against the test
database through the CLI's own entry point (typer's runner, in this process)."""

from __future__ import annotations

import asyncio
import hashlib

import psycopg
import pytest
from typer.testing import CliRunner

from app.db.session import make_engine, make_sessionmaker
from app.errors import Unauthorized
from app.services import worker_credentials
from sdk.cli import cli
from tests.app.conftest import plain


async def _authenticate(database_url: str, credential: str) -> str | None:
    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            return (await worker_credentials.authenticate(session, credential)).credential_id
    finally:
        await engine.dispose()


def test_issue_list_revoke_round_trip(app_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLAAS_DATABASE_URL", app_database)
    runner = CliRunner()

    issued = runner.invoke(cli, ["workers", "issue", "gpu-7"])
    assert issued.exit_code == 0, issued.output
    credential = issued.stdout.strip().splitlines()[-1]  # the last line: shown once
    assert credential.startswith("rlaas_worker_")
    credential_id = asyncio.run(_authenticate(app_database, credential))
    assert credential_id is not None and credential_id in issued.stderr

    listed = runner.invoke(cli, ["workers", "list"])
    assert listed.exit_code == 0, listed.output
    line = next(x for x in listed.stdout.splitlines() if x.startswith(credential_id))
    assert line.split("\t")[1] == "gpu-7" and line.endswith("\t-")  # not revoked
    assert credential not in listed.output  # a list never shows a secret

    revoked = runner.invoke(cli, ["workers", "revoke", credential_id])
    assert revoked.exit_code == 0, revoked.output
    assert f"revoked {credential_id} (gpu-7)" in revoked.stdout
    with pytest.raises(Unauthorized, match="was revoked"):
        asyncio.run(_authenticate(app_database, credential))
    with psycopg.connect(plain(app_database)) as conn:
        row = conn.execute(
            "SELECT secret_hash, revoked_at FROM worker_credentials WHERE id = %s",
            (credential_id,),
        ).fetchone()
    assert row is not None and row[1] is not None
    assert row[0] == hashlib.sha256(credential.encode()).hexdigest()

    unknown = runner.invoke(cli, ["workers", "revoke", "wcr_nope"])
    assert unknown.exit_code == 2 and "rlaas workers list" in unknown.stderr
