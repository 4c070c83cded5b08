"""Encryption at rest of environment secrets, keyed by ``RLAAS_SECRET_KEY``.

AES-256-GCM with a random 96-bit nonce per value. The AES key is derived from
``RLAAS_SECRET_KEY`` with HKDF-SHA256, so the setting may be any long random
string (not necessarily base64 of 32 bytes). Each ciphertext is bound to the
row it belongs to (associated data = the environment id): a secret copied into
another row by someone with write access to the database does not decrypt.

Stored form: ``v2.<key id>.<urlsafe base64 of nonce || ciphertext+tag>``; the key id
(8 hex digits of a hash of the derived key, which says nothing of the key) names the
key that sealed it. Rows written before key ids are ``v1.<base64>``.

Rotation: set the new key as ``RLAAS_SECRET_KEY`` and the old one in
``RLAAS_OLD_SECRET_KEYS`` (comma-separated); everything still opens, and new secrets
are sealed under the new key. ``rlaas secrets reseal`` then seals every stored secret
under the new key; once it reports none left under an old key, drop the old key.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.settings import SettingsError

MIN_KEY_CHARS = 32
_PLACEHOLDERS = ("change-me", "changeme", "example", "secret-key", "xxxx")
_VERSION = "v2"  # with a key id
_VERSION_1 = "v1"


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
    """Encrypts short secrets under the deployment key; decrypts under it or an old one."""

    def __init__(self, key: str, *, old_keys: Sequence[str] = ()) -> None:
        check_key(key)
        self._current = _Key(key)
        self._keys = {self._current.kid: self._current}
        for old in old_keys:
            check_key(old)
            self._keys.setdefault(_Key(old).kid, _Key(old))

    @property
    def key_id(self) -> str:
        """The id of the key new secrets are sealed under."""
        return self._current.kid

    def encrypt(self, plaintext: str, *, context: str) -> str:
        nonce = os.urandom(12)
        sealed = self._current.aead.encrypt(nonce, plaintext.encode(), context.encode())
        payload = base64.urlsafe_b64encode(nonce + sealed).decode()
        return f"{_VERSION}.{self._current.kid}.{payload}"

    def decrypt(self, stored: str, *, context: str) -> str:
        version, _, rest = stored.partition(".")
        if version == _VERSION:
            kid, _, payload = rest.partition(".")
            key = self._keys.get(kid)
            if key is None:
                raise DecryptionError(
                    f"the stored secret of {context} was sealed under key {kid!r}, which is "
                    "neither RLAAS_SECRET_KEY nor in RLAAS_OLD_SECRET_KEYS; set the key it was "
                    "sealed with, or register the environment again with its secret"
                )
            candidates = [key]
        elif version == _VERSION_1 and rest:
            # No key id: try each key, the current one first (it was put in first).
            payload, candidates = rest, list(self._keys.values())
        else:
            raise DecryptionError(
                f"the stored secret of {context} is not in a format this API reads"
            )
        for key in candidates:
            try:
                raw = base64.urlsafe_b64decode(payload.encode())
                return key.aead.decrypt(raw[:12], raw[12:], context.encode()).decode()
            except (InvalidTag, ValueError):
                continue
        raise DecryptionError(
            f"the stored secret of {context} does not decrypt; was RLAAS_SECRET_KEY changed "
            "without the old key in RLAAS_OLD_SECRET_KEYS? Register the environment again "
            "with its secret"
        )

    def reseal(self, stored: str, *, context: str) -> str | None:
        """``stored`` sealed under the current key, or None if it already is."""
        version, _, rest = stored.partition(".")
        if version == _VERSION and rest.partition(".")[0] == self._current.kid:
            return None
        return self.encrypt(self.decrypt(stored, context=context), context=context)


class _Key:
    def __init__(self, key: str) -> None:
        derived = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=b"rlaas environment secrets v1"
        ).derive(key.encode())
        self.aead = AESGCM(derived)
        self.kid = hashlib.sha256(b"rlaas key id" + derived).hexdigest()[:8]
