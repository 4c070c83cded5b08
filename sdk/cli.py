"""The ``rlaas`` command line.

Each command parses its arguments, calls one function and renders the result.
Heavy imports (the control plane, Celery, JAX) happen inside the command that
needs them, so ``rlaas --help`` is instant and a client-only install works.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from rl_core.spec import SpecError, load_spec
from sdk.cli_adapters import adapters as adapters_cli
from sdk.cli_datasets import datasets as datasets_cli
from sdk.cli_download import download
from sdk.cli_tenants import tenants_cli
from sdk.cli_workers import workers_cli
from sdk.verifiers_cli import verifiers_cli

if TYPE_CHECKING:
    from sdk.client import Client

cli = typer.Typer(help="rlaas: RL-as-a-service for agentic LLMs.", no_args_is_help=True)
runs = typer.Typer(help="Submit and follow runs over the HTTP API.", no_args_is_help=True)
cli.add_typer(tenants_cli, name="tenants")  # sdk/cli_tenants.py
secrets_cli = typer.Typer(
    help="Stored secrets: re-encrypt after a key rotation (talks to the database directly).",
    no_args_is_help=True,
)
cli.add_typer(secrets_cli, name="secrets")
cli.add_typer(workers_cli, name="workers")  # sdk/cli_workers.py
cli.add_typer(runs, name="runs")
envs = typer.Typer(
    help="Webhook environments: serve one, register it, list, check, delete.",
    no_args_is_help=True,
)
cli.add_typer(envs, name="env")
keys = typer.Typer(help="Your API keys over the HTTP API: rotate, revoke.", no_args_is_help=True)
cli.add_typer(keys, name="keys")
cli.add_typer(datasets_cli, name="datasets")
cli.add_typer(adapters_cli, name="adapters")
cli.add_typer(verifiers_cli, name="verifiers")  # sdk/verifiers_cli.py
cli.command("download")(download)  # sdk/cli_download.py

ApiUrl = Annotated[str, typer.Option(envvar="RLAAS_API_URL", help="Control plane base URL.")]
ApiKey = Annotated[str, typer.Option(envvar="RLAAS_API_KEY", help="Your API key.")]


def main() -> None:
    cli()


def _fail(message: str) -> NoReturn:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@cli.command()
def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = typer.Option(1, help="API processes (uvicorn workers)."),
) -> None:
    """Run the control plane (FastAPI under uvicorn)."""
    import uvicorn

    uvicorn.run("app.main:app", host=host, port=port, workers=workers, log_level="info")


def _use_compilation_cache() -> None:
    """XLA's compiled programs on disk, shared by this machine's runs (rl_core.host.compile_cache):
    ``RLAAS_JAX_CACHE_PATH``, default ``~/.cache/rlaas/jax``; ``off`` compiles every run afresh."""
    from rl_core.host.compile_cache import folder_of, use_compilation_cache

    use_compilation_cache(folder_of(os.environ.get("RLAAS_JAX_CACHE_PATH")))


@cli.command()
def worker(
    queue: Annotated[
        str,
        typer.Option(
            envvar="RLAAS_QUEUE",
            help="the queue of this worker's accelerator, as the API's RLAAS_QUEUES names it "
            "(docs/accelerators.md)",
        ),
    ] = "cpu",
    loglevel: str = "INFO",
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="also serve checkpoints (the serve queue, RLAAS_SERVE_QUEUE; docs/serving.md)",
        ),
    ] = False,
) -> None:
    """Run a Celery worker that executes runs: one at a time on a solo pool (JAX must not
    be forked), or RLAAS_RUNS_PER_WORKER at once on threads (docs/shared-base.md)."""
    from rl_core.host.memory import limit_malloc_arenas
    from worker.celery_app import app as celery_app
    from worker.settings import WorkerSettings

    runs = WorkerSettings().runs_per_worker
    pool = ["--pool", "solo", "--concurrency", "1"]
    if runs > 1:
        pool = ["--pool", "threads", "--concurrency", str(runs)]

    limit_malloc_arenas()  # before any thread starts: see rl_core.host.memory
    _use_compilation_cache()
    queues = f"{queue},{os.environ.get('RLAAS_SERVE_QUEUE', 'serve')}" if serve else queue
    celery_app.worker_main(["worker", *pool, "-Q", queues, "--loglevel", loglevel])


@cli.command()
def migrate() -> None:
    """Bring the database schema up to date (Alembic upgrade head)."""
    from app.admin import migrate as run_migrations
    from app.settings import Settings

    run_migrations(Settings())
    typer.echo("database is at the newest schema")


@secrets_cli.command("reseal")
def secrets_reseal() -> None:
    """Seal every stored secret under RLAAS_SECRET_KEY (after a rotation: the old key in
    RLAAS_OLD_SECRET_KEYS). Drop the old key once this reports nothing unreadable."""
    from app.admin import reseal_secrets
    from app.settings import Settings

    report = asyncio.run(reseal_secrets(Settings()))
    typer.echo(f"resealed {report.resealed}, already under the current key {report.current}")
    if report.unreadable:
        _fail(
            f"{len(report.unreadable)} secrets open under no key given (left as they were): "
            f"{', '.join(report.unreadable[:10])}; set the key they were sealed with in "
            "RLAAS_OLD_SECRET_KEYS and run this again"
        )


@runs.command("create")
def runs_create(
    spec_path: Path, api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = ""
) -> None:
    """Submit a spec file as a new run; prints the run id."""
    from sdk.client import Client, RlaasError

    spec = _load(spec_path)
    with Client(api_url, _need_key(api_key)) as client:
        try:
            run = client.create_run(spec)
        except RlaasError as exc:
            _fail(str(exc))
    typer.echo(run.id)


@runs.command("list")
def runs_list(
    status: str | None = None, api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = ""
) -> None:
    """List your runs, newest first."""
    from sdk.client import Client, RlaasError

    with Client(api_url, _need_key(api_key)) as client:
        try:
            for run in client.iter_runs(status=status):
                step = f"{run.current_step}/{run.total_steps or '?'}"
                typer.echo(f"{run.id}  {run.status:<10} step {step:<9} {run.name or ''}")
        except RlaasError as exc:
            _fail(str(exc))


@runs.command("watch")
def runs_watch(
    run_id: str, api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = ""
) -> None:
    """Show a run's live metrics until it ends; exit 0 succeeded, 1 failed, 3 cancelled.

    Over the run's live stream; a dropped connection is resumed where it broke.
    """
    from sdk.client import Client, RlaasError
    from sdk.follow import EXIT_CODES, follow_run

    with Client(api_url, _need_key(api_key)) as client:
        try:
            run = follow_run(client, run_id)
        except RlaasError as exc:
            _fail(str(exc))
    raise typer.Exit(EXIT_CODES.get(run.status, 1))


@runs.command("cancel")
def runs_cancel(
    run_id: str, api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = ""
) -> None:
    """Ask a run to stop at its next step boundary."""
    from sdk.client import Client, RlaasError

    with Client(api_url, _need_key(api_key)) as client:
        try:
            run = client.cancel(run_id)
        except RlaasError as exc:
            _fail(str(exc))
    typer.echo(f"{run.id}  {run.status}")


@runs.command("delete-artifacts")
def runs_delete_artifacts(
    run_id: str, api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = ""
) -> None:
    """Delete a finished run's checkpoints and exports, freeing storage quota."""
    freed = _call(api_url, api_key, lambda client: client.delete_artifacts(run_id))
    typer.echo(f"{run_id}  freed {freed} bytes")


