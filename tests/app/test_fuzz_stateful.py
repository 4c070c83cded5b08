"""Schemathesis's state machine over the API, as two tenants: real uvicorn, real Postgres.

The OpenAPI document links each create route's answer to the routes on what it
created (app/openapi.py `add_links`), so schemathesis chains calls: it creates a
run, an environment or a key, then reads, cancels, checks, deletes, revokes it by
its real id. Every call is tenant A's and is held to test_fuzz.py's checks (no
5xx, the answer the schema says). Every call on an id is first made with tenant
B's key: B creates nothing, so whatever A is answered, B is answered 404 (never
data, never a 409 that says the id exists).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky, FlakyFailure
from schemathesis import Case, Response
from schemathesis.core.failures import FailureGroup
from schemathesis.engine.errors import is_inconsistent_replay
from schemathesis.generation.stateful.state_machine import APIStateMachine, StepInput, StepOutput

from app.admin import create_tenant
from app.dispatch import RecordingDispatcher
from app.main import create_app
from tests.app.conftest import app_settings
from tests.app.test_fuzz import CHECKS
from tests.app.webhook_server import serve_app

BUDGET_S = 60.0  # no step starts after this; the app's start and stop come on top
SCENARIOS = 200  # more than fit in the budget: the budget ends the run
STEPS = 10
# Where the environments registered here point: a loopback port nothing listens on,
# so POST /check is answered (ok: false, connection refused) at once.
NOWHERE = "http://127.0.0.1:9/env"
# Answers that come before the id is looked up: the same for both tenants.
BEFORE_LOOKUP = {400, 404, 422}


class _Spent(Exception):
    pass


def two_tenants(
    machine: type[APIStateMachine],
    base_url: str,
    owner: dict[str, str],
    intruder: dict[str, str],
    deadline: float,
    found: Found,
) -> type[APIStateMachine]:
    """``machine`` calling as ``owner``, each call on an id made first as ``intruder``."""

    class TwoTenants(machine):  # type: ignore[misc, valid-type]
        def step(self, input: StepInput) -> StepOutput:
            if time.monotonic() > deadline:
                raise _Spent  # ends the run: there is no shrinking phase to run
            case = input.case
            intruded = None
            if case.path_parameters:
                # The intruder first: had B's cancel or delete gone through, A's own call
                # after it would say so less clearly than B's 2xx does.
                intrusion = case.derive()
                intruded = intrusion.call(base_url=base_url, headers=intruder)
                found.check(intrusion, intruded)
            self.before_call(case)
            kwargs = self.get_call_kwargs(case)
            response = self.call(case, **kwargs)
            self.after_call(response, case)
            found.check(case, response, recorder=self.recorder)
            if intruded is not None:
                found.isolation(case, response, intruded)
            return StepOutput(response, case)

        def before_call(self, case: Case) -> None:
            # A generated URL is refused (the allowlist is 127.0.0.1/32), so without this
            # no environment would be registered and its links never followed.
            if case.operation.label == "POST /v1/environments" and isinstance(case.body, dict):
                case.body["url"] = NOWHERE

        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            return {"base_url": base_url, "headers": owner}

    return TwoTenants


@dataclass
class Found:
    """What the run found, kept here rather than raised: hypothesis would replay a raised
    failure to report it, and against a database the first run changed, a replay is not
    the same run (it says "Flaky" and the failure is lost in the noise)."""

    failures: list[str] = field(default_factory=list)
    # Per operation, the calls on an id that the owner was answered 2xx for: proof that
    # the links led somewhere, and that the intruder was tried on real ids.
    reached: Counter[str] = field(default_factory=Counter)

    def check(self, case: Case, response: Response, recorder: Any = None) -> None:
        try:
            case.validate_response(response, checks=CHECKS, recorder=recorder)
        except FailureGroup as exc:
            self.failures.append(f"{case.operation.label}: {exc}"[:3000])

    def isolation(self, case: Case, owned: Response, intruded: Response) -> None:
        label = f"{case.method.upper()} {case.formatted_path}"
        if 200 <= intruded.status_code < 400:
            self.failures.append(f"B was answered {intruded.status_code} on A's {label}")
        elif owned.status_code not in BEFORE_LOOKUP and intruded.status_code != 404:
            self.failures.append(
                f"B was answered {intruded.status_code}, not 404, on {label}, which A was "
                f"answered {owned.status_code}: B may tell A's ids from no one's"
            )
        if 200 <= owned.status_code < 300:
            self.reached[case.operation.label] += 1


def spent(exc: BaseException) -> bool:
    """The budget ended the run (hypothesis may group the _Spent of its replay)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(_Spent)[1] is None
    return isinstance(exc, _Spent)


