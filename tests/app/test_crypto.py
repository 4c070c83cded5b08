"""Secret encryption at rest (app.crypto) and where its key comes from (Settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.crypto import DecryptionError, SecretBox
from app.main import create_app
from app.settings import Settings, SettingsError
from tests.app.conftest import WORKER_TOKEN

KEY = "unit-test-key-9XqT4wLm2ZrB7vNc5JpK8sHd3Fg"


def test_round_trip_random_nonce_and_bound_to_its_row() -> None:
    box = SecretBox(KEY)
    a, b = (
        box.encrypt("hunter2-hunter2!", context="env_1"),
        box.encrypt("hunter2-hunter2!", context="env_1"),
    )
    assert a != b and "hunter2" not in a  # a fresh nonce each time
    assert box.decrypt(a, context="env_1") == "hunter2-hunter2!"
    with pytest.raises(DecryptionError, match="RLAAS_SECRET_KEY"):
        SecretBox(KEY[::-1]).decrypt(a, context="env_1")  # another deployment key
    tampered = a[:-4] + ("AAAA" if not a.endswith("AAAA") else "BBBB")
    with pytest.raises(DecryptionError):
        box.decrypt(tampered, context="env_1")
    with pytest.raises(DecryptionError, match="not in a format"):
        box.decrypt("plaintext", context="env_1")


@pytest.mark.parametrize(
    ("key", "words"),
    [("short", "at least 32"), ("change-me-secret-key-change-me-secret", "placeholder"),
     ("a" * 40, "placeholder")],
)  # fmt: skip
def test_weak_keys_are_refused(key: str, words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        SecretBox(key)


def test_the_embedded_default_makes_a_key_once(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=None, secret_key=None)
    key = settings.resolved_secret_key()
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert Settings(data_dir=tmp_path, database_url=None).resolved_secret_key() == key
    SecretBox(key)  # good enough for the check


@pytest.mark.anyio
async def test_a_server_database_without_a_secret_key_fails_start_up(
    app_database: str, tmp_path: Path
) -> None:
    for key in (None, "change-me-secret-key"):
        settings = Settings(
            database_url=app_database, worker_token=WORKER_TOKEN, secret_key=key, data_dir=tmp_path
        )
        app = create_app(settings)
        with pytest.raises(SettingsError, match="RLAAS_SECRET_KEY"):
            async with app.router.lifespan_context(app):
                pass
    assert not (tmp_path / "secret_key").exists()


NEW_KEY = "unit-test-key-rotated-Hq7Lm3Zp9Wx2Rt5Vb8Nc"


def test_a_rotated_key_opens_old_secrets_seals_new_ones_and_reseals() -> None:
    old = SecretBox(KEY)
    sealed = old.encrypt("hunter2-hunter2!", context="env_1")
    assert sealed.split(".")[1] == old.key_id  # the key that sealed it, named
    rotated = SecretBox(NEW_KEY, old_keys=[KEY])
    assert rotated.decrypt(sealed, context="env_1") == "hunter2-hunter2!"
    fresh = rotated.encrypt("s3cret-s3cret!!", context="env_2")
    assert fresh.split(".")[1] == rotated.key_id != old.key_id
    resealed = rotated.reseal(sealed, context="env_1")
    assert resealed is not None and rotated.reseal(resealed, context="env_1") is None
    # The old key dropped: what was resealed opens, and the old key opens none of it.
    new_only = SecretBox(NEW_KEY)
    assert new_only.decrypt(resealed, context="env_1") == "hunter2-hunter2!"
    with pytest.raises(DecryptionError, match=f"key '{rotated.key_id}'"):
        old.decrypt(resealed, context="env_1")
    with pytest.raises(DecryptionError, match="RLAAS_OLD_SECRET_KEYS"):
        new_only.decrypt(sealed, context="env_1")


def test_secrets_sealed_before_key_ids_still_open_under_either_key() -> None:
    # The v1 form (no key id) as rows written before rotation existed hold it.
    box = SecretBox(KEY)
    v2 = box.encrypt("hunter2-hunter2!", context="env_1")
    v1 = "v1." + v2.split(".", 2)[2]
    assert SecretBox(NEW_KEY, old_keys=[KEY]).decrypt(v1, context="env_1") == "hunter2-hunter2!"
    assert SecretBox(KEY).reseal(v1, context="env_1") is not None  # gains its key id
