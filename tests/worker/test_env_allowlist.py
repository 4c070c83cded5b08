"""The worker reads RLAAS_ENV_URL_ALLOWLIST, with the control plane's defaults, and every
webhook environment it builds connects only where that allows (issue #17)."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from rl_core.envs.errors import FailureBudgetExhausted, WebhookAddressRefused
from rl_core.protocol.internal import ClaimRead, EnvironmentGrant
from worker.job import failure_reason, webhook_targets
from worker.settings import WorkerSettings

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RLAAS_BROKER_URL", "RLAAS_ENV_URL_ALLOWLIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RLAAS_DATA_DIR", str(tmp_path))


def test_defaults_public_on_a_server_public_and_loopback_embedded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    embedded = WorkerSettings()
    assert embedded.embedded and embedded.env_allowlist().classes == {"public", "loopback"}
    monkeypatch.setenv("RLAAS_BROKER_URL", "redis://redis:6379/0")
    server = WorkerSettings()
    assert not server.embedded and server.env_allowlist().classes == {"public"}
    monkeypatch.setenv("RLAAS_ENV_URL_ALLOWLIST", "public,10.1.0.0/16,*.envs.example.com")
    chosen = WorkerSettings().env_allowlist()
    assert chosen.classes == {"public"} and chosen.names("a.envs.example.com")


def test_a_bad_entry_stops_the_worker_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLAAS_ENV_URL_ALLOWLIST", "public,10.0.0.0/33")
    with pytest.raises(ValidationError, match="is not a CIDR"):
        WorkerSettings()


def claim(
    environment: EnvironmentGrant | None, scorer: EnvironmentGrant | None = None
) -> ClaimRead:
    return ClaimRead(
        run_id="run_1",
        spec={},
        attempt=1,
        lease_expires_at=datetime.now(UTC),
        resume_step=0,
        environment=environment,
        scorer=scorer,
        lease_token="rlaas_lease_test",
    )


def test_the_webhook_target_carries_the_workers_allowlist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grant = EnvironmentGrant(
        id="env_a", url="http://envs.example.com:9000", secret="s" * 16, timeout_s=7.0,
        max_concurrency=4,
    )  # fmt: skip
    assert webhook_targets(claim(None), WorkerSettings()) == {}
    monkeypatch.setenv("RLAAS_BROKER_URL", "redis://redis:6379/0")
    target = webhook_targets(claim(grant), WorkerSettings())["env_a"]
    assert (target.url, target.timeout_s, target.max_concurrency) == (grant.url, 7.0, 4)
    # A server worker: loopback refused (rl_core's own-machine default would allow it).
    assert target.allowlist.refusal("localhost", LOOPBACK) is not None


def test_a_scorer_endpoint_gets_the_workers_allowlist_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ``webhook`` reward's endpoint (``environment.scorer``) is a target like the
    environment, behind the same walls: a server worker connects to no loopback."""
    env = EnvironmentGrant(
        id="env_a", url="http://envs.example.com", secret="s" * 16, timeout_s=7.0,
        max_concurrency=4,
    )  # fmt: skip
    scorer = EnvironmentGrant(
        id="env_s", url="http://127.0.0.1:9000", secret="t" * 16, timeout_s=3.0,
        max_concurrency=2,
    )  # fmt: skip
    monkeypatch.setenv("RLAAS_BROKER_URL", "redis://redis:6379/0")
    targets = webhook_targets(claim(env, scorer), WorkerSettings())
    assert set(targets) == {"env_a", "env_s"}
    assert (targets["env_s"].secret, targets["env_s"].timeout_s) == ("t" * 16, 3.0)
    assert targets["env_s"].allowlist.refusal("127.0.0.1", LOOPBACK) is not None
    only_scorer = webhook_targets(claim(None, scorer), WorkerSettings())
    assert set(only_scorer) == {"env_s"}


def test_the_runs_error_says_why_the_connection_was_refused() -> None:
    last = WebhookAddressRefused(
        "env_a",
        "POST http://envs.example.com:9000/reset was not sent: refused to connect: "
        "envs.example.com resolves to 10.0.0.5, a private address, which "
        "RLAAS_ENV_URL_ALLOWLIST does not allow; not retried",
    )
    reason = failure_reason(FailureBudgetExhausted("env_a", 6, 6, 5, str(last)))
    assert reason.startswith("FailureBudgetExhausted: webhook environment env_a: 6 of 6")
    assert "http://envs.example.com:9000/reset" in reason  # a URL is not a worker's path
    assert "resolves to 10.0.0.5, a private address" in reason