@keys.command("list")
def keys_list(api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = "") -> None:
    """Your tenant's keys (never their secrets)."""
    for k in _call(api_url, api_key, lambda client: client.list_keys()):
        state = f"revoked {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "active"
        typer.echo(f"{k.id}  rlaas_{k.prefix}_…  {state}")


@keys.command("create")
def keys_create(api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = "") -> None:
    """A new key (printed once). To rotate: create, switch to it, revoke the old one."""
    created = _call(api_url, api_key, lambda client: client.create_key())
    typer.echo(f"key {created.id}", err=True)
    typer.echo(created.key)


@keys.command("revoke")
def keys_revoke(
    key_id: str, api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = ""
) -> None:
    """Revoke a key by its id (from `rlaas keys list`)."""
    revoked = _call(api_url, api_key, lambda client: client.revoke_key(key_id))
    typer.echo(f"{revoked.id}  revoked")


T = TypeVar("T")


def _call(api_url: str, api_key: str, call: Callable[[Client], T]) -> T:
    """``call`` with a client of the API; an API error ends the command with its message."""
    from sdk.client import Client, RlaasError

    with Client(api_url, _need_key(api_key)) as client:
        try:
            return call(client)
        except RlaasError as exc:
            _fail(str(exc))


@cli.command()
def train(
    spec_path: Path,
    out: Annotated[
        Path,
        typer.Option(
            help="Folder for metrics.jsonl, timeline.json, trajectories.jsonl and checkpoints/."
        ),
    ] = Path("rlaas-out"),
    resume: Annotated[
        bool, typer.Option(help="Continue from the newest checkpoint under --out.")
    ] = False,
    sessions_host: Annotated[
        str, typer.Option(help="environment 'sessions': the address the session gateway binds.")
    ] = "127.0.0.1",
    sessions_port: Annotated[
        int, typer.Option(help="environment 'sessions': its port (0: any free one).")
    ] = 0,
) -> None:
    """Run a whole training job locally, with no server (Ctrl-C stops at a step boundary).

    A spec whose environment is ``sessions`` is played by your own agent: the run serves
    an OpenAI-compatible session gateway and writes its URL and token to
    ``--out/sessions.json`` (docs/sessions.md).
    """
    from rl_core.host.memory import limit_malloc_arenas
    from rl_core.pipeline.runner import train_to_folder

    limit_malloc_arenas()
    _use_compilation_cache()
    spec = _load(spec_path)
    if spec.environment.name == "code_exec":
        _warn_of_a_weak_sandbox()
    gateway = _session_gateway(out, sessions_host, sessions_port)
    result = train_to_folder(spec, out, resume=resume, gateway=gateway)
    typer.echo(json.dumps({"steps": result.steps_completed, **result.final_metrics}, indent=2))


