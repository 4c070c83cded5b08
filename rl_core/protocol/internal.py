"""The worker boundary: the bodies of ``/internal/runs/{run_id}/...`` (pure pydantic, no JAX).

The control plane serves these routes (``app/api/internal.py``, ``app/api/ingest.py``,
``app/api/callbacks.py``) and declares exactly these models as their bodies
(``app/schemas`` re-exports them); the worker (``worker/api_client.py``) builds
its requests from them and parses the answers into them. One definition, so
the two sides cannot drift.

Naming follows the control plane's: ``...Body`` is what the worker sends,
``...Read`` is what the control plane answers, ``...In`` is an item of a body.

Strict and tolerant sides:

- What the worker **sends** forbids unknown fields (``extra="forbid"``): a
  misspelt field is a 422 naming it, never silently dropped. Integer bounds
  are the database columns' bounds, so a value the database would refuse is a
  422 naming the field, not a 500.
- What the control plane **answers** ignores unknown fields, so a control
  plane that adds a field to an answer does not break a worker of the version
  before.

``rl_core.records`` holds the same records as frozen dataclasses: those are
made on the pipeline's hot path (thousands of spans a second) without
validation, and their ``to_json`` is the wire shape validated here.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

INT32 = 2**31 - 1
INT64 = 2**63 - 1
Scalar = str | int | float | bool


def _utc(value: datetime) -> datetime:
    # A time without a zone is UTC (SQLite keeps no zone; every stored time is UTC).
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


Timestamp = Annotated[datetime, AfterValidator(_utc)]
WorkerId = Annotated[str, Field(min_length=1, max_length=200)]
LeaseSeconds = Annotated[float, Field(gt=0, le=3600)]


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class Sent(BaseModel):
    """A body the worker sends: unknown fields are refused (a 422 naming them)."""

    model_config = ConfigDict(extra="forbid")


class Answer(BaseModel):
    """An answer of the control plane: unknown fields are ignored (newer servers may add some)."""

    model_config = ConfigDict(extra="ignore")


# --- the worker itself ----------------------------------------------------------------


class SandboxIn(Sent):
    """The sandbox wall a worker runs tenant code behind (``rl_core.envs.walls.WallReport``):
    ``bwrap`` is the wall between tenants; behind the others, tenant code is ``refused``
    or, where the operator (or the embedded default) accepted it, ``runs_on_weak_wall``."""

    wall: Literal["bwrap", "namespace", "audit"]
    tenant_code: Literal["runs", "runs_on_weak_wall", "refused"]


class WorkerReportBody(Sent):
    """What a worker says of itself at start-up (``POST /internal/workers/report``)."""

    worker_id: WorkerId
    queue: str = Field(min_length=1, max_length=200)
    sandbox: SandboxIn


# --- claim ----------------------------------------------------------------------------


class ClaimBody(Sent):
    worker_id: WorkerId
    lease_seconds: LeaseSeconds = 60.0
    # False: take the run the path names (what a worker of the release before asks for).
    # True: take the queued run that fairness between tenants puts first, which may be
    # another than the one named; the answer's run_id says which (docs/lifecycle.md).
    fair: bool = False
    # The claimer's sandbox wall, written into the claim's run event (the tenant reads
    # which wall ran their code) and into the worker's row on /readyz.
    sandbox: SandboxIn | None = None
    # With fair: the model sources (model.source) of the bases the claimer holds now (a
    # worker hosting several runs, docs/shared-base.md). Among the runs of the tenant fair
    # order picks, one on such a base goes first; the order between tenants is unchanged.
    bases: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=64)] = []


class EnvironmentGrant(Answer):
    """What a worker needs to call the environment (over /internal, to the lease owner only)."""

    id: str
    url: str
    secret: str = Field(repr=False)  # decrypted; never logged
    timeout_s: float
    max_concurrency: int


class CheckpointRef(Answer):
    """The newest checkpoint of a run, in the claim answer: where a new attempt resumes."""

    step: int
    uri: str
    size_bytes: int | None = None
    # The attempt whose policy the checkpoint holds (a control plane of the release before
    # answers none): the base of the resumed attempt's first update (`UpdateIn`).
    attempt: int | None = None


class ClaimRead(Answer):
    run_id: str
    # The job spec as submitted; the worker validates it with rl_core.spec.parse_spec, so a
    # spec it cannot run fails the run with the reason instead of failing the claim.
    spec: dict[str, Any]
    attempt: int
    lease_expires_at: Timestamp
    resume_step: int
    # The registered webhook environment the spec names (secret decrypted), or None.
    environment: EnvironmentGrant | None = None
    # The scorer endpoint of the spec's ``webhook`` reward (environment.scorer), or None.
    scorer: EnvironmentGrant | None = None
    # The LLM judge of the spec's ``judge`` reward (environment.judge.endpoint; the secret
    # is its API key), or None.
    judge: EnvironmentGrant | None = None
    checkpoint: CheckpointRef | None = None  # the newest checkpoint: where to resume from
    # The credential of every other route of this run (Authorization: Bearer <lease_token>),
    # good until this lease ends; the shared worker token opens only the claim.
    lease_token: str = Field(repr=False)  # never logged


# --- heartbeat and status ------------------------------------------------------------


class InflightEpisodeIn(Sent):
    """``rl_core.records.InflightEpisode``."""

    episode_id: str = Field(min_length=1, max_length=300)
    stage: str = Field(min_length=1, max_length=64)
    since_s: float = Field(ge=0)
    turn: int = Field(ge=0, le=INT32)


class InflightIn(Sent):
    """``rl_core.records.InflightSnapshot`` as the heartbeat carries it."""

    step: int = Field(ge=0, le=INT32)
    trainer: str = Field(min_length=1, max_length=64)
    trainer_since_s: float = Field(ge=0)
    queue_depth: int = Field(ge=0, le=INT32)
    episodes: list[InflightEpisodeIn] = Field(max_length=10_000)


class HeartbeatBody(Sent):
    worker_id: WorkerId
    lease_seconds: LeaseSeconds = 60.0
    inflight: InflightIn | None = None  # what the run waits on now (GET /v1/runs/{id}/inflight)


class HeartbeatRead(Answer):
    cancel_requested: bool
    lease_expires_at: Timestamp
    profile_steps: int | None = None  # profile the next N steps; handed out once


class GatewayBody(Sent):
    """A sessions run's gateway (worker/gateway.py), as the control plane reaches it: the
    URL it proxies client calls to and the token that opens sessions there."""

    worker_id: WorkerId
    url: str = Field(min_length=1, max_length=2048)
    token: str = Field(min_length=16, max_length=200)


class ServingUrlBody(Sent):
    """A served checkpoint's server (worker/serving.py), loaded: where the control plane
    reaches it (RLAAS_SERVE_URL, else http://RLAAS_SERVE_HOST:port). Sent with the serving
    order's secret, not a worker credential: the order is the server's only authority."""

    url: str = Field(max_length=2048, pattern=r"^https?://[^\s]+$")


class ServingFailedBody(Sent):
    """Why a served checkpoint could not be loaded: the tenant's next call reads it."""

    error: str = Field(max_length=4000)


class TinkerWorkerBody(Sent):
    """A Tinker model worker (worker/tinker_server.py) registering with its worker
    credential: where the control plane reaches it, the secret it sends there as its bearer,
    and the base models it holds. New models on those bases go to the newest such worker."""

    url: str = Field(max_length=2048, pattern=r"^https?://[^\s]+$")
    token: str = Field(min_length=1, max_length=200)
    bases: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(
        min_length=1, max_length=64
    )


class TinkerWorkerRead(Answer):
    """A registered Tinker model worker: its id, to deregister with when it stops."""

    id: str


class StatusBody(Sent):
    worker_id: WorkerId
    status: Literal["running", "succeeded", "failed", "cancelled"]
    error: str | None = Field(default=None, max_length=20_000)


class StatusRead(Answer):
    status: str


# --- numbered report batches ---------------------------------------------------------


class WorkerBatch(Sent):
    """A numbered batch: the control plane stores each ``(run, kind, seq)`` once."""

    worker_id: WorkerId
    seq: int = Field(ge=0, le=INT64)


class PointIn(Sent):
    step: int = Field(ge=0, le=INT32)
    name: str = Field(min_length=1, max_length=200)
    # Checked in pydantic-core, not a Python validator: a batch holds thousands of points.
    value: float = Field(allow_inf_nan=False)


class UpdateIn(Sent):
    """One applied policy update: attempt ``attempt`` trained ``step`` on the policy that
    attempt ``base_attempt`` left at ``base_step`` (the step before, or the checkpoint it
    resumed from; 0 and 0: the initial policy). The links make the final policy's lineage
    (docs/lifecycle.md, "Steps redone after a resume")."""

    step: int = Field(ge=1, le=INT32)
    attempt: int = Field(ge=1, le=INT32)
    base_step: int = Field(ge=0, le=INT32)
    base_attempt: int = Field(ge=0, le=INT32)
    # The optimiser's update count after the step, as the trainer's (checkpointed) state says.
    optimizer_updates: int | None = Field(default=None, ge=0, le=INT64)


class MetricsBody(WorkerBatch):
    points: list[PointIn] = Field(max_length=100_000)
    # The updates the batch's steps applied, stored in the same transaction as its points.
    updates: list[UpdateIn] = Field(default_factory=list, max_length=100_000)


class SpanIn(Sent):
    """``rl_core.records.Span``."""

    name: str = Field(min_length=1, max_length=64)
    start_us: int = Field(ge=0, le=INT64)
    dur_us: int = Field(ge=0, le=INT64)
    track: str = Field(min_length=1, max_length=300)
    step: int = Field(ge=0, le=INT32)
    args: dict[str, Scalar] | None = None


class SpansBody(WorkerBatch):
    spans: list[SpanIn] = Field(max_length=100_000)


class SegmentIn(Sent):
    """``rl_core.records.TextSegment``."""

    text: str
    trained: bool


class TrajectoryIn(Sent):
    """``rl_core.records.TrajectoryRecord``."""

    episode_id: str = Field(min_length=1, max_length=300)
    step: int = Field(ge=0, le=INT32)
    policy_version: int = Field(ge=0, le=INT32)
    group: int = Field(ge=0, le=INT32)
    reward: float
    turns: int = Field(ge=0, le=INT32)
    end_state: Literal["done", "truncated", "timeout", "env_error", "cancelled"]
    end_reason: str | None = Field(default=None, max_length=2000)
    model_tokens: int = Field(ge=0, le=INT64)
    total_tokens: int = Field(ge=0, le=INT64)
    duration_s: float = Field(ge=0)
    segments: list[SegmentIn] = Field(max_length=10_000)
    sampling: dict[str, float | int]
    info: dict[str, Any] = Field(default_factory=dict)

    _reward_finite = field_validator("reward", "duration_s")(_finite)


class TrajectoriesBody(WorkerBatch):
    trajectories: list[TrajectoryIn] = Field(max_length=10_000)


class IngestRead(Answer):
    accepted: int
    duplicate: bool  # True: this (kind, seq) was stored before; nothing was added


# --- artifacts ------------------------------------------------------------------------


class ArtifactBody(Sent):
    """A file the run wrote (``rl_core.records.CheckpointRecord`` plus its kind)."""

    worker_id: WorkerId
    kind: Literal["checkpoint", "profile", "export"]
    step: int = Field(ge=0, le=INT32)
    uri: str = Field(min_length=1, max_length=4096)
    size_bytes: int | None = Field(default=None, ge=0, le=INT64)
    # A checkpoint's: the bytes the run's kept checkpoints and exports take now
    # (rl_core.records.CheckpointRecord.stored_bytes); the run's storage use.
    stored_bytes: int | None = Field(default=None, ge=0, le=INT64)


class ArtifactStored(Answer):
    stored: bool


# --- deferred environment results -----------------------------------------------------


class CallbackRead(Answer):
    """``GET /internal/runs/{id}/env-callbacks/{episode_id}/{step}``: a deferred step's
    result as the environment posted it (``rl_core.protocol.webhook.CallbackBody``)."""

    body: dict[str, Any]


# Each kind of numbered batch: its route under /internal/runs/{id}/, its body, and the
# field its items travel under.
BATCHES: dict[str, tuple[str, type[WorkerBatch], str]] = {
    "metrics": ("metrics", MetricsBody, "points"),
    "spans": ("spans", SpansBody, "spans"),
    "trajectories": ("trajectories", TrajectoriesBody, "trajectories"),
}

__all__ = [
    "BATCHES",
    "INT32",
    "INT64",
    "Answer",
    "ArtifactBody",
    "ArtifactStored",
    "CallbackRead",
    "CheckpointRef",
    "ClaimBody",
    "ClaimRead",
    "EnvironmentGrant",
    "GatewayBody",
    "HeartbeatBody",
    "HeartbeatRead",
    "InflightEpisodeIn",
    "InflightIn",
    "IngestRead",
    "MetricsBody",
    "PointIn",
    "SandboxIn",
    "SegmentIn",
    "Sent",
    "SpanIn",
    "SpansBody",
    "StatusBody",
    "StatusRead",
    "Timestamp",
    "TrajectoriesBody",
    "TrajectoryIn",
    "UpdateIn",
    "WorkerBatch",
    "WorkerReportBody",
]
