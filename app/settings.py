"""Control-plane settings, from ``RLAAS_*`` environment variables.

Unset database and broker URLs mean the embedded default: SQLite files and a
server-less broker under ``RLAAS_DATA_DIR``. There the shared worker token is on: a
missing one is generated once and left in the data folder for local workers. On a
database server each worker enrols with a credential of its own (``rlaas workers
issue``) and the shared token is off unless the operator keeps it on
(``RLAAS_ALLOW_SHARED_WORKER_TOKEN=1``, which then needs ``RLAAS_WORKER_TOKEN``: never
a guessable default).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.routing import Routes
from app.services.crash_loop import Policy


class SettingsError(RuntimeError):
    """A setting is missing or unsafe; the message says which and what to set."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLAAS_", extra="ignore", populate_by_name=True)

    data_dir: Path = Field(default_factory=lambda: Path("~/.rlaas").expanduser())
    database_url: str | None = None
    broker_url: str | None = None
    worker_token: str | None = None
    # The token every worker shared before each enrolled (app.services.worker_credentials),
    # deprecated: any holder claims any queued run and receives its environment secret, and
    # it cannot be revoked for one worker. Unset: on for the embedded default (its token file,
    # no setup), off on a database server. On, its use logs a deprecation warning.
    allow_shared_worker_token: bool | None = None
    secret_key: str | None = None
    # Keys RLAAS_SECRET_KEY replaced, comma-separated: secrets sealed under them still
    # open until `rlaas secrets reseal` has sealed them under the current key.
    old_secret_keys: str | None = None
    # Where runs are sent (app.routing, docs/accelerators.md): the accelerators this
    # deployment offers and the Celery queue of each, "cpu=rlaas-cpu,gpu=rlaas-gpu", and
    # the one a spec that names none goes to (unset: the first listed). Unset queues:
    # RLAAS_TASK_QUEUE (default "cpu") is the one queue, as before runs named one.
    queues: str | None = None
    default_accelerator: str | None = None
    task_queue: str | None = None
    # The queue checkpoint servers are asked for on (docs/serving.md): the workers started
    # with `rlaas worker --serve` (or --queue serve) take it.
    serve_queue: str = "serve"
    # The Tinker-compatible API (docs/tinker.md): the model worker its calls go to
    # (`python -m worker.tinker_server`), the secret it takes, and the base models offered.
    tinker_worker_url: str | None = None
    tinker_worker_token: str | None = None
    tinker_bases: str = "builtin:tiny"
    # retrieve_future holds a poll this long before answering try_again (the SDK reads
    # for 45 s): lower it behind a proxy that cuts idle requests sooner.
    tinker_long_poll_s: float = 30.0
    # Limits a tenant reads at GET /v1/limits (app.services.tinker_limits), each answered
    # 429 with Retry-After, which the SDK waits out and retries; 0 turns one off. LoRA
    # models a tenant holds on one base (a slot frees when one is unloaded); work calls
    # (create_model, forward_backward, optim_step, save, sample, unload) not yet finished;
    # and tokens a minute: a forward/forward_backward's input tokens, a sample's prompt
    # plus max_tokens times num_samples (a bucket, burst = this, refilled continuously).
    tinker_max_models_per_base: int = Field(default=16, ge=0)
    tinker_max_calls_in_flight: int = Field(default=256, ge=0)
    tinker_tokens_per_minute: int = Field(default=5_000_000, ge=0)
    reaper_interval_s: float = 5.0
    # At startup the objects alive then (modules, the app, the engine) are collected once
    # and frozen out of the cyclic collector's passes (app.main.lifespan). Off: a process
    # that starts many apps (the tests), where each start's full collection walks a heap
    # that JAX and the frameworks made large (0.15-0.5 s a start).
    gc_freeze: bool = True
    # A run still queued this long after it was sent to the broker is sent again.
    redispatch_after_s: float = 300.0
    # A run still queued this long after it entered the queue (no worker took it) fails with
    # a reason, and stops counting against its tenant's runs in flight; 0 turns it off.
    max_queued_s: float = 86_400.0
    # GET /metrics (Prometheus) asks for "Authorization: Bearer <this>"; unset, it answers
    # loopback clients only: a scraper on the same host. Behind a reverse proxy on the
    # same host that does not pass the client's address on, every client is loopback:
    # set the token there.
    metrics_token: str | None = None
    # What the reaper does with a run whose worker died (app.services.crash_loop): this
    # many attempts in a row that made no progress (no checkpoint, no step further than
    # before) fail it as a crash loop (RLAAS_MAX_ATTEMPTS, its name before, still read)...
    crash_loop_attempts: int = Field(
        default=3,
        ge=1,
        validation_alias=AliasChoices("RLAAS_CRASH_LOOP_ATTEMPTS", "RLAAS_MAX_ATTEMPTS"),
    )
    # ... and a run gets at most this many attempts in all, progress or not (0: no bound).
    run_attempt_budget: int = Field(default=20, ge=0)
    # A run taken from its worker is queued again this long after its lease expired,
    # doubled for each attempt in a row without progress, up to the max.
    requeue_backoff_s: float = Field(default=5.0, ge=0)
    requeue_backoff_max_s: float = Field(default=300.0, ge=0)
    # Seconds of quiet before a metrics stream sends a keep-alive comment.
    stream_keepalive_s: float = 15.0
    # A stream's feed reads the database this often even without a note (a lost NOTIFY).
    stream_resync_s: float = 5.0
    # Webhook URLs a tenant may register (app.urlcheck documents the entries). Unset:
    # "public" on a server; "public,loopback" on the embedded default.
    env_url_allowlist: str | None = None
    # Per-tenant quota defaults (tenants.quota_* override them, app.services.quotas applies them).
    quota_runs_in_flight: int = 10
    quota_requests_per_minute: int = 1200
    quota_body_bytes: int = 1_048_576
    # The compute budget (app.services.budget): run-seconds (seconds a run holds a worker)
    # per rolling period, checked at submit; unset, no budget. And the most train.steps
    # one run may ask for; unset, only the spec's own bound.
    quota_run_seconds: int | None = None
    quota_run_seconds_period_s: int = 86_400
    quota_train_steps: int | None = None
    # The worker's batches (metrics, spans, trajectories) are bigger than anything a client sends.
    internal_body_bytes: int = 64 * 1_048_576
    runs_in_flight_retry_after_s: int = 30
    # How often a long-poll for an environment callback looks at the database, for the
    # callbacks that arrived at another API process.
    callback_poll_s: float = 1.0
    # A deferred result is taken only while the worker awaits its step (its long-poll for
    # it). The environment's post can beat the worker's first poll (it follows the 202 at
    # once), so a post for a step not yet awaited is held this long for the poll; a
    # long-poll also keeps its step awaited this long past its end, for the next one.
    callback_await_grace_s: float = 10.0
    # Callback rows nobody has awaited for this long are swept (the reaper's pass); a run
    # that no longer runs loses its rows at once. Until then a repeated post is told 409.
    callback_retention_s: float = 600.0
    # The callback route takes no API key, so its rate is limited per source address
    # (an IPv6 address by its /64): a token bucket, burst = this, per API process. Behind
    # a reverse proxy, run uvicorn with --proxy-headers and --forwarded-allow-ips so that
    # the address is the client's, not the proxy's.
    callback_requests_per_minute: int = 1200
    # What a session's model call costs of its tenant's requests_per_minute: an agent's
    # run calls the model far more often than a client calls the control plane, so at
    # 0.1 the default 1,200 requests a minute are 12,000 session calls (200 a second).
    session_call_cost: float = Field(default=0.1, ge=0.0, le=1.0)
    # Uploaded datasets (POST /v1/datasets, app.services.datasets): the largest file, the
    # most rows and the longest line one upload may have, and the bytes of datasets a
    # tenant may keep (tenants share the data folder's disk).
    dataset_max_bytes: int = 256 * 1_048_576
    dataset_max_rows: int = 1_000_000
    dataset_max_line_bytes: int = 1_048_576
    quota_dataset_bytes: int = 1_073_741_824
    # Uploaded PEFT adapters (POST /v1/adapters): the largest upload (a tar of the two
    # files; a SmolLM2-135M rank-8 adapter is 7.4 MB, a 7B model's rank 64 some 640 MB).
    adapter_max_bytes: int = 1_073_741_824
    # Bytes a tenant's stored artifacts may take: its runs' kept checkpoints and exports
    # (as their workers measure them) and its uploaded adapters (GET /v1/limits).
    quota_artifact_bytes: int = 100 * 1_073_741_824
    log_json: bool = True
    # The runs' artifacts folder the workers write (RLAAS_ARTIFACTS_PATH as theirs; default
    # <data dir>/artifacts): checkpoint exports are streamed from it, so a deployment
    # without an artifact store mounts the workers' volume here too (docker/compose.yaml).
    artifacts_path: Path | None = None
    # The artifact store the workers upload to (docs/storage.md; the same value as theirs:
    # s3://bucket/prefix with AWS_* credentials, RLAAS_S3_ENDPOINT for an S3-compatible
    # server): exports are streamed from it instead of the artifacts folder.
    artifact_store: str | None = None
    s3_endpoint: str | None = None

    def artifacts_dir(self) -> Path:
        return self.artifacts_path or self.data_dir / "artifacts"

    @field_validator("artifact_store")
    @classmethod
    def _store_url_parses(cls, value: str | None) -> str | None:
        from rl_core.store import store_setting

        return store_setting(value)  # a bad URL stops start-up, naming the setting

    @model_validator(mode="after")
    def _tinker_worker_has_its_secret(self) -> Settings:
        # Without it every call would go out with an empty bearer, which the worker (and
        # HTTP itself) refuses with a message that names neither setting.
        if self.tinker_worker_url and not self.tinker_worker_token:
            raise ValueError(
                "RLAAS_TINKER_WORKER_URL is set but RLAAS_TINKER_WORKER_TOKEN is not: set it "
                "to the secret the worker was started with (its RLAAS_TINKER_WORKER_TOKEN)"
            )
        return self

    @model_validator(mode="after")
    def _routes_parse(self) -> Settings:
        # At start-up, so a typo in the queues stops the API with the variable named
        # instead of sending runs where no worker listens.
        routes = self.routes()
        if self.serve_queue in (o.queue for o in routes.offers):
            raise ValueError(
                f"RLAAS_SERVE_QUEUE {self.serve_queue!r} is also a run queue; checkpoint "
                "servers need a queue of their own (docs/serving.md)"
            )
        return self

    def routes(self) -> Routes:
        """Which queue each accelerator's runs go to (`app.routing`)."""
        return Routes.parse(self.queues, self.task_queue, self.default_accelerator)

    def requeue_policy(self) -> Policy:
        return Policy(
            crash_loop_attempts=self.crash_loop_attempts,
            attempt_budget=self.run_attempt_budget,
            backoff_s=self.requeue_backoff_s,
            backoff_max_s=self.requeue_backoff_max_s,
        )

    @property
    def embedded(self) -> bool:
        return self.database_url is None or self.database_url.startswith("sqlite")

    def prepare_data_dir(self) -> None:
        """Make the data folder when an embedded default (SQLite file, broker file) lives there."""
        if self.embedded or self.broker_url is None:
            self.data_dir.mkdir(parents=True, exist_ok=True)

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / 'rlaas.db'}"

    def resolved_broker_url(self) -> str:
        if self.broker_url:
            return self.broker_url
        return f"sqla+sqlite:///{self.data_dir / 'broker.db'}"

    @property
    def shared_worker_token_allowed(self) -> bool:
        if self.allow_shared_worker_token is None:
            return self.embedded
        return self.allow_shared_worker_token

    def resolved_worker_token(self) -> str | None:
        """The shared worker token, or None where it is not accepted."""
        if not self.shared_worker_token_allowed:
            return None
        if self.worker_token:
            return self.worker_token
        if not self.embedded:
            raise SettingsError(
                "RLAAS_WORKER_TOKEN must be set when the shared worker token is on "
                "(RLAAS_ALLOW_SHARED_WORKER_TOKEN) and RLAAS_DATABASE_URL points at a server; "
                "better, turn it off and enrol each worker: `rlaas workers issue NAME`"
            )
        token_file = self.data_dir / "worker_token"
        if token_file.exists():
            return token_file.read_text(encoding="utf-8").strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        token_file.write_text(token + "\n", encoding="utf-8")
        token_file.chmod(0o600)
        return token

    def resolved_old_secret_keys(self) -> list[str]:
        return [k.strip() for k in (self.old_secret_keys or "").split(",") if k.strip()]

    def resolved_secret_key(self) -> str:
        """The key that encrypts environment secrets; made once on the embedded default."""
        if self.secret_key:
            return self.secret_key
        if not self.embedded:
            raise SettingsError(
                "RLAAS_SECRET_KEY must be set when RLAAS_DATABASE_URL points at a server; "
                "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        key_file = self.data_dir / "secret_key"
        if key_file.exists():
            return key_file.read_text(encoding="utf-8").strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(32)
        key_file.touch(mode=0o600)
        key_file.write_text(key + "\n", encoding="utf-8")
        return key
