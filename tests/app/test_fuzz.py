"""Schemathesis against the app's own OpenAPI: real uvicorn, real Postgres, bounded in time.

Every operation gets valid and invalid inputs (generated from the schema); the
checks are that nothing answers 5xx and every answer matches what the schema
says it returns (status code, content type, body). A tenant key (or the
worker token for /internal) is sent, so the fuzz reaches past authentication.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.admin import create_tenant
from app.dispatch import RecordingDispatcher
from app.main import create_app
from tests.app.conftest import WORKER, app_settings, lease
from tests.app.webhook_server import serve_app

# A dataset upload's body is the JSONL or Parquet file's bytes, an adapter upload's a tar:
# sent as such, like any binary body.
schemathesis.serializer.alias(
    [
        "application/x-ndjson",
        "application/vnd.apache.parquet",
        "application/x-parquet",
        "application/x-tar",
    ],
    "application/octet-stream",
)

BUDGET_S = 45.0  # generation plus calls; the app's start and stop come on top
EXAMPLES = 15
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def fuzz(
    operation: schemathesis.APIOperation,
    mode: GenerationMode,
    base_url: str,
    headers: dict[str, str],
    budget_s: float,
) -> None:
    """Up to EXAMPLES generated cases against one operation, within ``budget_s``."""
    deadline = time.monotonic() + budget_s

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def exercise(case: schemathesis.Case) -> None:
        if time.monotonic() > deadline:
            raise _Spent  # stops the generation: there is no shrinking phase to run
        case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS)

    try:
        exercise()
    except _Spent:
        pass  # this operation's share of the budget is used up
    except Unsatisfiable:
        pass  # no invalid input exists (no parameters, or only free-form strings)


class _Spent(Exception):
    pass


def modes(operation: schemathesis.APIOperation) -> list[GenerationMode]:
    """Invalid input only where the schema constrains some: a query or a body.

    Elsewhere (a free-form path id, the Authorization header) hypothesis spends
    seconds finding that no invalid value exists.
    """
    if len(operation.query) or len(operation.body):
        return [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    return [GenerationMode.POSITIVE]


def test_fuzzing_the_openapi_finds_no_5xx_and_no_off_schema_answer(app_database: str) -> None:
    conf = app_settings(
        app_database,
        quota_requests_per_minute=10_000_000,
        quota_runs_in_flight=1_000_000,
        # CIDR only: a generated host name is refused before any DNS lookup.
        env_url_allowlist="127.0.0.1/32",
    )
    app = create_app(conf, dispatcher=RecordingDispatcher())
    _, key = asyncio.run(create_tenant(conf, f"fuzz-{uuid.uuid4().hex[:8]}"))
    tenant = {"Authorization": f"Bearer {key}"}
    failures: list[str] = []
    with serve_app(app) as port:
        base_url = f"http://127.0.0.1:{port}"
        schema = schemathesis.openapi.from_dict(app.openapi())
        operations = [result.ok() for result in schema.get_all_operations()]
        budget_s = BUDGET_S / sum(len(modes(op)) for op in operations)
        for operation in operations:
            headers = tenant
            if operation.path.endswith("/claim"):
                headers = WORKER
            elif operation.path.startswith("/internal/"):
                # A lease token of no run: the body is read and checked before the run's
                # lease is (the shared token would be refused before the body is read).
                headers = lease("rlaas_lease_of-no-run")
            for mode in modes(operation):
                try:
                    fuzz(operation, mode, base_url, headers, budget_s)
                except (Exception, BaseExceptionGroup) as exc:  # schemathesis raises a group
                    label = f"{operation.method.upper()} {operation.path} ({mode.value})"
                    failures.append(f"{label}: {exc}"[:3000])
    assert not failures, "\n\n".join(failures)
