"""Limits of the Tinker-compatible API, per tenant: each a 429 with ``Retry-After`` that names
the limit, the tenant's use of it and the setting the operator changes (docs/tinker.md).

- LoRA models per base (``RLAAS_TINKER_MAX_MODELS_PER_BASE``): a slot frees only when the
  tenant unloads a model (``POST /api/v1/unload_model``), never by waiting, so the refusal
  also says ``x-should-retry: false``: the SDK raises it at once instead of retrying it ten
  times. A model is never evicted to make room.
- Work calls in flight (``RLAAS_TINKER_MAX_CALLS_IN_FLIGHT``): the tenant's pending
  futures. Both counts are taken under a lock on the tenant's row (as runs in flight are,
  app.services.quotas.admit_run), held until the route commits its future, so two
  processes racing at the limit cannot both pass.
- Tokens per minute (``RLAAS_TINKER_TOKENS_PER_MINUTE``): a bucket counted in tokens,
  burst = the limit, refilled continuously; kept as the request rate is
  (app.services.rate: ``tinker_token_buckets`` in PostgreSQL, shared by every replica).

A setting of 0 turns its limit off. A tenant's own limit (``tenants.quota_tinker_*``, set by
the operator with ``rlaas tenants quota``; NULL: the setting) takes the setting's place for
that tenant, 0 included; a refusal then says it met the tenant's own limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Tenant, TinkerFuture, TinkerModel, utcnow
from app.errors import TooManyRequests
from app.services.quotas import Limiter, Quotas
from app.services.tinker import WORKER_TIMEOUT_S
from app.settings import Settings

# A pending call older than this has no process making it (each gives up by then).
LOST_AFTER = timedelta(seconds=WORKER_TIMEOUT_S + 60)
# When a call in flight will end is not known; a warm call takes well under a second
# (docs/tinker.md, Measured), so look again in a second.
IN_FLIGHT_RETRY_AFTER_S = 1
# Nothing frees a model slot but an unload: the time a person (or another thread) might
# take to unload one. The SDK does not wait it (x-should-retry: false).
MODELS_RETRY_AFTER_S = 60


async def calls_in_flight(
    session: AsyncSession, tenant_id: str, now: datetime | None = None
) -> int:
    """The tenant's pending futures, less those no process is making any more."""
    since = (now or utcnow()) - LOST_AFTER
    return int(
        await session.scalar(
            select(func.count())
            .select_from(TinkerFuture)
            .where(
                TinkerFuture.tenant_id == tenant_id,
                TinkerFuture.state == "pending",
                TinkerFuture.created_at > since,
            )
        )
        or 0
    )


async def models_per_base(
    session: AsyncSession, settings: Settings, tenant_id: str
) -> dict[str, int]:
    """The tenant's live models on each base: a model whose registered worker has gone
    (worker_id NULL without a static worker) answers 410 and holds no slot."""
    live: ColumnElement[bool] = TinkerModel.worker_id.is_not(None)
    if settings.tinker_worker_url:
        live = or_(live, TinkerModel.worker_id.is_(None))
    rows = await session.execute(
        select(TinkerModel.base_model, func.count())
        .where(TinkerModel.tenant_id == tenant_id, live)
        .group_by(TinkerModel.base_model)
    )
    return {base: int(count) for base, count in rows.tuples()}