def _warn_of_a_weak_sandbox() -> None:
    """Your own machine may run your model's code behind a weaker wall than bubblewrap
    (rl_core.envs.walls.SINGLE_USER); say so before it does (each episode's info says it too)."""
    from rl_core.envs.walls import SINGLE_USER, assess

    report = assess(SINGLE_USER)
    if report.weak:
        typer.secho(f"warning: {report.message}", fg=typer.colors.YELLOW, err=True)


def _session_gateway(out: Path, host: str, port: int) -> Any:
    """Serves a sessions run's gateway and tells where: sessions.json (owner-only), there
    for as long as the run serves."""
    import contextlib
    import secrets

    from worker.gateway import serve_gateway

    @contextlib.asynccontextmanager
    async def serving(broker: Any) -> Any:
        token = secrets.token_urlsafe(24)
        async with serve_gateway(broker, token=token, host=host, port=port) as url:
            where = out / "sessions.json"
            where.parent.mkdir(parents=True, exist_ok=True)
            where.touch(mode=0o600)
            where.write_text(json.dumps({"url": url, "token": token}) + "\n")
            typer.echo(f"sessions: POST {url}/v1/sessions, token in {where}", err=True)
            try:
                yield url
            finally:
                where.unlink(missing_ok=True)  # no longer served: clients can tell

    return serving


@cli.command()
def quickstart(
    exit_when_done: Annotated[
        bool, typer.Option(help="Exit once the demo run ends (0 if it succeeded).")
    ] = False,
    port: int = 8000,
    data_dir: Annotated[Path | None, typer.Option(envvar="RLAAS_DATA_DIR")] = None,
    spec: Annotated[Path | None, typer.Option(help="Run this spec instead of the demo.")] = None,
) -> None:
    """Start everything on this machine and train a demo agent that visibly learns."""
    from sdk.quickstart import run_quickstart

    folder = (data_dir or Path("~/.rlaas")).expanduser()
    job = _load(spec).model_dump(mode="json") if spec else None
    try:
        code = run_quickstart(folder, port=port, exit_when_done=exit_when_done, spec=job)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


