"""API keys over the API: list, create, revoke; rotation with overlap, on real Postgres."""

from __future__ import annotations

import pytest

from tests.app.conftest import Api

pytestmark = pytest.mark.anyio


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_rotate_a_key_with_overlap_then_the_old_one_is_refused(api: Api) -> None:
    old = await api.tenant()
    (first,) = (await api.client.get("/v1/keys", headers=old)).json()["items"]
    assert first["revoked_at"] is None and "key" not in first

    created = await api.client.post("/v1/keys", headers=old)
    assert created.status_code == 201, created.text
    new = bearer(created.json()["key"])
    # Both work while the client moves over.
    for auth in (old, new):
        assert (await api.client.get("/v1/runs", headers=auth)).status_code == 200
    listed = (await api.client.get("/v1/keys", headers=new)).json()["items"]
    assert [k["id"] for k in listed] == [first["id"], created.json()["id"]]
    assert all("key" not in k for k in listed)  # the secret is shown once, at creation

    revoked = await api.client.delete(f"/v1/keys/{first['id']}", headers=new)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    # At once, though the old key was verified (and remembered) a moment ago.
    assert (await api.client.get("/v1/runs", headers=old)).status_code == 401
    assert (await api.client.get("/v1/runs", headers=new)).status_code == 200


async def test_the_last_active_key_cannot_be_revoked(api: Api) -> None:
    auth = await api.tenant()
    (only,) = (await api.client.get("/v1/keys", headers=auth)).json()["items"]
    r = await api.client.delete(f"/v1/keys/{only['id']}", headers=auth)
    assert r.status_code == 409 and "last active key" in r.json()["error"]["message"]
    assert (await api.client.get("/v1/runs", headers=auth)).status_code == 200


async def test_a_tenant_cannot_see_or_revoke_another_tenants_keys(api: Api) -> None:
    a, b = await api.tenant(), await api.tenant()
    await api.client.post("/v1/keys", headers=a)  # so that a's key is not its last
    a_keys = (await api.client.get("/v1/keys", headers=a)).json()["items"]
    b_keys = (await api.client.get("/v1/keys", headers=b)).json()["items"]
    assert {k["id"] for k in a_keys}.isdisjoint(k["id"] for k in b_keys)
    r = await api.client.delete(f"/v1/keys/{a_keys[0]['id']}", headers=b)
    assert r.status_code == 404 and r.json()["error"]["field"] == "key_id"
    assert (await api.client.get("/v1/runs", headers=a)).status_code == 200
