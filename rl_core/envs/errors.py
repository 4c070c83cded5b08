"""Errors of webhook environments.

An infrastructure failure of one episode is an `EnvironmentFailure`: the
agent ends that episode as ``env_error`` and the run goes on. Too many of
them is `FailureBudgetExhausted`, which is *not* an `EnvironmentFailure`: it
must fail the run (the collector lets it through)::

    RlCoreError
    ├── EnvironmentFailure
    │   └── WebhookError              a call to the environment server failed
    │       ├── WebhookUnavailable    connection error, timeout or 5xx/429, after the retries
    │       ├── WebhookRejected       a 4xx answer (bad signature, bad request): not retried
    │       ├── WebhookAddressRefused the URL's host is, or resolves to, an address the
    │       │                         allowlist does not allow: no connection, not retried
    │       ├── WebhookProtocolError  a 2xx answer whose body is not the protocol's shape
    │       ├── DeferredTimeout       a deferred step's result did not arrive before its deadline
    │       └── CircuitOpen           the endpoint failed repeatedly; calls are held off
    └── FailureBudgetExhausted        too many episodes failed: the run fails
"""

from __future__ import annotations

from rl_core.errors import EnvironmentFailure, RlCoreError


class WebhookError(EnvironmentFailure):
    def __init__(self, target_id: str, message: str) -> None:
        super().__init__(f"webhook environment {target_id}: {message}")
        self.target_id = target_id


class WebhookUnavailable(WebhookError):
    pass


class WebhookRejected(WebhookError):
    def __init__(self, target_id: str, message: str, status: int) -> None:
        super().__init__(target_id, message)
        self.status = status


class WebhookAddressRefused(WebhookError):
    """No request was sent: the host is, or now resolves to, an address that
    ``RLAAS_ENV_URL_ALLOWLIST`` does not allow (checked as the connection is made)."""


class WebhookProtocolError(WebhookError):
    pass


class DeferredTimeout(WebhookError):
    pass


class CircuitOpen(WebhookError):
    pass


class FailureBudgetExhausted(RlCoreError):
    """More episodes failed than ``environment.webhook.failure_budget`` allows."""

    def __init__(self, target_id: str, failed: int, started: int, allowed: int, last: str) -> None:
        super().__init__(
            f"webhook environment {target_id}: {failed} of {started} episodes failed, more than "
            f"the failure budget allows ({allowed}); last failure: {last}. Fix the environment "
            "server, or raise environment.webhook.failure_budget / failure_budget_min in the spec"
        )
        self.failed = failed
        self.started = started
