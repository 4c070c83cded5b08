"""Operator functions (the CLI's `tenants create`), settings and start-up checks."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import httpx
import psycopg
import pytest

from app.admin import create_tenant
from app.errors import AppError
from app.main import create_app
from app.services.tenants import KnownKeys
from app.settings import Settings, SettingsError
from tests.app.conftest import SECRET_KEY, WORKER_TOKEN, Api, plain, spec

pytestmark = pytest.mark.anyio


async def test_create_tenant_prints_a_working_key_stored_only_hashed(
    api: Api, app_database: str
) -> None:
    settings = Settings(database_url=app_database, worker_token=WORKER_TOKEN)
    tenant_id, key = await create_tenant(settings, "acme")
    assert tenant_id.startswith("ten_") and key.startswith("rlaas_")
    prefix = key.split("_")[1]
    with psycopg.connect(plain(app_database)) as conn:
        row = conn.execute(
            "SELECT tenant_id, key_hash FROM api_keys WHERE prefix = %s", (prefix,)
        ).fetchone()
        everything = str(conn.execute("SELECT * FROM api_keys").fetchall())
    assert row == (tenant_id, hashlib.sha256(key.encode()).hexdigest())
    assert key.split("_", 2)[2] not in everything  # the secret is never stored
    r = await api.client.post(
        "/v1/runs", json={"spec": spec()}, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 201


async def test_a_duplicate_tenant_name_is_a_clear_app_error(api: Api, app_database: str) -> None:
    settings = Settings(database_url=app_database, worker_token=WORKER_TOKEN)
    await create_tenant(settings, "twice")
    with pytest.raises(AppError) as caught:
        await create_tenant(settings, "twice")
    assert caught.value.status_code == 409
    assert "'twice' exists already" in caught.value.message


async def test_a_revoked_key_is_refused_once_the_verified_window_passes(
    api: Api, app_database: str
) -> None:
    now = [0.0]
    api.state.known_keys = KnownKeys(ttl_s=10.0, clock=lambda: now[0])
    auth = await api.tenant()
    assert (await api.client.get("/v1/runs", headers=auth)).status_code == 200
    with psycopg.connect(plain(app_database)) as conn:
        conn.execute("UPDATE api_keys SET revoked_at = now()")
    # Verified 9 s ago: the API skips the lookup (the window is documented in KnownKeys).
    now[0] = 9.0
    assert (await api.client.get("/v1/runs", headers=auth)).status_code == 200
    now[0] = 10.5
    assert (await api.client.get("/v1/runs", headers=auth)).status_code == 401
    assert (await api.client.get("/v1/runs", headers=auth)).status_code == 401  # never cached


def test_known_keys_remember_only_within_the_window_and_stay_bounded() -> None:
    now = [0.0]
    keys = KnownKeys(ttl_s=5.0, max_keys=2, clock=lambda: now[0])
    assert keys.get("rlaas_a_x") is None
    keys.put("rlaas_a_x", "ten_1")
    assert keys.get("rlaas_a_x") == "ten_1"
    assert keys.get("rlaas_a_y") is None  # another secret with the same prefix
    now[0] = 5.0
    assert keys.get("rlaas_a_x") is None
    keys.put("rlaas_a_x", "ten_1")
    keys.put("rlaas_b_x", "ten_2")
    keys.put("rlaas_c_x", "ten_3")  # over max_keys: the map starts again
    assert keys.get("rlaas_a_x") is None and keys.get("rlaas_c_x") == "ten_3"


def test_embedded_defaults_live_in_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None, broker_url=None)
    assert settings.embedded
    assert settings.resolved_database_url() == f"sqlite+aiosqlite:///{tmp_path / 'rlaas.db'}"
    assert settings.resolved_broker_url() == f"sqla+sqlite:///{tmp_path / 'broker.db'}"


def test_embedded_worker_token_is_generated_once_and_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = Settings(data_dir=data_dir, database_url=None, worker_token=None)
    token = first.resolved_worker_token()
    token_file = data_dir / "worker_token"
    assert len(token) >= 32 and token_file.read_text().strip() == token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    again = Settings(data_dir=data_dir, database_url=None, worker_token=None)
    assert again.resolved_worker_token() == token


def test_settings_come_from_rlaas_environment_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RLAAS_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("RLAAS_WORKER_TOKEN", "tok")
    monkeypatch.setenv("RLAAS_DATA_DIR", str(tmp_path))
    settings = Settings()
    assert settings.resolved_database_url() == "postgresql+psycopg://u@h/db"
    # On a database server the shared token is off until the operator keeps it on.
    assert not settings.embedded and settings.resolved_worker_token() is None
    monkeypatch.setenv("RLAAS_ALLOW_SHARED_WORKER_TOKEN", "1")
    assert Settings().resolved_worker_token() == "tok"
    assert settings.data_dir == tmp_path


async def test_a_server_database_with_the_shared_token_on_but_unset_fails_start_up(
    app_database: str, tmp_path: Path
) -> None:
    settings = Settings(
        database_url=app_database,
        worker_token=None,
        allow_shared_worker_token=True,
        data_dir=tmp_path,
    )
    app = create_app(settings)
    with pytest.raises(SettingsError, match="RLAAS_WORKER_TOKEN must be set"):
        async with app.router.lifespan_context(app):
            pass
    assert not (tmp_path / "worker_token").exists()


async def test_readyz_is_503_when_the_database_is_down(tmp_path: Path) -> None:
    settings = Settings(
        database_url="postgresql+psycopg://nobody@127.0.0.1:1/none",
        worker_token="t",
        secret_key=SECRET_KEY,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/healthz")).status_code == 200
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["status"] == "unavailable"


async def test_reseal_moves_every_stored_secret_to_the_new_key(api: Api, app_database: str) -> None:
    """Rotation as an operator does it: new key, old one kept as old; reseal; drop it."""
    from app.admin import reseal_secrets
    from app.crypto import DecryptionError, SecretBox
    from tests.app.conftest import SECRET_KEY

    old = SecretBox(SECRET_KEY)
    with psycopg.connect(plain(app_database)) as conn:
        conn.execute("INSERT INTO tenants (id, name, created_at) VALUES ('ten_r', 'r', now())")
        for i in range(3):
            conn.execute(
                "INSERT INTO environments (id, tenant_id, name, url, secret_encrypted, timeout_s,"
                " max_concurrency, created_at) VALUES (%s, 'ten_r', %s, 'http://e.test', %s, 5,"
                " 4, now())",
                (f"env_{i}", f"e{i}", old.encrypt(f"secret-{i}-secret-{i}", context=f"env_{i}")),
            )
    new_key = "reseal-test-key-Zx8Vq2Lm7Hn4Rt9Wb3Kc6Pd"
    settings = Settings(
        database_url=app_database,
        worker_token=WORKER_TOKEN,
        secret_key=new_key,
        old_secret_keys=SECRET_KEY,
    )
    first = await reseal_secrets(settings)
    assert (first.resealed, first.current, first.unreadable) == (3, 0, [])
    again = await reseal_secrets(settings)
    assert (again.resealed, again.current) == (0, 3)
    with psycopg.connect(plain(app_database)) as conn:
        rows = conn.execute("SELECT id, secret_encrypted FROM environments ORDER BY id").fetchall()
    new_only = SecretBox(new_key)
    for env_id, stored in rows:
        assert new_only.decrypt(stored, context=env_id).startswith("secret-")
        with pytest.raises(DecryptionError):
            old.decrypt(stored, context=env_id)  # a leaked old key opens nothing now
    lost = Settings(database_url=app_database, worker_token=WORKER_TOKEN, secret_key=SECRET_KEY)
    assert len((await reseal_secrets(lost)).unreadable) == 3  # reported, left as they were
