"""Request dependencies: the session (the edge owns the transaction) and the callers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated

import aiohttp
from fastapi import Depends, Header, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.crypto import SecretBox
from app.dispatch import Dispatcher, ServeOrders, dispatch_committed
from app.errors import Forbidden, Unauthorized
from app.observability import Observability
from app.routing import Routes
from app.security import WORKER_CREDENTIAL_PREFIX, LeaseProof, same_secret
from app.services.callbacks import CallbackRelay
from app.services.gateways import GatewayCache
from app.services.quotas import Limiter
from app.services.tenants import KnownKeys, authenticate
from app.services.worker_credentials import (
    SHARED,
    SharedTokenNotice,
    WorkerIdentity,
    hold,
    touch,
)
from app.services.worker_credentials import authenticate as authenticate_worker
from app.settings import Settings
from app.urlcheck import Allowlist


@dataclass
class AppState:
    """What the lifespan made, handed to every request."""

    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    dispatcher: Dispatcher
    routes: Routes  # where each accelerator's runs are sent (RLAAS_QUEUES)
    worker_token: str | None  # the shared token, where it is still accepted (else None)
    secrets: SecretBox
    env_allowlist: Allowlist
    limits: Limiter
    relay: CallbackRelay = field(default_factory=CallbackRelay)
    known_keys: KnownKeys = field(default_factory=KnownKeys)
    shared_token_notice: SharedTokenNotice = field(default_factory=SharedTokenNotice)
    # Sessions runs' calls, proxied to the gateways of their workers (app.services.gateways);
    # made in the lifespan (it needs the running loop).
    gateways: aiohttp.ClientSession | None = None
    gateway_cache: GatewayCache = field(default_factory=GatewayCache)
    # Where checkpoint servers are asked for (app.services.serving): the Celery dispatcher,
    # or a test's; None: this deployment sends none (the route answers 503 saying so).
    serve_orders: ServeOrders | None = None


@dataclass
class AfterCommit:
    """Runs to dispatch once the request's transaction has committed: (run id, its
    accelerator), sent to that accelerator's queue (`app.routing`)."""

    runs: list[tuple[str, str | None]] = field(default_factory=list)


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.rlaas
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def get_observability(request: Request) -> Observability:
    obs: Observability = request.app.state.observability
    return obs


ObservabilityDep = Annotated[Observability, Depends(get_observability)]


async def get_session(request: Request, app_state: StateDep) -> AsyncIterator[AsyncSession]:
    """One transaction per request: commit if the handler returned, else roll back.

    Dispatches queued after the commit, so a worker never claims a run that is not
    yet durable, and a failed request sends nothing.
    """
    after = AfterCommit()
    request.state.after_commit = after
    async with app_state.sessions() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise
    await dispatch_committed(app_state.dispatcher, app_state.routes, after.runs)


# scope="function": commit before the response is sent, so a 201 means durable.
SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]


def get_after_commit(request: Request, _session: SessionDep) -> AfterCommit:
    after: AfterCommit = request.state.after_commit
    return after


AfterCommitDep = Annotated[AfterCommit, Depends(get_after_commit, scope="function")]


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized(
            "missing Authorization header; send 'Authorization: Bearer <key>'",
            field="Authorization",
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <key>'", field="Authorization")
    return token.strip()


async def _authenticated(
    request: Request, session: AsyncSession, app_state: AppState, authorization: str | None
) -> str:
    key = _bearer(authorization)
    tenant_id = app_state.known_keys.get(key)
    if tenant_id is None:
        tenant_id = await authenticate(session, key)
        app_state.known_keys.put(key, tenant_id)
    request.scope["rlaas_tenant_id"] = tenant_id  # for the access log
    return tenant_id


async def get_tenant(
    request: Request,
    session: SessionDep,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> str:
    tenant_id = await _authenticated(request, session, app_state, authorization)
    # After authentication, so nobody can spend another tenant's request budget.
    await app_state.limits.take_request(session, tenant_id)
    return tenant_id


async def get_tenant_of_session_call(
    request: Request,
    session: SessionDep,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> str:
    """As `get_tenant`, for a model call of a session: it costs `session_call_cost` of a
    request (`Limiter.take_session_call`)."""
    tenant_id = await _authenticated(request, session, app_state, authorization)
    await app_state.limits.take_session_call(session, tenant_id)
    return tenant_id


TenantDep = Annotated[str, Depends(get_tenant, scope="function")]
SessionCallTenantDep = Annotated[str, Depends(get_tenant_of_session_call, scope="function")]


async def require_worker(
    session: SessionDep,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> WorkerIdentity:
    """A worker's own credential (or the shared token, where the operator keeps it on):
    it opens the claim and the worker's report, and nothing that names a claimed run."""
    token = _bearer(authorization)
    if app_state.worker_token is not None and same_secret(token, app_state.worker_token):
        app_state.shared_token_notice.used()
        identity = SHARED
    else:
        identity = await authenticate_worker(session, token)
        await touch(app_state.sessions, identity)
        await hold(session, identity)
    return identity


WorkerDep = Depends(require_worker, scope="function")
WorkerIdentityDep = Annotated[WorkerIdentity, Depends(require_worker, scope="function")]


def require_lease(
    app_state: StateDep, authorization: Annotated[str | None, Header()] = None
) -> LeaseProof:
    """A run-scoped worker route's credential: the lease token its claim answered.

    Here it is only read and hashed; the service checks it against the run's row in the
    statement that does the work, so that the check costs no query of its own.
    """
    token = _bearer(authorization)
    shared = app_state.settings.worker_token
    if token.startswith(WORKER_CREDENTIAL_PREFIX) or (shared and same_secret(token, shared)):
        # A worker's credential (or the shared token) opens claims only; were it enough
        # here, one leaked copy would let its holder report to any tenant's run and read
        # what the run is sent.
        raise Forbidden(
            "the worker token opens only claims (POST /internal/runs/{id}/claim); a run's "
            "other worker routes take the lease token of the claim's answer (lease_token)",
            field="Authorization",
        )
    return LeaseProof.of(token)


# Router-level (so no route of a run router can go without it) and a parameter (to hand the
# proof to the service); FastAPI runs it once per request.
LeaseDep = Annotated[LeaseProof, Depends(require_lease)]
LeaseGate = Depends(require_lease)
