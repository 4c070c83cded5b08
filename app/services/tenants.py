"""Tenants and their API keys."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ApiKey, Tenant, utcnow
from app.errors import Conflict, NotFound, Unauthorized
from app.security import hash_key, new_api_key, parse_prefix, same_secret


async def create_tenant(session: AsyncSession, name: str) -> tuple[Tenant, str]:
    """A new tenant and its first key (the plaintext is returned once, never stored)."""
    if await session.scalar(select(Tenant.id).where(Tenant.name == name)):
        raise _name_taken(name)
    tenant = Tenant(id=f"ten_{uuid.uuid4().hex}", name=name)
    session.add(tenant)
    _, key = _add_key(session, tenant.id)
    try:
        await session.flush()
    except IntegrityError as exc:  # the same name created concurrently
        raise _name_taken(name) from exc
    return tenant, key


def _add_key(session: AsyncSession, tenant_id: str) -> tuple[ApiKey, str]:
    key, prefix, digest = new_api_key()
    row = ApiKey(
        id=f"key_{uuid.uuid4().hex}",
        tenant_id=tenant_id,
        prefix=prefix,
        key_hash=digest,
        created_at=utcnow(),
    )
    session.add(row)
    return row, key


async def create_key(session: AsyncSession, tenant_id: str) -> tuple[ApiKey, str]:
    """Another key of the tenant (rotation: make the new one, move to it, revoke the old)."""
    row, key = _add_key(session, tenant_id)
    await session.flush()
    return row, key


async def list_keys(session: AsyncSession, tenant_id: str) -> list[ApiKey]:
    rows = await session.scalars(
        select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at, ApiKey.id)
    )
    return list(rows)


async def revoke_key(session: AsyncSession, tenant_id: str, key_id: str) -> ApiKey:
    """Revoke one of the tenant's keys; its last active key cannot be (it would lock it out)."""
    # All of the tenant's keys locked, not just this one: two revokes at once of a
    # tenant's two keys would each see the other still active and lock it out.
    keys = list(
        await session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id).with_for_update())
    )
    row = next((k for k in keys if k.id == key_id), None)
    if row is None:
        raise NotFound(f"no key {key_id!r} of this tenant", field="key_id")
    if row.revoked_at is None:
        if sum(k.revoked_at is None for k in keys) <= 1:
            raise Conflict(
                "this is the tenant's last active key; create another (POST /v1/keys) first",
                field="key_id",
            )
        row.revoked_at = utcnow()
        await session.flush()
    return row


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

    def forget_tenant(self, tenant_id: str) -> None:
        """Drop every remembered key of a tenant (one of its keys was revoked here)."""
        for digest in [d for d, (_, t) in self._tenants.items() if t == tenant_id]:
            del self._tenants[digest]

    def put(self, key: str, tenant_id: str) -> None:
        if len(self._tenants) >= self._max:
            self._tenants.clear()  # bounded: a flood of distinct valid keys only costs lookups
        self._tenants[hash_key(key)] = (self._clock() + self._ttl_s, tenant_id)
