"""Encryption at rest of environment secrets, keyed by ``RLAAS_SECRET_KEY``.

AES-256-GCM with a random 96-bit nonce per value. The AES key is derived from
``RLAAS_SECRET_KEY`` with HKDF-SHA256, so the setting may be any long random
string (not necessarily base64 of 32 bytes). Each ciphertext is bound to the
row it belongs to (associated data = the environment id): a secret copied into
another row by someone with write access to the database does not decrypt.

Stored form: ``v1.<urlsafe base64 of nonce || ciphertext+tag>``; the version
prefix leaves room for a key rotation scheme later.
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.settings import SettingsError

MIN_KEY_CHARS = 32
_PLACEHOLDERS = ("change-me", "changeme", "example", "secret-key", "xxxx")
_VERSION = "v1"


class DecryptionError(RuntimeError):
    """A stored secret does not decrypt with this key: RLAAS_SECRET_KEY changed, or the row did."""


def check_key(key: str) -> None:
    """Refuse a key that is short or an obvious placeholder; the message says how to make one."""
    how = "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
    if len(key) < MIN_KEY_CHARS:
        raise SettingsError(
            f"RLAAS_SECRET_KEY is {len(key)} characters; it needs at least {MIN_KEY_CHARS}: {how}"
        )
    lowered = key.lower()
    if any(p in lowered for p in _PLACEHOLDERS) or len(set(key)) < 10:
        raise SettingsError(f"RLAAS_SECRET_KEY looks like a placeholder, not a random key: {how}")


class SecretBox:
    """Encrypts and decrypts short secrets under one deployment key."""

    def __init__(self, key: str) -> None:
        check_key(key)
        derived = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=b"rlaas environment secrets v1"
        ).derive(key.encode())
        self._aead = AESGCM(derived)

    def encrypt(self, plaintext: str, *, context: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), context.encode())
        return f"{_VERSION}.{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def decrypt(self, stored: str, *, context: str) -> str:
        version, _, payload = stored.partition(".")
        if version != _VERSION or not payload:
            raise DecryptionError(
                f"the stored secret of {context} is not in a format this API reads"
            )
        try:
            raw = base64.urlsafe_b64decode(payload.encode())
            return self._aead.decrypt(raw[:12], raw[12:], context.encode()).decode()
        except (InvalidTag, ValueError) as exc:
            raise DecryptionError(
                f"the stored secret of {context} does not decrypt; was RLAAS_SECRET_KEY changed? "
                "Register the environment again with its secret"
            ) from exc
