"""`rlaas env register/list/check/delete` against the real control plane (uvicorn on
loopback, real PostgreSQL) and a real environment server, as the protocol page tells a
newcomer to run them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from rl_core.envs.guess_number import GuessNumber
from sdk.cli import cli
from sdk.envserver import EnvServer
from tests.sdk.serving import serving
from tests.web.live import LiveApi, live_api, migrated_database

SECRET = "cli-env-secret-0123456789"


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    with live_api(migrated_database(postgres_url), env_url_allowlist="loopback") as running:
        yield running


def rlaas(live: LiveApi, key: str, *args: str, env: dict[str, str] | None = None) -> Any:
    # RLAAS_ENV_SECRET unset unless given: the caller's shell must not decide the test.
    merged: dict[str, str | None] = {
        "RLAAS_API_URL": live.url, "RLAAS_API_KEY": key, "RLAAS_ENV_SECRET": None, **(env or {})
    }  # fmt: skip
    return CliRunner().invoke(cli, list(args), env=merged)


def test_register_prints_the_id_list_check_and_delete_use_it(live: LiveApi) -> None:
    key = live.tenant()
    with serving(EnvServer(GuessNumber(), secret=SECRET).app) as url:
        registered = rlaas(
            live, key, "env", "register", "game", url, "--max-concurrency", "4",
            env={"RLAAS_ENV_SECRET": SECRET},
        )  # fmt: skip
        assert registered.exit_code == 0, registered.output
        (env_id,) = registered.stdout.split()  # the id alone: the secret was the caller's
        assert env_id.startswith("env_") and not env_id.startswith("env_env_")
        assert f"environment.name: {env_id}" in registered.stderr

        listed = rlaas(live, key, "env", "list")
        assert listed.exit_code == 0 and listed.stdout.startswith(f"{env_id}  game  {url}")
        assert "max_concurrency=4" in listed.stdout

        checked = rlaas(live, key, "env", "check", env_id)
        assert checked.exit_code == 0, checked.output
        assert "POST /reset  200" in checked.stdout and "POST /close  200" in checked.stdout

    down = rlaas(live, key, "env", "check", env_id)  # the server has stopped
    assert down.exit_code == 1 and "check failed: /reset: connection refused" in down.stderr

    deleted = rlaas(live, key, "env", "delete", env_id)
    assert deleted.exit_code == 0 and deleted.stdout.strip() == f"{env_id}  deleted"
    assert rlaas(live, key, "env", "list").stdout == ""
    gone = rlaas(live, key, "env", "delete", env_id)
    assert gone.exit_code == 2 and env_id in gone.stderr


def test_register_without_a_secret_makes_one_and_prints_it_once(live: LiveApi) -> None:
    key = live.tenant()
    made = rlaas(live, key, "env", "register", "fresh", "http://127.0.0.1:9/env")
    assert made.exit_code == 0, made.output
    env_id, secret = made.stdout.split()
    assert env_id.startswith("env_") and len(secret) >= 32
    # The server verifies with it: a check signs with the stored secret, and the helper
    # server built with the printed one accepts it.
    with serving(EnvServer(GuessNumber(), secret=secret).app) as url:
        moved = rlaas(live, key, "env", "register", "fresh2", url, env={"RLAAS_ENV_SECRET": secret})
        (moved_id,) = moved.stdout.split()
        assert rlaas(live, key, "env", "check", moved_id).exit_code == 0
    assert secret not in rlaas(live, key, "env", "list").stdout


def test_register_refuses_a_short_secret_and_names_the_fields_the_api_refuses(
    live: LiveApi,
) -> None:
    key = live.tenant()
    short = rlaas(
        live, key, "env", "register", "game", "http://127.0.0.1:9/env",
        env={"RLAAS_ENV_SECRET": "too-short"},
    )  # fmt: skip
    assert short.exit_code == 2 and "at least 16" in short.stderr
    bad_name = rlaas(live, key, "env", "register", "no spaces", "http://127.0.0.1:9/env")
    assert bad_name.exit_code == 2 and "name" in bad_name.stderr
