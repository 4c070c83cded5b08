"""The schema. Alembic owns it (``migrations/``); ``alembic check`` guards drift."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Per-tenant quota overrides; NULL means the deployment default from Settings.
    quota_runs_in_flight: Mapped[int | None] = mapped_column(Integer)
    quota_requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    quota_body_bytes: Mapped[int | None] = mapped_column(Integer)
    # Compute budget: run-seconds per period, and the most train.steps one run may ask for.
    quota_run_seconds: Mapped[int | None] = mapped_column(Integer)
    quota_train_steps: Mapped[int | None] = mapped_column(Integer)
    # Bytes all of the tenant's datasets may take (BigInteger: past 2 GiB is a fair ask).
    quota_dataset_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # Bytes the tenant's stored artifacts may take: its runs' kept checkpoints and exports
    # and its uploaded adapters.
    quota_artifact_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # The Tinker-compatible API's limits (app.services.tinker_limits); 0 turns one off for
    # this tenant, as the setting's 0 does for all.
    quota_tinker_models_per_base: Mapped[int | None] = mapped_column(Integer)
    quota_tinker_calls_in_flight: Mapped[int | None] = mapped_column(Integer)
    quota_tinker_tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    # When a worker last took one of this tenant's runs: the fair claim (app.services.fair)
    # serves the tenant waited on longest first.
    last_claim_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    # lazy="raise": an async session cannot load on attribute access; say so loudly.
    api_keys: Mapped[list[ApiKey]] = relationship(
        back_populates="tenant", lazy="raise", passive_deletes=True
    )


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys", lazy="raise")


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_runs_tenant_idempotency"),
        Index("ix_runs_tenant_created", "tenant_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The accelerator the run was admitted to (its spec's resources.accelerator, or the
    # deployment's default then): its queue, and the runs a fair claim chooses among
    # (app.routing). NULL: submitted before runs had one; the deployment's default.
    accelerator: Mapped[str | None] = mapped_column(String(16))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    # SHA-256 of the lease token the claim answered (app.security): the credential of the
    # run-scoped worker routes. Replaced by each claim, cleared when the lease ends.
    lease_token_hash: Mapped[str | None] = mapped_column(String(64))
    # The worker credential that made the newest claim (None: the shared token did), kept
    # after the lease ends so an operator sees which worker held the run; revoking the
    # credential ends the lease while it lasts (app.services.worker_credentials).
    lease_credential_id: Mapped[str | None] = mapped_column(
        ForeignKey("worker_credentials.id", ondelete="SET NULL"), index=True
    )
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    current_step: Mapped[int] = mapped_column(Integer, default=0)
    # The bytes its kept checkpoints and exports take, as its worker measured them after
    # its newest checkpoint (NULL: none reported yet).
    stored_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # The worker's newest InflightSnapshot (rl_core.records), sent with its heartbeat.
    inflight: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    inflight_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A profile asked for with POST /v1/runs/{id}/profile, handed out by the next heartbeat.
    profile_steps_requested: Mapped[int | None] = mapped_column(Integer)
    # A sessions run's gateway on the worker holding it (worker/gateway.py): where client
    # calls are proxied to, and its token, encrypted with RLAAS_SECRET_KEY.
    gateway_url: Mapped[str | None] = mapped_column(String(2048))
    gateway_token_encrypted: Mapped[str | None] = mapped_column(Text)
    # The attempt before's gateway token, kept at a claim: a call with a session key of
    # the attempt that died is told its session was lost (app/services/session_ends.py).
    gateway_token_previous_encrypted: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the run last entered queued (submitted, or re-queued by the reaper); not moved
    # by a redispatch, so the reaper can fail a run that waited past RLAAS_MAX_QUEUED_S.
    queued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    tenant: Mapped[Tenant] = relationship(lazy="raise")
    events: Mapped[list[RunEvent]] = relationship(
        back_populates="run", lazy="raise", order_by="RunEvent.id", passive_deletes=True
    )


class RequestBucket(Base):
    """A tenant's request-rate bucket, shared by every API process (app.services.rate):
    the theoretical arrival time of the next request (GCRA), in seconds since the epoch."""

    __tablename__ = "request_buckets"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    tat: Mapped[float] = mapped_column(Float)


class TinkerTokenBucket(Base):
    """A tenant's tokens-per-minute bucket of the Tinker-compatible API
    (``RLAAS_TINKER_TOKENS_PER_MINUTE``), kept as ``request_buckets`` is (app.services.rate)."""

    __tablename__ = "tinker_token_buckets"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    tat: Mapped[float] = mapped_column(Float)


class RunEvent(Base):
    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship(back_populates="events", lazy="raise")


class MetricPoint(Base):
    __tablename__ = "metric_points"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class StepUpdate(Base):
    """A policy update a worker applied: ``attempt`` trained ``step`` on the policy that
    ``base_attempt`` left at ``base_step``. One row per (run, step, attempt): a step trained
    again by a later attempt (after a resume from an earlier checkpoint) is a second row, and
    the final policy's lineage (``app.services.lineage``) says which one it holds."""

    __tablename__ = "step_updates"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    base_step: Mapped[int] = mapped_column(Integer)
    base_attempt: Mapped[int] = mapped_column(Integer)
    optimizer_updates: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class IngestBatch(Base):
    """One row per (run, kind, seq) stored: a retried batch finds its row and is skipped."""

    __tablename__ = "ingest_batches"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Span(Base):
    """One stage span (rl_core.records.Span) of a run's timeline."""

    __tablename__ = "spans"
    __table_args__ = (Index("ix_spans_run_start", "run_id", "start_us"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    track: Mapped[str] = mapped_column(String(300))
    step: Mapped[int] = mapped_column(Integer)
    start_us: Mapped[int] = mapped_column(BigInteger)
    dur_us: Mapped[int] = mapped_column(BigInteger)
    args: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Trajectory(Base):
    """A sampled trajectory (rl_core.records.TrajectoryRecord); ``record`` holds the whole JSON."""

    __tablename__ = "trajectories"
    __table_args__ = (Index("ix_trajectories_run_step", "run_id", "step", "id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    episode_id: Mapped[str] = mapped_column(String(300))
    policy_version: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float] = mapped_column(Float)
    end_state: Mapped[str] = mapped_column(String(16))
    record: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Artifact(Base):
    """A file a run wrote to storage: a checkpoint, a profiler trace, an export."""

    __tablename__ = "artifacts"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # checkpoint|profile|export
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    uri: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CheckpointServer(Base):
    """A run's checkpoint served for chat completions (app.services.serving): asked of a
    worker when ``url`` is NULL, answering at ``url`` once loaded; deleted when it stops."""

    __tablename__ = "checkpoint_servers"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_checkpoint_servers_run_step"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # srv_<hex>
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    token_encrypted: Mapped[str] = mapped_column(Text)  # what the worker's server takes
    url: Mapped[str | None] = mapped_column(String(2048))
    requested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)  # the worker could not load it: why


class Environment(Base):
    """A registered webhook environment. The secret is stored encrypted, never returned."""

    __tablename__ = "environments"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_environments_tenant_name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # env_<hex>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(Text)
    secret_encrypted: Mapped[str] = mapped_column(Text)
    timeout_s: Mapped[float] = mapped_column(Float)
    max_concurrency: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class EnvCallback(Base):
    """A deferred step, from the worker's first long-poll for it to its posted result.

    The worker's long-poll makes the row (``body`` NULL) and keeps ``awaited_until``
    ahead of now while it waits; only then is a result for ``(episode_id, step)``
    taken, once (``received_at``): results nobody awaits are refused, not stored.
    The reaper sweeps rows of runs that no longer run, and rows nobody has awaited
    for ``callback_retention_s``.
    """

    __tablename__ = "env_callbacks"

    episode_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    # Set with the result: the environment whose secret signed it.
    environment_id: Mapped[str | None] = mapped_column(
        ForeignKey("environments.id", ondelete="CASCADE")
    )
    # none_as_null: "no result yet" is SQL NULL, not the JSON document null.
    body: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    awaited_until: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    received_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WorkerReport(Base):
    """A worker's last word about itself: its queue and the sandbox wall it runs tenant
    code behind (sent at its start-up and with each claim; listed on ``/readyz``)."""

    __tablename__ = "worker_reports"

    worker_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    queue: Mapped[str | None] = mapped_column(String(200))
    sandbox_wall: Mapped[str] = mapped_column(String(16))
    tenant_code: Mapped[str] = mapped_column(String(24))
    reported_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WorkerCredential(Base):
    """A worker's own credential, issued by the operator (``rlaas workers issue``): it
    opens the claim and the worker's report. Only its SHA-256 is kept; revoked, never
    deleted, so that the runs' events keep naming it."""

    __tablename__ = "worker_credentials"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # wcr_<hex>
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16), unique=True)  # finds the row
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Moved at most once a minute (app.services.worker_credentials.TOUCH_EVERY_S).
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Dataset(Base):
    """An uploaded dataset (JSONL rows). Its content is a file in the data folder named by
    its SHA-256 (``app.services.datasets``); a run pins that hash at submit, so replacing
    the content under the same name never changes a run that was already submitted."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_datasets_tenant_name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # ds_<hex>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    format: Mapped[str] = mapped_column(String(16))  # as uploaded: jsonl, parquet
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(Integer)
    # The fields every row has (a prompt or answer must be one of them), sorted.
    fields: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UploadedAdapter(Base):
    """A PEFT LoRA adapter a tenant uploaded (POST /v1/adapters) to start runs from
    (``model.lora.init_from: adapter:<id>``). Its two files are a folder in the data folder
    (``app.services.adapters``); an upload is never changed, only deleted."""

    __tablename__ = "adapters"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # ad_<hex>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    rank: Mapped[int] = mapped_column(Integer)
    alpha: Mapped[float] = mapped_column(Float)
    targets: Mapped[list[str]] = mapped_column(JSON)  # rlaas's names (q, v, ...), sorted
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TinkerWorker(Base):
    """A model worker of the Tinker-compatible API (worker/tinker_server.py) that registered
    its URL (``POST /internal/tinker/workers``); its secret is stored encrypted."""

    __tablename__ = "tinker_workers"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # tw_<hex>
    url: Mapped[str] = mapped_column(String(1024))
    token_sealed: Mapped[str] = mapped_column(Text)
    bases: Mapped[list[str]] = mapped_column(JSON)
    # The worker credential that registered it (NULL: the shared token): only that
    # credential may withdraw it, so one worker cannot unplug another's models.
    credential_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TinkerModel(Base):
    """A LoRA model made through the Tinker-compatible API (``POST /api/v1/create_model``);
    its weights live on the worker that holds its base (``worker_id``; NULL: the worker at
    ``RLAAS_TINKER_WORKER_URL``, or a registered worker that has gone)."""

    __tablename__ = "tinker_models"

    # tm_<hex>, or the SDK's own "<session id>:train:<n>" for a model it creates from a
    # saved state (create_training_client_from_state names the model itself).
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    worker_id: Mapped[str | None] = mapped_column(
        ForeignKey("tinker_workers.id", ondelete="SET NULL"), nullable=True
    )
    base_model: Mapped[str] = mapped_column(String(1024))
    lora_rank: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TinkerCheckpoint(Base):
    """A Tinker model's saved training state (``POST /api/v1/save_weights``, the SDK's
    ``save_state``): adapter, Adam moments and step count, one folder of the artifact store
    (``store_key``, under the tenant's prefix; `rl_core.training.slot_state`). It outlives
    the model and its worker: any worker serving the base loads it. Its bytes count in the
    tenant's ``artifact_bytes`` quota."""

    __tablename__ = "tinker_checkpoints"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # tc_<hex>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    # Not a foreign key: the model may be unloaded (or its worker gone); its state stays.
    model_id: Mapped[str] = mapped_column(String(128), index=True)
    name: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(String(1024), unique=True)  # tinker://<model>/weights/<name>
    store_key: Mapped[str] = mapped_column(String(1024))
    base_model: Mapped[str] = mapped_column(String(1024))
    lora_rank: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    user_metadata: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TinkerFuture(Base):
    """One Tinker work call: answered by id at once, its result read by ``retrieve_future``.
    ``state``: pending, done (``result`` in ``media_type``) or failed (``error``)."""

    __tablename__ = "tinker_futures"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # tf_<hex>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(40))
    state: Mapped[str] = mapped_column(String(16), default="pending")
    result: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    media_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_category: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class TinkerSampler(Base):
    """A sampling session (``create_sampling_session``): a base model or a model's saved
    sampler weights (``model_path``, ``tinker://<model id>/sampler_weights/<name>``)."""

    __tablename__ = "tinker_samplers"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # ts_<hex>
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    base_model: Mapped[str] = mapped_column(String(1024))
    model_path: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
