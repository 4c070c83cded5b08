"""The environments registry on real Postgres, and its check against a real webhook server."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from app.crypto import SecretBox
from app.db.models import Environment
from app.observability import JsonFormatter
from app.urlcheck import Allowlist
from tests.app.conftest import SECRET_KEY, Api, plain, running_api
from tests.app.webhook_server import WebhookServer, free_port, serving

pytestmark = pytest.mark.anyio
SECRET = "s3cr3t-Very-Distinctive-0xC0FFEE"


def env_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "my-env",
        "url": "http://127.0.0.1:9/ok",
        "secret": SECRET,
        "timeout_s": 5,
        "max_concurrency": 4,
    }
    body.update(overrides)
    return body


@pytest.fixture
async def loopback_api(app_database: str) -> Any:
    # A server deployment that lets tenants register environments on this machine.
    async with running_api(app_database, env_url_allowlist="public,loopback") as running:
        yield running


@pytest.fixture
def webhook() -> Iterator[WebhookServer]:
    with serving(SECRET) as server:
        yield server


async def register(api: Api, auth: dict[str, str], **overrides: Any) -> dict[str, Any]:
    r = await api.client.post("/v1/environments", json=env_body(**overrides), headers=auth)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_register_read_list_delete(loopback_api: Api) -> None:
    api = loopback_api
    auth = await api.tenant()
    env = await register(api, auth, url="http://127.0.0.1:9/ok/")
    assert set(env) == {"id", "name", "url", "timeout_s", "max_concurrency", "created_at"}
    assert env["id"].startswith("env_") and env["url"] == "http://127.0.0.1:9/ok"
    assert (env["timeout_s"], env["max_concurrency"]) == (5.0, 4)
    got = await api.client.get(f"/v1/environments/{env['id']}", headers=auth)
    assert got.status_code == 200 and got.json() == env
    listed = await api.client.get("/v1/environments", headers=auth)
    assert listed.json() == {"items": [env]}
    gone = await api.client.delete(f"/v1/environments/{env['id']}", headers=auth)
    assert gone.status_code == 204 and gone.content == b""
    again = await api.client.get(f"/v1/environments/{env['id']}", headers=auth)
    assert again.status_code == 404 and again.json()["error"]["field"] == "environment_id"


async def test_the_secret_is_encrypted_at_rest_and_never_returned_or_logged(
    loopback_api: Api, app_database: str
) -> None:
    api = loopback_api
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    try:
        auth = await api.tenant()
        env = await register(api, auth)
        texts = [
            (await api.client.get(f"/v1/environments/{env['id']}", headers=auth)).text,
            (await api.client.get("/v1/environments", headers=auth)).text,
        ]
        # A rejected body must not echo the secret back either.
        bad = await api.client.post(
            "/v1/environments", json=env_body(name="x", url="ftp://h"), headers=auth
        )
        texts.append(bad.text)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert captured.getvalue(), "the access log should have written lines"
    for text in [*texts, captured.getvalue()]:
        assert SECRET not in text
    with psycopg.connect(plain(app_database)) as conn:
        (stored,) = conn.execute(
            "SELECT secret_encrypted FROM environments WHERE id = %s", (env["id"],)
        ).fetchone()  # type: ignore[misc]
        dump = conn.execute("SELECT row_to_json(e)::text FROM environments e").fetchall()
    assert stored.startswith("v2.") and SECRET not in stored
    assert all(SECRET not in row[0] for row in dump)
    box = SecretBox(SECRET_KEY)
    assert box.decrypt(stored, context=env["id"]) == SECRET
    # Bound to its row: the same ciphertext under another id does not decrypt.
    with pytest.raises(RuntimeError, match="does not decrypt"):
        box.decrypt(stored, context="env_other")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"secret": "short"}, "secret"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"name": "has spaces"}, "name"),
        ({"colour": "blue"}, "colour"),
        ({"url": "ftp://127.0.0.1/x"}, "url"),
        ({"url": "http://user:pw@127.0.0.1/x"}, "url"),
        ({"url": "http://169.254.169.254/latest"}, "url"),
        ({"url": "http://metadata.google.internal/"}, "url"),
        ({"url": "http://[fe80::1]/x"}, "url"),
        ({"url": "http://10.0.0.7/x"}, "url"),
    ],
)
async def test_bad_registrations_are_422_naming_the_field(
    loopback_api: Api, overrides: dict[str, Any], field: str
) -> None:
    auth = await loopback_api.tenant()
    r = await loopback_api.client.post("/v1/environments", json=env_body(**overrides), headers=auth)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field
    listed = await loopback_api.client.get("/v1/environments", headers=auth)
    assert listed.json() == {"items": []}  # nothing half-written


async def test_a_server_refuses_loopback_unless_allowed(api: Api) -> None:
    auth = await api.tenant()
    r = await api.client.post("/v1/environments", json=env_body(), headers=auth)
    assert r.status_code == 422
    assert "loopback" in r.json()["error"]["message"]
    assert "RLAAS_ENV_URL_ALLOWLIST" in r.json()["error"]["message"]


async def test_a_name_is_unique_per_tenant(loopback_api: Api) -> None:
    api = loopback_api
    a, b = await api.tenant(), await api.tenant()
    await register(api, a)
    dup = await api.client.post("/v1/environments", json=env_body(), headers=a)
    assert dup.status_code == 409 and dup.json()["error"]["field"] == "name"
    await register(api, b)  # another tenant may use the same name


async def test_another_tenants_environment_is_404(loopback_api: Api) -> None:
    api = loopback_api
    owner, other = await api.tenant(), await api.tenant()
    env_id = (await register(api, owner))["id"]
    for method, path in (
        ("GET", f"/v1/environments/{env_id}"),
        ("DELETE", f"/v1/environments/{env_id}"),
        ("POST", f"/v1/environments/{env_id}/check"),
    ):
        r = await api.client.request(method, path, headers=other)
        assert r.status_code == 404, (method, path)
    assert (await api.client.get("/v1/environments", headers=other)).json() == {"items": []}
    # Nor may a run of the other tenant name it.
    r = await api.client.post(
        "/v1/runs", json={"spec": {"environment": {"name": env_id}}}, headers=other
    )
    assert r.status_code == 422 and r.json()["error"]["field"] == "spec.environment.name"
    assert (await api.client.get(f"/v1/environments/{env_id}", headers=owner)).status_code == 200


async def test_runs_name_registered_environments_and_the_claim_hands_it_over(
    loopback_api: Api,
) -> None:
    api = loopback_api
    auth = await api.tenant()
    unknown = await api.client.post(
        "/v1/runs", json={"spec": {"environment": {"name": "env_deadbeef"}}}, headers=auth
    )
    assert unknown.status_code == 422
    assert unknown.json()["error"]["field"] == "spec.environment.name"
    assert (await api.client.get("/v1/runs", headers=auth)).json()["items"] == []

    env = await register(api, auth)
    run_id = await api.submit(auth, environment={"name": env["id"]})
    claim = await api.internal(run_id, "claim", worker_id="w1")
    assert claim.status_code == 200, claim.text
    assert claim.json()["environment"] == {
        "id": env["id"],
        "url": env["url"],
        "secret": SECRET,
        "timeout_s": 5.0,
        "max_concurrency": 4,
    }
    # While the run is unfinished its environment stays.
    busy = await api.client.delete(f"/v1/environments/{env['id']}", headers=auth)
    assert busy.status_code == 409 and run_id in busy.json()["error"]["message"]
    await api.internal(run_id, "status", worker_id="w1", status="running")
    await api.internal(run_id, "status", worker_id="w1", status="succeeded")
    done = await api.client.delete(f"/v1/environments/{env['id']}", headers=auth)
    assert done.status_code == 204


async def check(api: Api, auth: dict[str, str], url: str, **overrides: Any) -> dict[str, Any]:
    env = await register(api, auth, url=url, **overrides)
    r = await api.client.post(f"/v1/environments/{env['id']}/check", headers=auth)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_check_calls_reset_then_close_signed(
    loopback_api: Api, webhook: WebhookServer
) -> None:
    result = await check(loopback_api, await loopback_api.tenant(), webhook.url("ok"))
    assert result["ok"] is True and result["error"] is None
    assert [(c["path"], c["ok"], c["status_code"]) for c in result["calls"]] == [
        ("/reset", True, 200),
        ("/close", True, 200),
    ]
    # The server verified both signatures; it saw one episode, reset then closed.
    (m1, reset, body1), (m2, close, body2) = webhook.seen
    assert (m1, reset, m2, close) == ("ok", "reset", "ok", "close")
    assert body1["episode_id"] == body2["episode_id"] and body1["config"] == {}


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("badjson", "not JSON"),
        ("nomsgs", "lacks 'messages'"),
        ("http500", "HTTP 500: boom: env crashed"),
        ("redirect", "HTTP 307 redirect"),
    ],
)
async def test_check_says_what_the_server_got_wrong(
    loopback_api: Api, webhook: WebhookServer, mode: str, words: str
) -> None:
    result = await check(loopback_api, await loopback_api.tenant(), webhook.url(mode))
    assert result["ok"] is False
    assert result["error"].startswith("/reset: ") and words in result["error"]
    assert [c["path"] for c in result["calls"]] == ["/reset", "/close"]
    assert all(path != "latest" for _, path, _ in webhook.seen)  # the redirect was not followed


async def test_check_reports_a_timeout(loopback_api: Api, webhook: WebhookServer) -> None:
    result = await check(
        loopback_api, await loopback_api.tenant(), webhook.url("slow"), timeout_s=0.3
    )
    assert result["ok"] is False and "timeout_s=0.3" in result["error"]


async def test_check_reports_a_wrong_secret(loopback_api: Api, webhook: WebhookServer) -> None:
    result = await check(
        loopback_api, await loopback_api.tenant(), webhook.url("ok"), secret="another-secret-123456"
    )
    assert result["ok"] is False
    assert "HTTP 401" in result["error"] and "secret" in result["error"]


async def test_check_reports_connection_refused(loopback_api: Api) -> None:
    url = f"http://127.0.0.1:{free_port()}/ok"  # nothing listens there
    result = await check(loopback_api, await loopback_api.tenant(), url)
    assert result["ok"] is False and "connection refused" in result["error"]
    assert [c["path"] for c in result["calls"]] == ["/reset"]  # no /close to a dead server


async def test_check_reports_a_name_that_stopped_resolving(loopback_api: Api) -> None:
    api = loopback_api
    auth = await api.tenant()
    env = await register(api, auth)

    async def repoint(session: Any) -> None:
        row = await session.get(Environment, env["id"])
        row.url = "http://no-such-host.invalid/ok"  # its DNS record went away after registration

    await api.db(repoint)
    r = await api.client.post(f"/v1/environments/{env['id']}/check", headers=auth)
    assert r.status_code == 200
    assert r.json()["ok"] is False and "does not resolve (DNS)" in r.json()["error"]


async def test_check_refuses_a_url_the_allowlist_no_longer_allows(
    loopback_api: Api, webhook: WebhookServer
) -> None:
    api = loopback_api
    auth = await api.tenant()
    env = await register(api, auth, url=webhook.url("ok"))
    # The operator narrowed the list since (as a restart with a new setting would).
    api.state.env_allowlist = Allowlist.parse("public", embedded=False)
    r = await api.client.post(f"/v1/environments/{env['id']}/check", headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "url"
    assert webhook.seen == []  # no call went out
