"""The OpenAPI document says what errors look like, because the API answers them in one shape.

FastAPI documents only its own 422 (``HTTPValidationError``: ``{"detail": [...]}``),
which is not what this API sends. Every operation here instead documents
``4XX`` (and its 422) as ``Error``: ``{"error": {"code", "message", "field",
...}}``, the shape of ``app.main``'s handlers. Schemathesis (tests/app/test_fuzz.py)
holds the answers to this document. Starlette's own HTTP errors (unknown path,
wrong method) are rendered in the same shape by `render_http_error`.

It also says where a create route's answer leads (OpenAPI links, `add_links`), so
schemathesis's stateful run (tests/app/test_fuzz_stateful.py) reads, cancels and
deletes what it created, by its real id, instead of a random id's 404.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException

from app.api import jsonbody

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "field"],
            "properties": {
                "code": {"type": "string", "description": "Machine-readable: not_found, ..."},
                "message": {"type": "string", "description": "What is wrong and what to change"},
                "field": {
                    "anyOf": [{"type": "string"}, {"type": "null"}],
                    "description": "The body field, query parameter or header at fault",
                },
            },
            "additionalProperties": True,  # e.g. problems, quota, retry_after_s, limit_bytes
        }
    },
}
_ERROR_RESPONSE = {
    "description": "A typed error (see Error); 429 also sends Retry-After",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=app.description
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            components["Error"] = ERROR_SCHEMA
            components.update(_raw_body_schemas())
            for path_item in schema.get("paths", {}).values():
                for operation in path_item.values():
                    responses = operation.setdefault("responses", {})
                    if "422" in responses:
                        responses["422"] = {**_ERROR_RESPONSE, "description": "Invalid input"}
                    responses.setdefault("4XX", _ERROR_RESPONSE)
            add_links(schema["paths"])
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_exception_handler(HTTPException, render_http_error)  # type: ignore[arg-type]


# Beyond the resource's own routes: a run on the environment just registered, its spec
# naming the environment by the id the registration answered (the rest is generated).
EXTRA_LINKS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "/v1/environments",
        "/v1/runs",
        {"requestBody": {"spec": {"environment": {"name": "$response.body#/id"}}}},
    ),
]
# An event stream of a live run does not end: a client following a link to it would
# wait for the run to finish, which no worker here will make it do.
UNLINKED_SUFFIXES = ("/stream",)


def add_links(paths: dict[str, Any]) -> None:
    """Link each create route's 201 to every operation on what it created.

    A create route is a POST on a collection (``/v1/runs``) that answers 201 with the new
    resource's ``id``; what it created is every path of the form
    ``/v1/runs/{run_id}...`` with that one path parameter. Derived from the paths, so a
    route added under a resource is linked without anyone remembering to.
    """
    for collection, item in paths.items():
        created = item.get("post", {}).get("responses", {}).get("201")
        if created is None:
            continue
        links: dict[str, Any] = {}
        for path, operations in paths.items():
            rest = path.removeprefix(f"{collection}/")
            if rest == path or not rest.startswith("{") or path.count("{") != 1:
                continue
            if path.endswith(UNLINKED_SUFFIXES):
                continue
            parameter = rest[1 : rest.index("}")]
            for operation in operations.values():
                links[operation["operationId"]] = {
                    "operationId": operation["operationId"],
                    "parameters": {f"path.{parameter}": "$response.body#/id"},
                }
        for source, target, link in EXTRA_LINKS:
            if source == collection:
                operation_id = paths[target]["post"]["operationId"]
                links[operation_id] = {"operationId": operation_id, **link}
        if links:
            created["links"] = links


def _raw_body_schemas() -> dict[str, Any]:
    # Bodies that app.api.jsonbody reads from the raw bytes: FastAPI does not see them.
    mode: Literal["validation"] = "validation"
    models = [(model, mode) for model in jsonbody.DOCUMENTED.values()]
    _, document = models_json_schema(models, ref_template="#/components/schemas/{model}")
    defs: dict[str, Any] = document.get("$defs", {})
    return defs


async def render_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    codes = {404: "not_found", 405: "method_not_allowed"}
    message = str(exc.detail)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}; see /docs for the API"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}; see /docs"
    return JSONResponse(
        {
            "error": {
                "code": codes.get(exc.status_code, "http_error"),
                "message": message,
                "field": None,
            }
        },
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )
