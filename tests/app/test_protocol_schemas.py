"""app/schemas is held to the wire contract (rl_core.protocol): the OpenAPI document the
control plane serves declares, for every worker route and the environment callback
route, exactly the protocol's models, so the control plane and the worker cannot drift."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.main import create_app
from app.schemas import results as app_results
from rl_core.protocol import internal as wire
from rl_core.protocol import webhook

REF = "#/components/schemas/{model}"

# (path, method) -> (request body model or None, answer status, answer model or None: empty)
ROUTES: dict[tuple[str, str], tuple[type[BaseModel] | None, str, type[BaseModel] | None]] = {
    ("/internal/runs/{run_id}/claim", "post"): (wire.ClaimBody, "200", wire.ClaimRead),
    ("/internal/runs/{run_id}/heartbeat", "post"): (
        wire.HeartbeatBody,
        "200",
        wire.HeartbeatRead,
    ),
    ("/internal/runs/{run_id}/status", "post"): (wire.StatusBody, "200", wire.StatusRead),
    ("/internal/runs/{run_id}/gateway", "post"): (wire.GatewayBody, "200", wire.StatusRead),
    ("/internal/workers/report", "post"): (wire.WorkerReportBody, "200", wire.StatusRead),
    ("/internal/runs/{run_id}/metrics", "post"): (wire.MetricsBody, "200", wire.IngestRead),
    ("/internal/runs/{run_id}/spans", "post"): (wire.SpansBody, "200", wire.IngestRead),
    ("/internal/runs/{run_id}/trajectories", "post"): (
        wire.TrajectoriesBody,
        "200",
        wire.IngestRead,
    ),
    ("/internal/runs/{run_id}/artifacts", "post"): (
        wire.ArtifactBody,
        "200",
        wire.ArtifactStored,
    ),
    ("/internal/runs/{run_id}/env-callbacks/{episode_id}/{step}", "get"): (
        None,
        "200",
        wire.CallbackRead,
    ),
    # A served checkpoint's server (worker/serving.py), behind its order's secret.
    ("/internal/serving/{server_id}", "get"): (None, "204", None),
    ("/internal/serving/{server_id}", "post"): (wire.ServingUrlBody, "204", None),
    ("/internal/serving/{server_id}/failed", "post"): (wire.ServingFailedBody, "204", None),
    ("/internal/serving/{server_id}", "delete"): (None, "204", None),
    # A Tinker model worker (worker/tinker_server.py), with its worker credential.
    ("/internal/tinker/workers", "post"): (wire.TinkerWorkerBody, "201", wire.TinkerWorkerRead),
    ("/internal/tinker/workers/{worker_id}", "delete"): (None, "204", None),
    # The body is read raw (the MAC is over its bytes) and validated as CallbackBody.
    ("/v1/env-callbacks/{episode_id}/{step}", "post"): (
        None,
        "202",
        webhook.CallbackAccepted,
    ),
}
# Worker routes whose answer is bytes, not a protocol model: a dataset's pinned content,
# streamed as the tenant uploaded it (checked by its SHA-256 on the worker).
STREAMED = {
    ("/internal/runs/{run_id}/datasets/{sha256}", "get"),
    ("/internal/runs/{run_id}/init-adapter", "get"),  # a tar (app/api/init_from.py)
}


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    return create_app().openapi()


def _component(openapi: dict[str, Any], ref: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = ref["$ref"].rsplit("/", 1)[1]
    return name, openapi["components"]["schemas"][name]


def _assert_declares(
    openapi: dict[str, Any], ref: dict[str, Any], model: type[BaseModel], mode: Any
) -> None:
    name, declared = _component(openapi, ref)
    assert name.split("-")[0] == model.__name__
    expected = model.model_json_schema(ref_template=REF, mode=mode)
    defs = expected.pop("$defs", {})
    declared, expected = _without_null_defaults(declared), _without_null_defaults(expected)
    assert declared == expected, f"{name} differs from rl_core.protocol's {model.__name__}"
    components = openapi["components"]["schemas"]
    suffix = "-Input" if mode == "validation" else "-Output"
    for def_name, schema in defs.items():
        found = components.get(f"{def_name}{suffix}") or components[def_name]
        found, schema = _without_null_defaults(found), _without_null_defaults(schema)
        assert found == schema, f"{def_name} differs from the protocol's"


def _without_null_defaults(schema: Any) -> Any:
    """``schema`` as FastAPI renders it: no null defaults, every bound a float."""
    if isinstance(schema, bool):
        return schema
    if isinstance(schema, int | float):
        return float(schema)
    if isinstance(schema, dict):
        return {
            k: _without_null_defaults(v)
            for k, v in schema.items()
            if not (k == "default" and v is None)
        }
    if isinstance(schema, list):
        return [_without_null_defaults(v) for v in schema]
    return schema


def test_every_worker_route_declares_the_protocols_models(openapi: dict[str, Any]) -> None:
    internal = {
        (path, method)
        for path, ops in openapi["paths"].items()
        if path.startswith("/internal/")
        for method in ops
    }
    callback = ("/v1/env-callbacks/{episode_id}/{step}", "post")
    assert (internal - STREAMED) | {callback} == set(ROUTES), (
        "a worker route is missing from this test's table: hold it to rl_core.protocol"
    )
    for (path, method), (body, status, answer) in ROUTES.items():
        op = openapi["paths"][path][method]
        if body is not None:
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            _assert_declares(openapi, schema, body, "validation")
        if answer is None:
            assert "content" not in op["responses"][status], (path, method)
            continue
        schema = op["responses"][status]["content"]["application/json"]["schema"]
        _assert_declares(openapi, schema, answer, "serialization")


def test_app_schemas_are_the_protocol_models() -> None:
    from app import schemas
    from app.schemas import environments

    assert schemas.ClaimRead is wire.ClaimRead and schemas.MetricsBody is wire.MetricsBody
    assert environments.EnvironmentGrant is wire.EnvironmentGrant
    assert environments.CallbackAccepted is webhook.CallbackAccepted
    assert app_results.TrajectoryIn is wire.TrajectoryIn


def test_the_public_reads_extend_the_wire_records() -> None:
    # What a worker sent is what a tenant reads back, plus the stored row's own fields.
    assert issubclass(app_results.TrajectoryRead, wire.TrajectoryIn)
    assert set(app_results.TrajectoryRead.model_fields) - set(wire.TrajectoryIn.model_fields) == {
        "id"
    }
    assert issubclass(app_results.CheckpointRead, wire.CheckpointRef)
    assert app_results.InflightRead.model_fields["snapshot"].annotation == wire.InflightIn | None
