"""``rlaas download RUN``: a checkpoint of a run as a Hugging Face model or a PEFT adapter,
or (``--tensorboard``) the run's TensorBoard event files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEFAULT_API_URL = "http://127.0.0.1:8000"


def download(
    run_id: str,
    step: Annotated[
        int | None, typer.Option(help="The checkpoint's step; default: the newest.")
    ] = None,
    format: Annotated[
        str,
        typer.Option(
            "--format", help="hf: the model, LoRA merged; peft: a LoRA run's adapter alone."
        ),
    ] = "hf",
    out: Annotated[
        Path | None,
        typer.Option(
            "-o", "--out", help="Folder to fill; default ./RUN-step-N-FORMAT (./RUN-tensorboard)."
        ),
    ] = None,
    tensorboard: Annotated[
        bool,
        typer.Option(
            "--tensorboard", help="The run's TensorBoard event files instead of a checkpoint."
        ),
    ] = False,
    api_url: Annotated[
        str, typer.Option(envvar="RLAAS_API_URL", help="Control plane base URL.")
    ] = DEFAULT_API_URL,
    api_key: Annotated[str, typer.Option(envvar="RLAAS_API_KEY", help="Your API key.")] = "",
) -> None:
    """Download a checkpoint of RUN (or its TensorBoard files) into a folder; prints it."""
    from sdk.client import Client, RlaasError

    if format not in ("hf", "peft"):
        typer.secho(f"--format {format!r}: use hf or peft", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    if not api_key:
        typer.secho(
            "no API key: pass --api-key or set RLAAS_API_KEY", fg=typer.colors.RED, err=True
        )
        raise typer.Exit(2)
    with Client(api_url, api_key) as client:
        try:
            if tensorboard:
                folder = client.download_tensorboard(run_id, out=out)
            else:
                folder = client.download_checkpoint(run_id, step, format=format, out=out)
        except RlaasError as exc:
            typer.secho(str(exc), fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
    typer.echo(str(folder))
