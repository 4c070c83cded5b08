"""Per-tenant quotas: runs in flight, request rate, body size, compute budget.

Defaults come from Settings (``RLAAS_QUOTA_*``); a tenant's ``quota_*``
columns override them. Over a quota is an explicit answer, never a stall:
429 with ``Retry-After`` and the quota in the body, or 413 naming the limit.

- Runs in flight are counted in the database under a lock on the tenant's
  row, so two submits racing at the limit cannot both pass.
- The request rate is a token bucket per tenant (burst = the per-minute
  quota, refilled continuously), in PostgreSQL and shared by every API process
  (``app.services.rate``): behind N replicas a tenant still gets its rate once.
- The body size is enforced by ``app.api.body_limit.BodyLimitMiddleware``
  before the route reads anything, with the limit ``Limiter.body_limit`` looks up.
- The compute budget (run-seconds per rolling period, and a cap on one run's
  ``train.steps``) is checked at submit, after the runs in flight (``app.services.budget``).
- The environment callback route has no tenant to charge (no API key): its rate
  is the same token bucket per source address (``Limiter.take_callback``).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import ApiKey, Run, Tenant, TinkerCheckpoint, UploadedAdapter, utcnow
from app.errors import Forbidden, TooManyRequests, Unprocessable
from app.services import budget as budget_service
from app.services import run_states
from app.services.rate import LocalBuckets, RequestBuckets, TokenBucket
from app.settings import Settings

CACHE_TTL_S = 10.0
_CACHE_MAX = 10_000
_SOURCES_MAX = 10_000
_UNFINISHED = (run_states.QUEUED, run_states.STARTING, run_states.RUNNING)
V = TypeVar("V")
Q = TypeVar("Q", int, int | None)  # a quota: a number, or None for none


@dataclass(frozen=True)
class Quotas:
    runs_in_flight: int
    requests_per_minute: int
    body_bytes: int
    run_seconds: int | None = None  # per settings.quota_run_seconds_period_s; None: no budget
    train_steps: int | None = None  # the most one run may ask for; None: no cap
    dataset_bytes: int = 1_073_741_824  # all of the tenant's uploaded datasets together
    artifact_bytes: int = 100 * 1_073_741_824  # runs' checkpoints/exports, adapters, Tinker states
    # The Tinker API's (app.services.tinker_limits); 0: no limit.
    tinker_models_per_base: int = 16
    tinker_calls_in_flight: int = 256
    tinker_tokens_per_minute: int = 5_000_000
    # Which of these are the tenant's own (its quota_<name> column), not the deployment's:
    # a refusal says whose limit it met.
    own: frozenset[str] = frozenset()

    @classmethod
    def of(cls, tenant: Tenant | None, settings: Settings) -> Quotas:
        own: set[str] = set()

        def pick(column: str, default: Q) -> Q:
            override: Q | None = getattr(tenant, column) if tenant is not None else None
            if override is None:
                return default
            own.add(column.removeprefix("quota_"))
            return override

        return cls(
            runs_in_flight=pick("quota_runs_in_flight", settings.quota_runs_in_flight),
            requests_per_minute=pick(
                "quota_requests_per_minute", settings.quota_requests_per_minute
            ),
            body_bytes=pick("quota_body_bytes", settings.quota_body_bytes),
            run_seconds=pick("quota_run_seconds", settings.quota_run_seconds),
            train_steps=pick("quota_train_steps", settings.quota_train_steps),
            dataset_bytes=pick("quota_dataset_bytes", settings.quota_dataset_bytes),
            artifact_bytes=pick("quota_artifact_bytes", settings.quota_artifact_bytes),
            tinker_models_per_base=pick(
                "quota_tinker_models_per_base", settings.tinker_max_models_per_base
            ),
            tinker_calls_in_flight=pick(
                "quota_tinker_calls_in_flight", settings.tinker_max_calls_in_flight
            ),
            tinker_tokens_per_minute=pick(
                "quota_tinker_tokens_per_minute", settings.tinker_tokens_per_minute
            ),
            own=frozenset(own),
        )


class Limiter:
    """The request-rate buckets (``buckets``: shared on PostgreSQL, this process's own by
    default) and a short cache of each tenant's quotas."""

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
        buckets: RequestBuckets | None = None,
        tinker_tokens: RequestBuckets | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self.buckets: RequestBuckets = buckets or LocalBuckets(clock)
        # The Tinker API's tokens per minute (app.services.tinker_limits): a bucket counted
        # in tokens, kept as the request rate is.
        self.tinker_tokens: RequestBuckets = tinker_tokens or LocalBuckets(clock)
        self._by_tenant: dict[str, tuple[float, Quotas]] = {}
        self._by_prefix: dict[str, tuple[float, int]] = {}
        # Least recently seen first: past _SOURCES_MAX the longest-quiet address is
        # forgotten (it comes back to a full bucket), so random sources cannot grow memory.
        self._by_source: OrderedDict[str, TokenBucket] = OrderedDict()

    async def quotas(self, session: AsyncSession, tenant_id: str) -> Quotas:
        now = self._clock()
        cached = self._by_tenant.get(tenant_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        quotas = Quotas.of(await session.get(Tenant, tenant_id), self.settings)
        _put(self._by_tenant, tenant_id, (now + CACHE_TTL_S, quotas))
        return quotas

    async def take_request(self, session: AsyncSession, tenant_id: str) -> None:
        quotas = await self.quotas(session, tenant_id)
        wait = await self.buckets.take(tenant_id, quotas.requests_per_minute)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise TooManyRequests(
                f"over the request rate of {quotas.requests_per_minute} per minute; "
                f"retry after {retry}s or ask for a higher quota",
                retry_after_s=retry,
                quota={"name": "requests_per_minute", "limit": quotas.requests_per_minute},
            )

    async def take_session_call(self, session: AsyncSession, tenant_id: str) -> None:
        """A session's model call, from the tenant's request bucket at
        ``session_call_cost`` of a request: the data plane of an agent's run calls the
        model far more often than a client calls the control plane."""
        cost = self.settings.session_call_cost
        if cost <= 0:
            return  # the operator does not count them
        quotas = await self.quotas(session, tenant_id)
        wait = await self.buckets.take(tenant_id, quotas.requests_per_minute, cost)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            calls = round(quotas.requests_per_minute / cost)
            raise TooManyRequests(
                f"over the request rate of {quotas.requests_per_minute} per minute (a "
                f"session's call costs {cost:g} of a request: {calls} calls a minute with "
                f"no other requests); retry after {retry}s or ask for a higher quota",
                retry_after_s=retry,
                quota={"name": "requests_per_minute", "limit": quotas.requests_per_minute},
            )

    def take_callback(self, address: str | None) -> None:
        """A post to the callback route from ``address``: 429 past its rate, checked before
        the route reads the database, so a flood costs a dictionary look-up each."""
        per_minute = self.settings.callback_requests_per_minute
        source = source_of(address)
        now = self._clock()
        bucket = self._by_source.get(source)
        if bucket is None:
            bucket = self._by_source[source] = TokenBucket(per_minute, now)
            if len(self._by_source) > _SOURCES_MAX:
                self._by_source.popitem(last=False)
        else:
            self._by_source.move_to_end(source)
        wait = bucket.take(per_minute, now)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise TooManyRequests(
                f"over {per_minute} environment callbacks per minute from {source}; retry "
                f"after {retry}s (Retry-After), or spread the results out",
                retry_after_s=retry,
                quota={"name": "callback_requests_per_minute", "limit": per_minute},
            )

    async def requests_available(self, tenant_id: str, quotas: Quotas) -> int:
        return await self.buckets.available(tenant_id, quotas.requests_per_minute)

    async def body_limit(
        self, sessions: async_sessionmaker[AsyncSession], prefix: str | None
    ) -> int:
        """The body limit of the tenant whose key has ``prefix`` (the default if none matches).

        Read before the key is verified (the body comes before the route), so the
        worst a forged prefix gets is that tenant's limit, and then a 401.
        """
        default = self.settings.quota_body_bytes
        if prefix is None:
            return default
        now = self._clock()
        cached = self._by_prefix.get(prefix)
        if cached is not None and cached[0] > now:
            return cached[1]
        async with sessions() as session:
            override = await session.scalar(
                select(Tenant.quota_body_bytes)
                .join(ApiKey, ApiKey.tenant_id == Tenant.id)
                .where(ApiKey.prefix == prefix)
            )
        limit = default if override is None else override
        _put(self._by_prefix, prefix, (now + CACHE_TTL_S, limit))
        return limit


def source_of(address: str | None) -> str:
    """The unit a callback rate is kept for: an IPv4 address, or an IPv6 address's /64
    (one host usually holds a whole /64, so single IPv6 addresses would cost it nothing)."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # not an IP (a test client's name, a Unix socket): as it is
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def _put(cache: dict[str, V], key: str, value: V) -> None:
    if len(cache) >= _CACHE_MAX:  # random prefixes must not grow memory without bound
        cache.clear()
    cache[key] = value


async def runs_in_flight(session: AsyncSession, tenant_id: str) -> int:
    return int(
        await session.scalar(
            select(func.count())
            .select_from(Run)
            .where(Run.tenant_id == tenant_id, Run.status.in_(_UNFINISHED))
        )
        or 0
    )


async def artifact_bytes_used(session: AsyncSession, tenant_id: str) -> int:
    """What the tenant's stored artifacts take (the quota ``artifact_bytes``): each run's
    kept checkpoints and exports as its worker last measured them, the uploads here, and
    the training state its Tinker models saved (as their workers wrote it)."""
    runs = await session.scalar(
        select(func.coalesce(func.sum(Run.stored_bytes), 0)).where(Run.tenant_id == tenant_id)
    )
    uploads = await session.scalar(
        select(func.coalesce(func.sum(UploadedAdapter.size_bytes), 0)).where(
            UploadedAdapter.tenant_id == tenant_id
        )
    )
    saved = await session.scalar(
        select(func.coalesce(func.sum(TinkerCheckpoint.size_bytes), 0)).where(
            TinkerCheckpoint.tenant_id == tenant_id
        )
    )
    return int(runs or 0) + int(uploads or 0) + int(saved or 0)


async def admit_run(
    session: AsyncSession,
    tenant_id: str,
    settings: Settings,
    train_steps: int | None = None,
    now: datetime | None = None,
) -> None:
    """Refuse the new run if it is over a quota; else it may be stored.

    In this order: ``train_steps`` over the tenant's cap (422: no wait will help), its
    stored artifacts at their quota (403: deleting some helps, waiting does not), its
    quota of unfinished runs, then its compute budget (429 with ``Retry-After``). The
    tenant's row stays locked until the request commits, so concurrent submits of one
    tenant queue here (SQLite has no row locks; it serialises writers anyway).
    """
    tenant = await session.scalar(select(Tenant).where(Tenant.id == tenant_id).with_for_update())
    quotas = Quotas.of(tenant, settings)
    cap = quotas.train_steps
    if cap is not None and train_steps is not None and train_steps > cap:
        refusal = Unprocessable(
            f"train.steps is {train_steps} and this tenant's cap per run is {cap}; ask for "
            f"at most {cap} steps, or ask for a higher quota",
            field="spec.train.steps",
        )
        refusal.extra = {"quota": {"name": "train_steps", "limit": cap}}
        raise refusal
    stored = await artifact_bytes_used(session, tenant_id)
    if stored >= quotas.artifact_bytes:
        # No wait helps (stored files stay until deleted): 403 rather than 429.
        full = Forbidden(
            f"this tenant's stored artifacts take {stored} bytes and the quota is "
            f"{quotas.artifact_bytes} (artifact_bytes: runs' checkpoints and exports, and "
            "adapters); free some before starting a run: delete a finished run's artifacts "
            "(DELETE /v1/runs/{id}/artifacts, after downloading what you keep) or an adapter "
            "(DELETE /v1/adapters/{id}), or ask for a higher quota",
            field="quota.artifact_bytes",
        )
        quota_info = {"name": "artifact_bytes", "limit": quotas.artifact_bytes, "used": stored}
        full.extra = {"quota": quota_info}
        raise full
    quota = quotas.runs_in_flight
    used = await runs_in_flight(session, tenant_id)
    if used >= quota:
        retry = settings.runs_in_flight_retry_after_s
        raise TooManyRequests(
            f"{used} runs are queued or running and the quota is {quota}; wait for one to "
            "finish, cancel one, or ask for a higher quota",
            retry_after_s=retry,
            quota={"name": "runs_in_flight", "limit": quota, "used": used},
        )
    if quotas.run_seconds is not None:
        await _admit_budget(session, tenant_id, quotas.run_seconds, settings, now or utcnow())


async def _admit_budget(
    session: AsyncSession, tenant_id: str, budget: int, settings: Settings, now: datetime
) -> None:
    period = settings.quota_run_seconds_period_s
    used, intervals = await budget_service.run_seconds_used(session, tenant_id, period, now)
    if used < budget:
        return
    retry = budget_service.seconds_until_under(intervals, budget, period, now)
    raise TooManyRequests(
        f"this tenant's runs held workers for {used:.0f} s in the last {period} s and the "
        f"budget is {budget} s; retry after {retry} s, when older use has left the period, "
        "or ask for a higher quota",
        retry_after_s=retry,
        quota={"name": "run_seconds", "limit": budget, "used": round(used), "period_s": period},
    )
