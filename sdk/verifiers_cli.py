"""``rlaas verifiers run``: play a verifiers environment's rollouts on a ``sessions`` run.

A sub-app of its own (``sdk.cli`` adds it): parse, call `sdk.verifiers_driver.drive`,
render. verifiers is imported only when the command runs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from sdk.errors import RlaasError

verifiers_cli = typer.Typer(
    help="verifiers environments: their rollouts and rubric train a sessions run.",
    no_args_is_help=True,
)


@verifiers_cli.command("run")
def verifiers_run(
    env: Annotated[
        str,
        typer.Option(help="MODULE:FUNC returning a vf.Environment, or an installed env's id."),
    ],
    run: Annotated[str | None, typer.Option(help="A sessions run of the service (its id).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Or a local run: the --out folder of `rlaas train`.")
    ] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE for the environment's loader (VALUE read as JSON if it is)."),
    ] = None,
    group_size: Annotated[
        int | None,
        typer.Option(help="Sessions per prompt; default: the run's rollout.group_size."),
    ] = None,
    rollouts: Annotated[
        int | None, typer.Option(help="Stop after this many; default: until the run ends.")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Rollouts in flight.")] = 8,
    examples: Annotated[int, typer.Option(help="The dataset's first N prompts; -1: all.")] = -1,
    model: Annotated[
        str, typer.Option(help="The model name sent (the run serves one).")
    ] = "policy",
    api_url: Annotated[str, typer.Option(envvar="RLAAS_API_URL")] = "http://127.0.0.1:8000",
    api_key: Annotated[str, typer.Option(envvar="RLAAS_API_KEY")] = "",
) -> None:
    """Play ``--env``'s rollouts on a sessions run, each ended with its rubric's reward."""
    from sdk.sessions import SessionGateway
    from sdk.verifiers_driver import drive, load

    if (run is None) == (out is None):
        _fail("name one run: --run RUN_ID (a run of the service) or --out DIR (rlaas train's)")
    try:
        if run is not None:
            if not api_key:
                _fail("no API key: pass --api-key or set RLAAS_API_KEY")
            gateway = SessionGateway.for_run(api_url, api_key, run)
            size = group_size or _run_group_size(api_url, api_key, run)
        else:
            assert out is not None
            gateway = SessionGateway.from_folder(out)
            size = group_size or 8
        environment = load(env, _args(arg or []))
        played = asyncio.run(
            drive(
                gateway,
                environment,
                group_size=size,
                rollouts=rollouts,
                concurrency=concurrency,
                examples=examples,
                model=model,
                on_played=lambda p: typer.echo(
                    json.dumps({"session": p.session_id, "reward": p.reward, "error": p.error}),
                    err=True,
                ),
            )
        )
    except RlaasError as exc:
        _fail(str(exc))
    ended = [p.reward for p in played if p.reward is not None]
    summary = {
        "rollouts": len(played),
        "ended": len(ended),
        "cancelled": len(played) - len(ended),
        "reward_mean": sum(ended) / len(ended) if ended else None,
    }
    typer.echo(json.dumps(summary, indent=2))


def _run_group_size(api_url: str, api_key: str, run_id: str) -> int:
    from sdk.client import Client

    with Client(api_url, api_key) as client:
        spec: dict[str, Any] = client.get_run(run_id).raw.get("spec") or {}
    if spec.get("environment", {}).get("name") != "sessions":
        raise RlaasError(f"run {run_id} is not a sessions run (environment.name: sessions)")
    return int(spec.get("rollout", {}).get("group_size", 8))


def _args(pairs: list[str]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            _fail(f"--arg {pair!r}: write KEY=VALUE")
        try:
            args[key] = json.loads(value)
        except ValueError:
            args[key] = value
    return args


def _fail(message: str) -> NoReturn:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


__all__ = ["verifiers_cli"]