@envs.command("serve")
def env_serve(
    target: Annotated[str, typer.Argument(help="MODULE:CLASS of an rl_core Environment.")],
    host: str = "127.0.0.1",
    port: int = 9000,
    secret_env: Annotated[
        str, typer.Option(help="Environment variable holding the webhook secret.")
    ] = "RLAAS_ENV_SECRET",
    callback_url: Annotated[
        str | None, typer.Option(help="Where deferred results go: <api>/v1/env-callbacks.")
    ] = None,
    defer_after: Annotated[
        float | None, typer.Option(help="Answer 202 for steps slower than this (seconds).")
    ] = None,
) -> None:
    """Serve an Environment class over the webhook protocol, verifying signatures."""
    import os

    try:
        from sdk.envserver import serve as serve_env
    except ImportError as exc:
        _fail(f"rlaas env serve needs the envserver extra (pip install 'rlaas[envserver]'): {exc}")

    secret = os.environ.get(secret_env, "")
    if len(secret) < 16:
        _fail(f"set {secret_env} to the environment's secret (at least 16 characters)")
    try:
        serve_env(
            target,
            secret=secret,
            host=host,
            port=port,
            callback_url=callback_url,
            defer_after_s=defer_after,
        )
    except ValueError as exc:
        _fail(str(exc))


@envs.command("register")
def env_register(
    name: Annotated[str, typer.Argument(help="A name of yours for it: letters, digits, . _ -")],
    url: Annotated[str, typer.Argument(help="Base URL: rlaas POSTs {url}/reset, /step, /close.")],
    secret_env: Annotated[
        str,
        typer.Option(
            help="Environment variable holding the secret (16+ characters); unset: one is "
            "made and printed once."
        ),
    ] = "RLAAS_ENV_SECRET",
    timeout_s: Annotated[float, typer.Option(help="One request's timeout (seconds).")] = 30.0,
    max_concurrency: Annotated[int, typer.Option(help="Requests in flight to it at most.")] = 16,
    api_url: ApiUrl = "http://127.0.0.1:8000",
    api_key: ApiKey = "",
) -> None:
    """Register a webhook environment (POST /v1/environments); prints its id, the spec's
    environment.name, and the secret when it made one (shown once: keep it)."""
    import secrets

    secret = os.environ.get(secret_env, "")
    made = not secret
    if made:
        secret = secrets.token_urlsafe(32)
    elif len(secret) < 16:
        _fail(f"{secret_env} holds {len(secret)} characters; a secret needs at least 16")
    env = _call(
        api_url,
        api_key,
        lambda client: client.register_environment(
            name, url, secret, timeout_s=timeout_s, max_concurrency=max_concurrency
        ),
    )
    typer.echo(f"environment {env.name} at {env.url}: use environment.name: {env.id}", err=True)
    typer.echo(env.id)
    if made:
        typer.echo(
            f"secret made for it (shown once; your server verifies with it, e.g. "
            f"export {secret_env}=...):",
            err=True,
        )
        typer.echo(secret)


@envs.command("list")
def env_list(api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = "") -> None:
    """Your registered environments (never their secrets)."""
    for env in _call(api_url, api_key, lambda client: client.list_environments()):
        typer.echo(
            f"{env.id}  {env.name}  {env.url}  timeout_s={env.timeout_s:g} "
            f"max_concurrency={env.max_concurrency}"
        )


@envs.command("check")
def env_check(
    environment_id: str, api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = ""
) -> None:
    """Have the control plane call its /reset and /close once, signed; exit 1 if it failed."""
    check = _call(api_url, api_key, lambda client: client.check_environment(environment_id))
    for call in check.calls:
        status = call.status_code if call.status_code is not None else "no answer"
        verdict = "ok" if call.ok else f"FAILED: {call.error}"
        typer.echo(f"POST {call.path}  {status}  {call.duration_ms:.0f} ms  {verdict}")
    if not check.ok:
        typer.secho(f"check failed: {check.error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    typer.echo("ok")


@envs.command("delete")
def env_delete(
    environment_id: str, api_url: ApiUrl = "http://127.0.0.1:8000", api_key: ApiKey = ""
) -> None:
    """Delete a registered environment (refused while an unfinished run uses it)."""
    _call(api_url, api_key, lambda client: client.delete_environment(environment_id))
    typer.echo(f"{environment_id}  deleted")


def _load(path: Path):  # type: ignore[no-untyped-def]
    try:
        return load_spec(path)
    except FileNotFoundError:
        _fail(f"no spec file at {path}")
    except SpecError as exc:
        _fail(str(exc))


def _need_key(key: str) -> str:
    if not key:
        _fail(
            "no API key: pass --api-key or set RLAAS_API_KEY (rlaas tenants create NAME prints one)"
        )
    return key


if __name__ == "__main__":
    main()
