"""Registered webhook environments: register, read, delete, and hand to a run's worker.

The secret is encrypted before it reaches the session (``app.crypto``) and is
decrypted only for the lease owner's claim and for the control plane's own
signed calls (``/check``, callback verification).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.crypto import SecretBox
from app.db.models import Environment, Run
from app.errors import Conflict, NotFound, Unprocessable
from app.schemas.environments import EnvironmentCreate, EnvironmentGrant
from app.services import run_states
from app.urlcheck import Allowlist, UrlRefused, check_url
from rl_core.protocol.ecosystem import CONFIGS, ConfigProblem, parse_config, registered_environment
from rl_core.spec import EnvironmentSpec

ID_PREFIX = "env_"
_UNFINISHED = (run_states.QUEUED, run_states.STARTING, run_states.RUNNING)


async def create(
    session: AsyncSession,
    tenant_id: str,
    body: EnvironmentCreate,
    *,
    box: SecretBox,
    allowlist: Allowlist,
) -> Environment:
    try:
        url = await check_url(body.url, allowlist)
    except UrlRefused as exc:
        raise Unprocessable(str(exc), field="url") from None
    env_id = f"{ID_PREFIX}{uuid.uuid4().hex}"
    env = Environment(
        id=env_id,
        tenant_id=tenant_id,
        name=body.name,
        url=url,
        secret_encrypted=box.encrypt(body.secret.get_secret_value(), context=env_id),
        timeout_s=body.timeout_s,
        max_concurrency=body.max_concurrency,
    )
    try:
        async with session.begin_nested():
            session.add(env)
    except IntegrityError:
        raise Conflict(
            f"an environment named {body.name!r} exists already; choose another name or "
            "delete that one",
            field="name",
        ) from None
    return env


async def list_for(session: AsyncSession, tenant_id: str) -> list[Environment]:
    query = select(Environment).where(Environment.tenant_id == tenant_id)
    return list(await session.scalars(query.order_by(Environment.created_at, Environment.id)))


async def get(session: AsyncSession, tenant_id: str, env_id: str) -> Environment:
    env = await session.scalar(
        select(Environment).where(Environment.id == env_id, Environment.tenant_id == tenant_id)
    )
    if env is None:
        raise NotFound(f"no environment {env_id!r}", field="environment_id")
    return env


async def delete(session: AsyncSession, tenant_id: str, env_id: str) -> None:
    """Refused while an unfinished run uses it: its worker would lose its callbacks."""
    env = await get(session, tenant_id, env_id)
    for run in await session.scalars(
        select(Run).where(Run.tenant_id == tenant_id, Run.status.in_(_UNFINISHED))
    ):
        if env_id in (environment_name(run.spec), scorer_name(run.spec), judge_name(run.spec)):
            raise Conflict(
                f"run {run.id} ({run.status}) uses {env_id}; cancel it or wait for it to end",
                field="environment_id",
            )
    await session.delete(env)
    await session.flush()


def environment_name(spec: dict[str, Any]) -> str | None:
    """The registered environment (``env_<id>``) a stored spec calls, if any: its
    ``environment.name``, or an ``openenv`` spec's ``environment.config.environment``."""
    env = spec.get("environment")
    name = env.get("name") if isinstance(env, dict) else None
    if not isinstance(name, str) or not isinstance(env, dict):
        return None
    return registered_environment(name, env.get("config"))


def scorer_name(spec: dict[str, Any]) -> str | None:
    """The registered scorer endpoint (``env_<id>``) a stored spec's ``webhook`` reward
    posts to (``environment.scorer``), if any."""
    env = spec.get("environment")
    name = env.get("scorer") if isinstance(env, dict) else None
    return name if isinstance(name, str) else None


def judge_name(spec: dict[str, Any]) -> str | None:
    """The registered LLM judge (``env_<id>``) a stored spec's ``judge`` reward calls
    (``environment.judge.endpoint``), if any."""
    env = spec.get("environment")
    judge = env.get("judge") if isinstance(env, dict) else None
    name = judge.get("endpoint") if isinstance(judge, dict) else None
    return name if isinstance(name, str) else None


async def require_environment(session: AsyncSession, tenant_id: str, env: EnvironmentSpec) -> None:
    """A spec's environment must be usable (422 otherwise): the config of an ecosystem
    kind (``reasoning_gym``, ``openenv``; docs/ecosystem.md) well formed, and a
    registered environment it names one of the tenant's."""
    field = "spec.environment.name"
    if env.name in CONFIGS:
        try:
            parse_config(env.name, env.config)
        except ConfigProblem as exc:
            where = f"spec.environment.config.{exc.field}".rstrip(".")
            raise Unprocessable(str(exc), field=where) from None
        if env.config.get("url") is not None:
            # A URL in a spec would skip the registration's checks and its secret.
            raise Unprocessable(
                "environment.config.url is for local runs; register the server with POST "
                "/v1/environments and name its id in environment.config.environment",
                field="spec.environment.config.url",
            )
        field = "spec.environment.config.environment"
    name = registered_environment(env.name, env.config)
    if name is not None:
        await require_registered(session, tenant_id, name, field=field)
    if env.scorer is not None:
        await require_registered(session, tenant_id, env.scorer, field="spec.environment.scorer")
    if env.judge is not None:
        field = "spec.environment.judge.endpoint"
        await require_registered(session, tenant_id, env.judge.endpoint, field=field)


async def require_registered(
    session: AsyncSession, tenant_id: str, name: str, *, field: str = "spec.environment.name"
) -> None:
    """A spec naming ``env_...`` must name one of the tenant's environments (422 otherwise)."""
    if not name.startswith(ID_PREFIX):
        return
    found = await session.scalar(
        select(Environment.id).where(Environment.id == name, Environment.tenant_id == tenant_id)
    )
    if found is None:
        raise Unprocessable(
            f"no registered environment {name!r}; register one with POST /v1/environments "
            "and use the id it returns",
            field=field,
        )


async def grant_for_run(session: AsyncSession, run: Run, box: SecretBox) -> EnvironmentGrant | None:
    """The environment a claimed run calls, with its secret decrypted; None for built-ins."""
    return await _grant(session, run, environment_name(run.spec), box)


async def scorer_grant_for_run(
    session: AsyncSession, run: Run, box: SecretBox
) -> EnvironmentGrant | None:
    """The scorer endpoint a claimed run's ``webhook`` reward calls, secret decrypted."""
    return await _grant(session, run, scorer_name(run.spec), box)


async def judge_grant_for_run(
    session: AsyncSession, run: Run, box: SecretBox
) -> EnvironmentGrant | None:
    """The LLM judge a claimed run's ``judge`` reward calls, its API key decrypted."""
    return await _grant(session, run, judge_name(run.spec), box)


async def _grant(
    session: AsyncSession, run: Run, name: str | None, box: SecretBox
) -> EnvironmentGrant | None:
    if name is None or not name.startswith(ID_PREFIX):
        return None
    env = await session.scalar(
        select(Environment).where(Environment.id == name, Environment.tenant_id == run.tenant_id)
    )
    if env is None:
        return None
    return EnvironmentGrant(
        id=env.id,
        url=env.url,
        secret=box.decrypt(env.secret_encrypted, context=env.id),
        timeout_s=env.timeout_s,
        max_concurrency=env.max_concurrency,
    )
