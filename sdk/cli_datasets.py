"""``rlaas datasets``: upload, list and delete your datasets over the HTTP API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

datasets = typer.Typer(
    help="Your datasets (JSONL or Parquet) for the `dataset` environment, over the HTTP API.",
    no_args_is_help=True,
)

ApiUrl = Annotated[str, typer.Option(envvar="RLAAS_API_URL", help="Control plane base URL.")]
ApiKey = Annotated[str, typer.Option(envvar="RLAAS_API_KEY", help="Your API key.")]
URL = "http://127.0.0.1:8000"


@datasets.command("upload")
def upload(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    name: Annotated[str | None, typer.Option(help="Default: the file's name.")] = None,
    required: Annotated[str, typer.Option(help="Comma-separated fields every row must have.")] = "",
    api_url: ApiUrl = URL,
    api_key: ApiKey = "",
) -> None:
    """Upload a JSONL or Parquet (.parquet) file; prints its id (the environment's
    config.dataset)."""
    from sdk.cli import _call

    fields = [f.strip() for f in required.split(",") if f.strip()]
    ds = _call(
        api_url, api_key, lambda client: client.upload_dataset(file, name=name, required=fields)
    )
    typer.echo(
        f"{ds.name}: {ds.rows} rows, fields {', '.join(ds.fields)}, sha256 {ds.sha256}", err=True
    )
    typer.echo(ds.id)


@datasets.command("list")
def list_(api_url: ApiUrl = URL, api_key: ApiKey = "") -> None:
    """Your datasets: id, name, rows, size, fields."""
    from sdk.cli import _call

    for ds in _call(api_url, api_key, lambda client: client.list_datasets()):
        typer.echo(f"{ds.id}  {ds.name}  {ds.rows} rows  {ds.size_bytes} B  {','.join(ds.fields)}")


@datasets.command("delete")
def delete(dataset_id: str, api_url: ApiUrl = URL, api_key: ApiKey = "") -> None:
    """Delete a dataset (refused while a queued or running run uses it)."""
    from sdk.cli import _call

    _call(api_url, api_key, lambda client: client.delete_dataset(dataset_id))
    typer.echo(f"{dataset_id}  deleted")
