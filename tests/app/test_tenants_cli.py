"""`rlaas tenants create | quota`, the operator's commands, against the test database through
the CLI's own entry point (typer's runner, in this process)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from typer.testing import CliRunner

from sdk.cli import cli
from tests.app.conftest import plain

COLUMNS = "quota_tinker_calls_in_flight, quota_tinker_tokens_per_minute, quota_runs_in_flight"


def overrides(database_url: str, name: str) -> tuple[int | None, ...]:
    with psycopg.connect(plain(database_url)) as conn:
        row = conn.execute(f"SELECT {COLUMNS} FROM tenants WHERE name = %s", (name,)).fetchone()
    assert row is not None
    return tuple(row)


def table(output: str) -> dict[str, tuple[str, str]]:
    """The command's table: quota -> (value, from)."""
    lines = [line.split("\t") for line in output.strip().splitlines()]
    assert lines[0] == ["quota", "value", "from"]
    return {name: (value, whose) for name, value, whose in lines[1:]}


def test_an_operator_sets_and_clears_a_tenants_own_quotas(
    app_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLAAS_DATABASE_URL", app_database)
    monkeypatch.setenv("RLAAS_TINKER_MAX_CALLS_IN_FLIGHT", "256")
    runner = CliRunner()
    name = f"acme-{uuid.uuid4().hex[:8]}"
    created = runner.invoke(cli, ["tenants", "create", name])
    assert created.exit_code == 0, created.output
    tenant_id = created.stderr.split("(")[1].rstrip(")\n")

    shown = table(runner.invoke(cli, ["tenants", "quota", name]).stdout)
    assert shown["tinker_calls_in_flight"] == ("256", "default (RLAAS_TINKER_MAX_CALLS_IN_FLIGHT)")
    assert len(shown) == 10  # every quota a tenant has

    args = ["tinker_calls_in_flight=64", "tinker_tokens_per_minute=0", "runs_in_flight=3"]
    set_ = runner.invoke(cli, ["tenants", "quota", tenant_id, *args])
    assert set_.exit_code == 0, set_.output
    shown = table(set_.stdout)
    assert shown["tinker_calls_in_flight"] == ("64", "this tenant's own")
    assert shown["tinker_tokens_per_minute"] == ("no limit", "this tenant's own")
    assert shown["runs_in_flight"] == ("3", "this tenant's own")
    assert overrides(app_database, name) == (64, 0, 3)

    # Bad values: exit 2, the quota and the reason named, nothing written (all or none).
    for bad, says in [
        (["tinker_calls_in_flight=-1"], "tinker_calls_in_flight must be a whole number from 0"),
        (["tinker_calls_in_flight=lots"], "got 'lots'"),
        (["runs_in_flight=0", "tinker_calls_in_flight=5"], "would not turn it off"),
        (["tinker_models=4"], "no quota named 'tinker_models'"),
        (["tinker_calls_in_flight"], "is not NAME=VALUE"),
        (["body_bytes=4294967296"], "to 2147483647"),
    ]:
        refused = runner.invoke(cli, ["tenants", "quota", name, *bad])
        assert refused.exit_code == 2 and says in refused.stderr, (bad, refused.output)
    assert overrides(app_database, name) == (64, 0, 3)
    missing = runner.invoke(cli, ["tenants", "quota", "nobody-" + name, "runs_in_flight=1"])
    assert missing.exit_code == 2 and "no tenant with the id or name" in missing.stderr

    cleared = runner.invoke(cli, ["tenants", "quota", name, "tinker_calls_in_flight=default"])
    assert cleared.exit_code == 0, cleared.output
    assert table(cleared.stdout)["tinker_calls_in_flight"][1].startswith("default")
    assert overrides(app_database, name) == (None, 0, 3)