async def admit_call(
    session: AsyncSession, settings: Settings, tenant_id: str, *, new_model_on: str | None = None
) -> Quotas:
    """Refuse a work call over the tenant's calls in flight, or a new model (on
    ``new_model_on``) over its models on that base. Locks the tenant's row until the
    request commits (SQLite has no row locks; it serialises writers anyway), and reads its
    limits from that row: an override the operator just set holds from the next call.
    Returns the tenant's quotas."""
    # FOR NO KEY UPDATE (key_share): admissions queue on it, but rows that only point at the tenant
    # (the token bucket's upsert on its own connection, a future written by another
    # process) are not held by it. FOR UPDATE would block them, and this request waits on
    # the bucket's upsert: a deadlock. populate_existing: the row as locked, not as the
    # request's first read of it (the quota cache's) found it.
    tenant = await session.scalar(
        select(Tenant)
        .where(Tenant.id == tenant_id)
        .with_for_update(key_share=True)
        .execution_options(populate_existing=True)
    )
    quotas = Quotas.of(tenant, settings)
    limit = quotas.tinker_calls_in_flight
    if limit:
        used = await calls_in_flight(session, tenant_id)
        if used >= limit:
            whose, source = _whose(quotas, CALLS, settings.tinker_max_calls_in_flight)
            raise TooManyRequests(
                f"this tenant has {used} of {limit} Tinker calls in flight ({whose}); retry "
                "when one has finished (the SDK does, after Retry-After: "
                f"{IN_FLIGHT_RETRY_AFTER_S} s), wait for futures before sending more, or ask "
                "the operator for a higher limit",
                retry_after_s=IN_FLIGHT_RETRY_AFTER_S,
                quota={"name": CALLS.name, "limit": limit, "used": used, **source},
            )
    limit = quotas.tinker_models_per_base
    if new_model_on is not None and limit:
        used = (await models_per_base(session, settings, tenant_id)).get(new_model_on, 0)
        if used >= limit:
            whose, source = _whose(quotas, MODELS, settings.tinker_max_models_per_base)
            refusal = TooManyRequests(
                f"this tenant has {used} of {limit} models on {new_model_on} ({whose}); "
                'unload one (POST /api/v1/unload_model {"model_id": ...}) or ask the '
                "operator for a higher limit",
                retry_after_s=MODELS_RETRY_AFTER_S,
                quota={
                    "name": MODELS.name,
                    "limit": limit,
                    "used": used,
                    "base_model": new_model_on,
                    **source,
                },
            )
            # Waiting frees no slot: the SDK's client raises this at once (it honours the
            # header) rather than retrying it for ten minutes.
            refusal.headers["x-should-retry"] = "false"
            raise refusal
    return quotas


async def take_tokens(limiter: Limiter, session: AsyncSession, tenant_id: str, tokens: int) -> None:
    """Spend ``tokens`` of the tenant's tokens per minute, or refuse the call with the
    seconds until they are there. A call larger than the whole minute's tokens costs the
    whole minute (it waits for a full bucket) rather than never passing."""
    # The tenant's row as admit_call locked and read it (the session holds it: no query).
    quotas = Quotas.of(await session.get(Tenant, tenant_id), limiter.settings)
    per_minute = quotas.tinker_tokens_per_minute
    if not per_minute or tokens <= 0:
        return
    wait = await limiter.tinker_tokens.take(tenant_id, per_minute, min(tokens, per_minute))
    if wait <= 0:
        return
    retry = max(1, math.ceil(wait))
    available = await limiter.tinker_tokens.available(tenant_id, per_minute)
    whose, source = _whose(quotas, TOKENS, limiter.settings.tinker_tokens_per_minute)
    raise TooManyRequests(
        f"this call has {tokens} tokens and this tenant has {available} of its {per_minute} "
        f"tokens a minute left ({whose}); they are there again in {retry} s (Retry-After; "
        "the SDK waits and retries), or ask the operator for a higher limit",
        retry_after_s=retry,
        quota={
            "name": TOKENS.name,
            "limit": per_minute,
            "used": per_minute - available,
            **source,
        },
    )


async def tokens_available(limiter: Limiter, tenant_id: str, per_minute: int) -> int | None:
    """Tokens the tenant may spend now without a 429 (``per_minute``: its limit; None: none)."""
    if not per_minute:
        return None
    return await limiter.tinker_tokens.available(tenant_id, per_minute)


@dataclass(frozen=True)
class Limit:
    name: str  # the quota's name in a 429 body, and the tenant's override's (tenants.quota_<name>)
    setting: str  # the deployment's setting


MODELS = Limit("tinker_models_per_base", "RLAAS_TINKER_MAX_MODELS_PER_BASE")
CALLS = Limit("tinker_calls_in_flight", "RLAAS_TINKER_MAX_CALLS_IN_FLIGHT")
TOKENS = Limit("tinker_tokens_per_minute", "RLAAS_TINKER_TOKENS_PER_MINUTE")


def _whose(quotas: Quotas, limit: Limit, default: int) -> tuple[str, dict[str, Any]]:
    """Whose limit a refusal met, for its message and its body: the deployment's setting, or
    the tenant's own, which the operator set for it (then the setting is not what to change)."""
    if limit.name not in quotas.own:
        return limit.setting, {"setting": limit.setting, "per_tenant": False}
    deployment = f"{default}" if default else "no limit"
    return (
        f"a per-tenant limit the operator set for this tenant, in place of the deployment's "
        f"{limit.setting}, {deployment}",
        {"setting": f"tenants.quota_{limit.name}", "per_tenant": True},
    )
