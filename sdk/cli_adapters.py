"""``rlaas adapters``: upload, list and delete your PEFT adapters over the HTTP API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

adapters = typer.Typer(
    help="PEFT LoRA adapters to start runs from (model.lora.init_from: adapter:<id>).",
    no_args_is_help=True,
)

ApiUrl = Annotated[str, typer.Option(envvar="RLAAS_API_URL", help="Control plane base URL.")]
ApiKey = Annotated[str, typer.Option(envvar="RLAAS_API_KEY", help="Your API key.")]
URL = "http://127.0.0.1:8000"


@adapters.command("upload")
def upload(
    folder: Annotated[Path, typer.Argument(exists=True, file_okay=False, readable=True)],
    name: Annotated[str | None, typer.Option(help="Default: the folder's name.")] = None,
    api_url: ApiUrl = URL,
    api_key: ApiKey = "",
) -> None:
    """Upload a PEFT adapter folder; prints its id (for model.lora.init_from: adapter:<id>)."""
    from sdk.cli import _call

    ad = _call(api_url, api_key, lambda client: client.upload_adapter(folder, name=name))
    typer.echo(f"{ad.name}: rank {ad.rank}, alpha {ad.alpha:g}, targets {ad.targets}", err=True)
    typer.echo(ad.id)


@adapters.command("list")
def list_(api_url: ApiUrl = URL, api_key: ApiKey = "") -> None:
    """Your adapters: id, name, rank, alpha, targets, size."""
    from sdk.cli import _call

    for ad in _call(api_url, api_key, lambda client: client.list_adapters()):
        typer.echo(
            f"{ad.id}  {ad.name}  r={ad.rank}  alpha={ad.alpha:g}  {','.join(ad.targets)}  "
            f"{ad.size_bytes} B"
        )


@adapters.command("delete")
def delete(adapter_id: str, api_url: ApiUrl = URL, api_key: ApiKey = "") -> None:
    """Delete an adapter (refused while a queued or running run starts from it)."""
    from sdk.cli import _call

    _call(api_url, api_key, lambda client: client.delete_adapter(adapter_id))
    typer.echo(f"{adapter_id}  deleted")
