"""Tenants and their API keys."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ApiKey, Tenant
from app.errors import Conflict, Unauthorized
from app.security import hash_key, new_api_key, parse_prefix, same_secret


async def create_tenant(session: AsyncSession, name: str) -> tuple[Tenant, str]:
    """A new tenant and its first key (the plaintext is returned once, never stored)."""
    if await session.scalar(select(Tenant.id).where(Tenant.name == name)):
        raise _name_taken(name)
    tenant = Tenant(id=f"ten_{uuid.uuid4().hex}", name=name)
    session.add(tenant)
    key, prefix, digest = new_api_key()
    session.add(
        ApiKey(id=f"key_{uuid.uuid4().hex}", tenant_id=tenant.id, prefix=prefix, key_hash=digest)
    )
    try:
        await session.flush()
    except IntegrityError as exc:  # the same name created concurrently
        raise _name_taken(name) from exc
    return tenant, key


def _name_taken(name: str) -> Conflict:
    return Conflict(f"a tenant named {name!r} exists already; choose another name", field="name")


async def authenticate(session: AsyncSession, key: str) -> str:
    """The tenant id that owns ``key``, or Unauthorized."""
    prefix = parse_prefix(key)
    row = None
    if prefix is not None:
        row = await session.scalar(
            select(ApiKey).where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))
        )
    # Hash and compare even when no row matched, so timing tells nothing.
    expected = row.key_hash if row is not None else "0" * 64
    if not same_secret(hash_key(key), expected) or row is None:
        raise Unauthorized(
            "the API key is not valid; use a key printed by `rlaas tenants create`",
            field="Authorization",
        )
    return row.tenant_id


class KnownKeys:
    """Keys verified in the last ``ttl_s`` seconds, by their SHA-256: a poll skips the lookup.

    The key lookup was one of the four database round trips of every tenant request
    (B9 in ``bench/`` polls ``GET /v1/runs/{id}``). Only a key that passed
    ``authenticate`` is remembered; a key revoked in the database keeps working
    here for at most ``ttl_s``, the window the quota cache (``app.services.quotas``) has too.
    """

    def __init__(
        self,
        ttl_s: float = 10.0,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s, self._max, self._clock = ttl_s, max_keys, clock
        self._tenants: dict[str, tuple[float, str]] = {}

    def get(self, key: str) -> str | None:
        """The tenant of ``key`` if it was verified within the window, else None."""
        found = self._tenants.get(hash_key(key))
        if found is None or found[0] <= self._clock():
            return None
        return found[1]

    def put(self, key: str, tenant_id: str) -> None:
        if len(self._tenants) >= self._max:
            self._tenants.clear()  # bounded: a flood of distinct valid keys only costs lookups
        self._tenants[hash_key(key)] = (self._clock() + self._ttl_s, tenant_id)
