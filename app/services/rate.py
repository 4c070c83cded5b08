"""The per-tenant request-rate buckets: one shared by every API process (PostgreSQL), or
one in this process (the embedded default, where there is one process).

Both have a burst of the per-minute quota and refill continuously. The shared one keeps,
per tenant, one number: the theoretical arrival time of the next request (GCRA, the
generic cell rate algorithm), which is a token bucket written as one timestamp. A request
is let through while that time is at most ``60 s - 60 s / rate`` ahead of now, and moves it
``60 s / rate`` on. Taking a token is one statement (an upsert) on an autocommit engine of
its own, so the row is locked for that statement only, never for the request.

Times are the API processes' wall clocks, as the leases' are: replicas on hosts whose
clocks disagree by a second share a bucket that is off by that second.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import RequestBucket, TinkerTokenBucket

# Float sums of the arrival time: let the rate-th request of a burst through though its
# arrival time is a rounding error past the bound.
_EPSILON_S = 1e-6

# `held` is read from the statement's snapshot, before the upsert: the arrival time the
# refusal is measured against (another process may move it meanwhile; that changes only
# the Retry-After, by a fraction of a second).
_TAKE = """
    WITH held AS (SELECT tat FROM {table} WHERE tenant_id = :tenant),
    taken AS (
        INSERT INTO {table} AS b (tenant_id, tat) VALUES (:tenant, :now + :interval)
        ON CONFLICT (tenant_id) DO UPDATE SET tat = greatest(b.tat, :now) + :interval
        WHERE b.tat <= :now + :tolerance
        RETURNING b.tat
    )
    SELECT (SELECT tat FROM taken) AS taken, (SELECT tat FROM held) AS held
"""
# The tables a bucket may be kept in: the request rate, and the Tinker API's tokens.
BUCKET_TABLES: dict[str, type[RequestBucket] | type[TinkerTokenBucket]] = {
    "request_buckets": RequestBucket,
    "tinker_token_buckets": TinkerTokenBucket,
}


class RequestBuckets(Protocol):
    async def take(self, tenant_id: str, per_minute: int, cost: float = 1.0) -> float:
        """0 if a request may go now (and it is counted, as ``cost`` requests), else the
        seconds to wait."""
        ...

    async def available(self, tenant_id: str, per_minute: int) -> int:
        """Requests that may be sent now without a 429."""
        ...


class TokenBucket:
    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.tokens = float(per_minute)
        self.updated = now

    def refill(self, per_minute: int, now: float) -> None:
        # A changed quota takes effect at once, without a free refill.
        self.capacity = float(per_minute)
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * per_minute / 60.0)
        self.updated = now

    def take(self, per_minute: int, now: float, cost: float = 1.0) -> float:
        """0 if ``cost`` tokens were taken, else the seconds until they will be there."""
        self.refill(per_minute, now)
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        if per_minute <= 0:
            return 60.0
        return (cost - self.tokens) * 60.0 / per_minute


class LocalBuckets:
    """A bucket per tenant in this process: the embedded default (one process, SQLite)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    async def take(self, tenant_id: str, per_minute: int, cost: float = 1.0) -> float:
        now = self._clock()
        bucket = self._buckets.get(tenant_id)
        if bucket is None:
            bucket = self._buckets[tenant_id] = TokenBucket(per_minute, now)
        return bucket.take(per_minute, now, cost)

    async def available(self, tenant_id: str, per_minute: int) -> int:
        bucket = self._buckets.get(tenant_id)
        if bucket is None:
            return per_minute
        bucket.refill(per_minute, self._clock())
        return int(bucket.tokens)


class SharedBuckets:
    """A bucket per tenant in PostgreSQL (``request_buckets``, or another of
    ``BUCKET_TABLES``), shared by every replica."""

    def __init__(
        self,
        engine: AsyncEngine,
        clock: Callable[[], float] = time.time,
        table: str = "request_buckets",
    ) -> None:
        """``engine``: an autocommit engine (``make_engine(url, autocommit=True)``)."""
        self.engine = engine
        self._row = BUCKET_TABLES[table]  # a fixed name, never a caller's string, in the SQL
        self._take = text(_TAKE.format(table=table))
        self._clock = clock  # a wall clock: the processes sharing a bucket must agree on it

    async def take(self, tenant_id: str, per_minute: int, cost: float = 1.0) -> float:
        if per_minute <= 0:
            return 60.0
        # GCRA with weights: a request moves the arrival time by its cost's share of the
        # minute, and may go while that leaves it at most a minute ahead, whatever its cost.
        interval = cost * 60.0 / per_minute
        tolerance = 60.0 - interval + _EPSILON_S
        now = self._clock()
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    self._take,
                    {"tenant": tenant_id, "now": now, "interval": interval, "tolerance": tolerance},
                )
            ).one()
        if row.taken is not None:
            return 0.0
        # No row in the snapshot (another process made it in the same instant) or one the
        # upsert found moved since: wait one interval, a token's worth.
        wait = float(row.held) - now - tolerance if row.held is not None else 0.0
        return wait if wait > 0 else interval

    async def available(self, tenant_id: str, per_minute: int) -> int:
        if per_minute <= 0:
            return 0
        async with self.engine.connect() as conn:
            tat = await conn.scalar(select(self._row.tat).where(self._row.tenant_id == tenant_id))
        interval = 60.0 / per_minute
        now = self._clock()
        # The next arrival time may run up to 60 s ahead; each request moves it one interval.
        ahead = max(0.0, (tat if tat is not None else now) - now)
        return max(0, min(per_minute, math.floor((60.0 - ahead + _EPSILON_S) / interval)))
