"""Request bodies parsed and validated in one pass, by pydantic-core, from the raw bytes.

FastAPI parses a JSON body with the standard library's ``json`` and then validates
the Python objects it built. For a worker's batch of a thousand metric points
that parse was the largest cost of the whole request (B8 in ``bench/``);
``model_validate_json`` reads the bytes straight into the model instead.

A route takes such a body as a dependency and documents it with ``openapi_extra``::

    @router.post("/x", openapi_extra=documented(Model))
    async def x(body: Annotated[Model, json_body(Model)]) -> ...

Errors come out as FastAPI's would (``RequestValidationError``, locations under
``body``), so they render in the API's one error shape.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

# Models read this way; app.openapi adds their schemas to the document's components.
DOCUMENTED: dict[str, type[BaseModel]] = {}


def json_body(model: type[M]) -> Any:
    """A ``Depends`` that gives the request's body validated as ``model``."""

    async def parse(request: Request) -> M:
        raw = await request.body()
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
            raise RequestValidationError(errors) from None

    return Depends(parse)


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` that says the route's body is ``model`` (required, JSON)."""
    DOCUMENTED[model.__name__] = model
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