def inconsistent(exc: BaseException) -> bool:
    """Hypothesis saw a step's choices change between runs: the API's answers decide which
    links can be followed next, and the database is not reset between scenarios."""
    if isinstance(exc, FlakyFailure):
        return False  # a failure that did not happen again: a failure all the same
    return isinstance(exc, Flaky) or is_inconsistent_replay(exc)


def test_each_create_route_links_to_the_routes_on_what_it_created() -> None:
    paths = create_app().openapi()["paths"]

    def targets(collection: str) -> set[str]:
        links = paths[collection]["post"]["responses"]["201"]["links"]
        return {
            f"{method.upper()} {path}"
            for path, operations in paths.items()
            for method, operation in operations.items()
            if operation["operationId"] in links
        }

    runs = targets("/v1/runs")
    for route in ("GET /v1/runs/{run_id}", "POST /v1/runs/{run_id}/cancel"):
        assert route in runs
    for read in ("events", "metrics", "trajectories", "timeline", "checkpoints", "lineage"):
        assert f"GET /v1/runs/{{run_id}}/{read}" in runs
    assert "GET /v1/runs/{run_id}/metrics/stream" not in runs  # a live run's never ends
    assert not any("{sid}" in route for route in runs)  # no link answers a session's id
    assert targets("/v1/environments") == {
        "GET /v1/environments/{environment_id}",
        "DELETE /v1/environments/{environment_id}",
        "POST /v1/environments/{environment_id}/check",
        "POST /v1/runs",
    }
    assert targets("/v1/keys") == {"DELETE /v1/keys/{key_id}"}


@pytest.mark.minutes(1)
def test_following_links_as_two_tenants_finds_no_5xx_no_off_schema_answer_no_leak(
    app_database: str,
) -> None:
    conf = app_settings(
        app_database,
        quota_requests_per_minute=10_000_000,
        quota_runs_in_flight=1_000_000,
        env_url_allowlist="127.0.0.1/32",  # CIDR only: no DNS lookup of a generated name
    )
    app = create_app(conf, dispatcher=RecordingDispatcher())
    keys = [asyncio.run(create_tenant(conf, f"fuzz-{uuid.uuid4().hex[:8]}"))[1] for _ in "AB"]
    owner, intruder = ({"Authorization": f"Bearer {key}"} for key in keys)
    found = Found()
    with serve_app(app) as port:
        schema = schemathesis.openapi.from_dict(app.openapi())
        # Only the links the document declares: inferred ones (a list's first item, the
        # worker's routes) would spend the budget on 404s and 401s.
        schema.config.phases.stateful.inference.algorithms = []
        deadline = time.monotonic() + BUDGET_S
        machine = two_tenants(
            schema.as_state_machine(),
            f"http://127.0.0.1:{port}",
            owner,
            intruder,
            deadline,
            found,
        )
        while time.monotonic() < deadline:
            try:
                machine.run(
                    settings=settings(
                        max_examples=SCENARIOS,
                        stateful_step_count=STEPS,
                        deadline=None,
                        database=None,
                        phases=[Phase.generate],
                        suppress_health_check=list(HealthCheck),
                    )
                )
            except (Exception, BaseExceptionGroup) as exc:
                if spent(exc):
                    break
                if not inconsistent(exc):
                    raise
                # A fresh run (a new seed) goes on from the database as it now is.
    assert not found.failures, "\n\n".join(found.failures)
    for resource in ("runs", "environments", "keys"):
        assert any(f"/v1/{resource}/{{" in label for label in found.reached), (
            f"no link from POST /v1/{resource} was followed to a 2xx: {dict(found.reached)}"
        )
