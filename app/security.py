"""API keys: ``rlaas_<prefix>_<secret>``, stored as a SHA-256 hash, compared in constant time.

The prefix is stored in the clear to find the row; the secret never is.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_api_key() -> tuple[str, str, str]:
    """Returns (plaintext key, prefix, hash)."""
    prefix = secrets.token_hex(6)
    key = f"rlaas_{prefix}_{secrets.token_urlsafe(32)}"
    return key, prefix, hash_key(key)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_prefix(key: str) -> str | None:
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "rlaas" or not parts[1] or not parts[2]:
        return None
    return parts[1]


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
