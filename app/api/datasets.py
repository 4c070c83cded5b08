"""Public dataset routes: /v1/datasets. Parse, call one service, render.

The upload's body is the file itself, JSONL (``Content-Type: application/x-ndjson``) or
Parquet (``application/vnd.apache.parquet``, or any body that begins with ``PAR1``),
streamed to the service chunk by chunk, never read whole.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import FileResponse

from app.api.deps import LeaseDep, LeaseGate, SessionDep, StateDep, TenantDep
from app.errors import Unprocessable
from app.schemas.datasets import DatasetPage, DatasetRead
from app.services import datasets as service
from app.services.upload_parquet import PARQUET_TYPES

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])
# The worker's copy of a run's pinned content, behind that run's lease token.
internal_router = APIRouter(prefix="/internal/runs", tags=["internal"], dependencies=[LeaseGate])

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_UPLOAD_DOC = {
    "requestBody": {
        "required": True,
        "description": (
            "The file: JSONL (one JSON object a line) or Parquet (read row group by row "
            "group and stored as JSONL, one line a row; docs/datasets.md)."
        ),
        "content": {
            kind: {"schema": {"type": "string", "format": "binary"}}
            for kind in ("application/x-ndjson", *PARQUET_TYPES)
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=DatasetRead,
    openapi_extra=_UPLOAD_DOC,
    responses={
        200: {"model": DatasetRead, "description": "The dataset of that name, content replaced"},
        413: {"description": "Over the size or row cap, or the tenant's dataset quota"},
        422: {
            "description": (
                "A bad row: its number under 'line' (JSONL) or 'row' (Parquet), the field "
                "under 'field'; or a Parquet file that cannot be read"
            )
        },
    },
)
async def upload(
    request: Request,
    response: Response,
    session: SessionDep,
    tenant_id: TenantDep,
    app_state: StateDep,
    name: Annotated[str, Query(min_length=1, max_length=200, pattern=_NAME)],
    required: Annotated[
        str | None,
        Query(max_length=2000, description="Comma-separated fields every row must have."),
    ] = None,
    content_type: Annotated[str | None, Header()] = None,
) -> DatasetRead:
    """Upload a JSONL or Parquet file. A name already used replaces that dataset's content
    (200); runs already submitted keep the content they pinned."""
    declared = (content_type or "").split(";")[0].strip().lower()
    fields = tuple(f.strip() for f in (required or "").split(",") if f.strip())
    if len(fields) > 100:
        raise Unprocessable("required names at most 100 fields", field="required")
    dataset, created = await service.upload(
        session,
        tenant_id,
        name,
        request.stream(),
        settings=app_state.settings,
        required=fields,
        parquet=declared in PARQUET_TYPES,
    )
    if not created:
        response.status_code = 200
    return DatasetRead.model_validate(dataset)


@router.get("", response_model=DatasetPage)
async def list_datasets(session: SessionDep, tenant_id: TenantDep) -> DatasetPage:
    rows = await service.list_for(session, tenant_id)
    return DatasetPage(items=[DatasetRead.model_validate(d) for d in rows])


@router.get("/{dataset_id}", response_model=DatasetRead)
async def get_dataset(dataset_id: str, session: SessionDep, tenant_id: TenantDep) -> DatasetRead:
    return DatasetRead.model_validate(await service.get(session, tenant_id, dataset_id))


@router.delete("/{dataset_id}", status_code=204, response_class=Response)
async def delete_dataset(
    dataset_id: str, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> Response:
    """Refused (409, naming them) while a queued or running run uses the dataset."""
    await service.delete(session, tenant_id, dataset_id, settings=app_state.settings)
    return Response(status_code=204)


@internal_router.get(
    "/{run_id}/datasets/{sha256}",
    response_class=FileResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "The JSONL file"}},
)
async def download_pinned(
    run_id: str, sha256: str, session: SessionDep, app_state: StateDep, lease: LeaseDep
) -> FileResponse:
    """The dataset content the run pinned at submit, streamed from the data folder."""
    path = await service.content_for_run(
        session, run_id, lease, sha256, settings=app_state.settings
    )
    return FileResponse(path, media_type="application/x-ndjson")
