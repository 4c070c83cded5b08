"""What docs/environment-protocol.md tells a server author about the control plane is the
control plane's: the registration body's fields and defaults, the id it returns, and the
exact body of the check's reset (real Postgres, a real webhook server on loopback)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.schemas.environments import MIN_SECRET_CHARS, EnvironmentCreate
from tests.app.conftest import Api, running_api
from tests.app.webhook_server import WebhookServer, serving

pytestmark = pytest.mark.anyio
DOC = (Path(__file__).resolve().parents[2] / "docs" / "environment-protocol.md").read_text()
SECRET = "doc-answers-secret-0123456789"


def registration_table() -> dict[str, str]:
    section = DOC.split("## Registering your server", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", section, re.M))


def test_the_registration_table_is_the_apis_body() -> None:
    rows = registration_table()
    fields = EnvironmentCreate.model_fields
    assert set(rows) == set(fields)
    for name in ("name", "url", "secret"):
        assert fields[name].is_required() and rows[name].startswith("string, required"), name
    assert f"{MIN_SECRET_CHARS} to 1000 characters" in rows["secret"]
    assert f"default {fields['timeout_s'].default:g}" in rows["timeout_s"]
    assert f"default {fields['max_concurrency'].default}" in rows["max_concurrency"]
    assert "1 to 200 characters" in rows["name"]


@pytest.fixture
async def loopback_api(app_database: str) -> Any:
    async with running_api(app_database, env_url_allowlist="public,loopback") as running:
        yield running


@pytest.fixture
def webhook() -> Iterator[WebhookServer]:
    with serving(SECRET) as server:
        yield server


async def test_the_id_and_the_checks_reset_are_as_the_page_says(
    loopback_api: Api, webhook: WebhookServer
) -> None:
    auth = await loopback_api.tenant()
    body = {"name": "doc-env", "url": webhook.url("ok"), "secret": SECRET}
    created = await loopback_api.client.post("/v1/environments", json=body, headers=auth)
    assert created.status_code == 201, created.text
    env = created.json()
    # The id goes into a spec as returned: it has its prefix already.
    assert re.fullmatch(r"env_[0-9a-f]{32}", env["id"]), env["id"]
    assert set(env) == {"id", "name", "url", "timeout_s", "max_concurrency", "created_at"}
    assert '`{"id", "name", "url", "timeout_s", "max_concurrency",\n"created_at"}`' in DOC

    check = await loopback_api.client.post(f"/v1/environments/{env['id']}/check", headers=auth)
    assert check.json()["ok"], check.text
    (_, reset_path, reset), (_, close_path, close) = webhook.seen
    assert (reset_path, close_path) == ("reset", "close")
    shown = json.loads(re.search(r'(\{"episode_id":"check~[^`]*?\})\n', DOC)[1])  # type: ignore[index]
    assert re.fullmatch(r"check~[0-9a-f]{12}", reset["episode_id"])
    assert {**reset, "episode_id": shown["episode_id"]} == shown
    assert close == {"episode_id": reset["episode_id"]}
