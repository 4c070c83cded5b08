"""Credentials stored as SHA-256 hashes and compared in constant time: API keys and lease tokens.

API keys are ``rlaas_<prefix>_<secret>``; the prefix is stored in the clear to find the
row, the secret never is. Lease tokens (below) are found by their run.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from app.errors import Forbidden


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


# --- lease tokens ------------------------------------------------------------------------
#
# A claim answers a lease token; every run-scoped worker route takes it as its bearer
# credential, and it opens that run only while that lease lasts.
#
# Why a random token with its hash on the run's row, not an HMAC of (run, attempt, expiry)
# keyed by RLAAS_SECRET_KEY: the check reads the run's row anyway (under the same lock
# or UPDATE that the write takes, so it costs no query), and a stored hash makes the token
# end exactly when the lease does: a new claim replaces it, the reaper's re-queue and a
# finished run clear it, with nothing to keep in step. An HMAC would have to encode the
# lease's expiry, which every heartbeat moves, or leave the check to the row regardless; it
# would die with a rotation of RLAAS_SECRET_KEY (every running worker would lose its run)
# and could be minted by whoever reads that key. The hash is SHA-256 of 256 random bits:
# nothing to guess, so no slow hash is needed, and the database never holds the token.

LEASE_TOKEN_PREFIX = "rlaas_lease_"  # names the credential in a log or a secret scanner


def new_lease_token() -> tuple[str, str]:
    """Returns (token, its hash): the worker gets the token, the run's row the hash."""
    token = LEASE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, hash_key(token)


@dataclass(frozen=True)
class LeaseProof:
    """The lease token a run-scoped worker route was called with, as its hash."""

    digest: str = field(repr=False)

    @classmethod
    def of(cls, token: str) -> LeaseProof:
        return cls(hash_key(token))

    def opens(self, stored_hash: str | None) -> bool:
        """True if this is the token of the lease whose hash is stored (None: no lease)."""
        return stored_hash is not None and same_secret(self.digest, stored_hash)

    def refusal(self, run_id: str) -> Forbidden:
        return Forbidden(
            f"this lease token does not hold run {run_id}: a lease token opens only the run "
            "whose claim answered it, and only until that lease ends (the run finished, or its "
            "lease expired and the run was re-queued or claimed again); claim the run to get one",
            field="Authorization",
        )


# --- worker credentials ------------------------------------------------------------------
#
# One per worker, issued by the operator (`rlaas workers issue NAME`): it opens the claim
# and the worker's report, as the shared token did, but revoking one shuts out that worker
# alone. Hashed as an API key is (SHA-256 of 256 random bits: nothing to guess, no slow hash
# needed); the prefix, stored in the clear, finds the row.

WORKER_CREDENTIAL_PREFIX = "rlaas_worker_"  # names the credential in a log or a secret scanner


def new_worker_credential() -> tuple[str, str, str]:
    """Returns (plaintext credential, prefix, hash)."""
    prefix = secrets.token_hex(6)
    credential = f"{WORKER_CREDENTIAL_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    return credential, prefix, hash_key(credential)


def parse_worker_prefix(credential: str) -> str | None:
    """The prefix of a worker credential, or None if ``credential`` is not shaped as one."""
    if not credential.startswith(WORKER_CREDENTIAL_PREFIX):
        return None
    prefix, sep, secret = credential.removeprefix(WORKER_CREDENTIAL_PREFIX).partition("_")
    if not sep or len(prefix) != 12 or not secret:
        return None
    return prefix
