"""The worker's side of the control plane's ``/internal/`` API.

Errors::

    ControlPlaneError
    ├── ClaimRefused      the run is not claimable (409): someone else has it, or it ended
    ├── LeaseLost         a heartbeat or report was refused (403: the lease token no longer
    │                     holds the run; 409: the run's state forbids it): this worker no
    │                     longer owns the run
    └── ApiUnavailable    the API did not answer within the retry budget

Credentials: a client sends one bearer token. The claim takes this worker's credential
(``RLAAS_WORKER_CREDENTIAL``, or the deprecated shared ``RLAAS_WORKER_TOKEN``) and
answers a lease token; every other call names the claimed
run and takes that lease token, so ``execute_run`` claims with one client and reports
with clients made from the claim (`ControlPlane.for_lease`).

Every body and answer is a model of ``rl_core.protocol.internal``, the models
the control plane declares for these routes. A body that does not validate
here is refused before it is sent (a `ControlPlaneError`, as the control
plane's 422 would be).

Transient failures (connection errors, 5xx, 429) are retried with capped
exponential backoff for up to ``retry_seconds``; every call has a timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from rl_core.protocol.internal import (
    BATCHES,
    ArtifactBody,
    ClaimBody,
    ClaimRead,
    GatewayBody,
    HeartbeatBody,
    HeartbeatRead,
    IngestRead,
    StatusBody,
    WorkerReportBody,
)

if TYPE_CHECKING:
    from rl_core.envs.walls import WallReport

log = logging.getLogger(__name__)
A = TypeVar("A", bound=BaseModel)


class ControlPlaneError(Exception):
    pass


class ClaimRefused(ControlPlaneError):
    pass


class LeaseLost(ControlPlaneError):
    pass


class ApiUnavailable(ControlPlaneError):
    pass


# The claim answer and the heartbeat answer, as the wire contract defines them.
Claim = ClaimRead
Heartbeat = HeartbeatRead


class ControlPlane:
    """A small synchronous client; one per thread (httpx clients are not shared)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        worker_id: str,
        *,
        retry_seconds: float = 120.0,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``token``: the shared worker token to claim, a claim's lease token for the rest."""
        self.worker_id = worker_id
        self._base_url = base_url
        self._retry_seconds = retry_seconds
        self._timeout_s = timeout_s
        self._transport = transport
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def for_lease(self, claim: Claim) -> ControlPlane:
        """A new client (for another thread, or the claimer's own reports) that sends the
        claim's lease token: the credential of every route of that run but the claim."""
        return ControlPlane(
            self._base_url,
            claim.lease_token,
            self.worker_id,
            retry_seconds=self._retry_seconds,
            timeout_s=self._timeout_s,
            transport=self._transport,
        )

    def claim(
        self,
        run_id: str,
        lease_seconds: float,
        *,
        fair: bool = False,
        sandbox: WallReport | None = None,
        bases: Sequence[str] = (),
    ) -> Claim:
        """Lease ``run_id``, or with ``fair`` the queued run fair order puts first (the
        answer's ``run_id``): what the worker's task does. ``sandbox``: this worker's wall,
        which the claim's run event names. ``bases``: the model sources this worker holds
        (hosting several runs): the tenant's run on one of them goes first."""
        fields: dict[str, Any] = {"worker_id": self.worker_id, "lease_seconds": lease_seconds}
        if fair:  # only when asked, so a server of the release before still reads the body
            fields["fair"] = True
        if sandbox is not None:
            fields["sandbox"] = {"wall": sandbox.wall, "tenant_code": sandbox.tenant_code}
        if bases:  # only when there are some, so a server of the release before reads it
            fields["bases"] = list(bases)
        body = _body(ClaimBody, **fields)
        data = self._post(
            f"/internal/runs/{run_id}/claim", body, refused=ClaimRefused, refused_on=(409,)
        )
        return _answer(ClaimRead, data, "claim")

    def report_worker(self, queue: str, sandbox: WallReport) -> None:
        """Say which sandbox wall this worker runs tenant code behind (listed on /readyz)."""
        wall = {"wall": sandbox.wall, "tenant_code": sandbox.tenant_code}
        body = _body(WorkerReportBody, worker_id=self.worker_id, queue=queue, sandbox=wall)
        self._post("/internal/workers/report", body, refused_on=())

    def heartbeat(
        self,
        run_id: str,
        inflight: Mapping[str, Any] | None = None,
        lease_seconds: float | None = None,
    ) -> Heartbeat:
        """Push the lease ``lease_seconds`` ahead (the claim's length, RLAAS_LEASE_SECONDS:
        without it, the control plane's default of 60 s would replace the worker's own)."""
        fields: dict[str, Any] = {"worker_id": self.worker_id}
        if inflight is not None:
            fields["inflight"] = inflight
        if lease_seconds is not None:
            fields["lease_seconds"] = lease_seconds
        body = _body(HeartbeatBody, **fields)
        data = self._post(f"/internal/runs/{run_id}/heartbeat", body)
        return _answer(HeartbeatRead, data, "heartbeat")

    def register_gateway(self, run_id: str, url: str, token: str) -> None:
        """Where this worker serves the sessions run's gateway (the API proxies to it)."""
        body = _body(GatewayBody, worker_id=self.worker_id, url=url, token=token)
        self._post(f"/internal/runs/{run_id}/gateway", body)

    def report_status(self, run_id: str, status: str, error: str | None = None) -> None:
        fields: dict[str, Any] = {"worker_id": self.worker_id, "status": status}
        if error is not None:
            fields["error"] = error[:4000]
        body = _body(StatusBody, **fields)
        self._post(f"/internal/runs/{run_id}/status", body)

    def send_batch(
        self,
        run_id: str,
        kind: str,
        seq: int,
        items: Sequence[Mapping[str, Any]],
        *,
        retry_seconds: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """Send one numbered batch of ``kind`` (see BATCHES); True if already stored.
        ``extra``: other fields of the body (a metrics batch's ``updates``)."""
        route, model, key = BATCHES[kind]
        fields = {**(extra or {}), key: list(items)}
        body = _body(model, worker_id=self.worker_id, seq=seq, **fields)
        data = self._post(
            f"/internal/runs/{run_id}/{route}",
            body,
            retry_seconds=retry_seconds,
        )
        return _answer(IngestRead, data, route).duplicate

    def record_artifact(
        self,
        run_id: str,
        kind: str,
        record: Mapping[str, Any],
        *,
        retry_seconds: float | None = None,
    ) -> None:
        """Record a file the run wrote (a checkpoint, a profile); idempotent on (kind, step)."""
        body = _body(ArtifactBody, worker_id=self.worker_id, kind=kind, **record)
        self._post(
            f"/internal/runs/{run_id}/artifacts",
            body,
            retry_seconds=retry_seconds,
        )

    def _post(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        refused: type[ControlPlaneError] = LeaseLost,
        refused_on: tuple[int, ...] = (403, 409),
        retry_seconds: float | None = None,
    ) -> dict[str, Any]:
        """POST ``body``; raises ``refused`` on the statuses that say the run is not this
        worker's (any more), and retries transient failures for the retry budget."""
        budget = self._retry_seconds if retry_seconds is None else retry_seconds
        deadline = time.monotonic() + budget
        delay = 0.2
        while True:
            try:
                response = self._http.post(path, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code in refused_on:
                    raise refused(_message(response))
                if response.status_code < 400:
                    result: dict[str, Any] = response.json()
                    return result
                if response.status_code not in (429, 502, 503, 504) and response.status_code < 500:
                    raise ControlPlaneError(
                        f"{path}: HTTP {response.status_code}: {_message(response)}"
                    )
                problem = f"HTTP {response.status_code}"
            if time.monotonic() + delay > deadline:
                raise ApiUnavailable(f"{path}: gave up after {budget:.0f}s: {problem}")
            log.warning("control plane %s failed (%s); retrying in %.1fs", path, problem, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message") or response.text)
    except ValueError:
        return response.text[:500]


def _body(model: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """``fields`` validated as ``model``, as JSON (fields left out stay out: the server's
    defaults apply); a body the control plane would refuse is refused here."""
    try:
        body = model.model_validate(fields)
    except ValidationError as exc:
        raise ControlPlaneError(f"{model.__name__} is not valid: {exc}") from None
    return body.model_dump(mode="json", exclude_unset=True)


def _answer(model: type[A], data: dict[str, Any], what: str) -> A:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ControlPlaneError(f"the control plane's {what} answer is not valid: {exc}") from None
