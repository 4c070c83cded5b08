"""Worker settings, read from the environment.

A worker needs three things: where the broker is, where the control plane is,
and the token that proves it is a worker. It never gets database credentials.
Unset, they mean the embedded default that ``rlaas quickstart`` uses: a
SQLite-file broker and a control plane on loopback, sharing one data folder
(where the control plane left the worker token it generated).

It also decides whether tenant code (``code_exec``) may run here without bubblewrap's
sandbox wall (`sandbox_walls`): on the embedded default, with a warning; on a deployed
worker, only with ``RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP=1``, whose name says what it
gives up; otherwise such runs fail at their first reset with the operator's fix.

And where webhook environments may be reached from it
(``RLAAS_ENV_URL_ALLOWLIST``, as the control plane reads it, with the same
defaults): a worker checks every connection it makes to an environment.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rl_core.protocol.addresses import Allowlist

if TYPE_CHECKING:
    from rl_core.envs.walls import WallPolicy
    from rl_core.store import ArtifactStore
    from rl_core.training.stored import StoreTarget

# The one way to run tenant code on a deployed worker without bubblewrap (docs/lifecycle.md).
UNSAFE_SANDBOX = "RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP"


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLAAS_", extra="ignore")

    data_dir: Path = Field(default_factory=lambda: Path("~/.rlaas").expanduser())
    broker_url: str | None = None
    api_url: str = "http://127.0.0.1:8000"
    # This worker's own credential (`rlaas workers issue NAME` prints it); the shared
    # token, RLAAS_WORKER_TOKEN, only where the control plane still accepts it (deprecated).
    worker_credential: str | None = None
    worker_token: str | None = None
    # The queue of this worker's accelerator, as the API's RLAAS_QUEUES names it
    # ("cpu=rlaas-cpu,gpu=rlaas-gpu": a GPU worker serves "rlaas-gpu"); default "cpu".
    queue: str = "cpu"
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_seconds: float = 60.0
    heartbeat_seconds: float = 5.0
    # How long the worker keeps retrying the control plane before giving up
    # on a report (the API may be restarting).
    api_retry_seconds: float = 120.0

    # Checkpoints and profiles, one folder per run. Without an artifact store, workers that
    # may resume each other's runs must share it (a volume); with one, it is a cache.
    artifacts_path: Path | None = None
    # The artifact store (docs/storage.md): s3://bucket/prefix (credentials and region from
    # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), file:///folder. Unset: the
    # artifacts folder is the store. RLAAS_S3_ENDPOINT: an S3-compatible server's URL.
    artifact_store: str | None = None
    s3_endpoint: str | None = None
    # The most checkpoints a run keeps, whatever its spec's train.keep_checkpoints says.
    keep_checkpoints_max: int | None = Field(default=None, ge=1)

    # Where hf:/gguf: model sources of runs are found: a spec names a path inside it.
    models_path: Path | None = None

    # Where webhook environments may be reached (rl_core.protocol.addresses documents the
    # entries), checked at every connection the worker makes. Unset: "public" with a
    # server broker; "public,loopback" on the embedded default, as the control plane.
    env_url_allowlist: str | None = None

    # A sessions run's gateway (worker/gateway.py): the address it binds and, when the
    # control plane must reach it by another name (0.0.0.0, a container), that URL.
    # Only the control plane calls it (clients reach it through the API).
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(default=0, ge=0, le=65535)  # 0: any free port
    gateway_url: str | None = None

    # A served checkpoint (worker/serving.py, docs/serving.md): the address its server
    # binds (port 0: any free one) and, when the control plane must reach it by another
    # name, that URL; it stops after this many seconds without a call.
    serve_host: str = "127.0.0.1"
    serve_port: int = Field(default=0, ge=0, le=65535)
    serve_url: str | None = None
    serve_idle_s: float = Field(default=600.0, gt=0)

    # How long the end of a run waits for its trackers (docs/trackers.md) to take what is
    # queued; a tracker that is failing gets no wait at all.
    tracker_close_seconds: float = Field(default=30.0, ge=0, le=600)

    # True: a deployed worker without bubblewrap runs tenant code behind the weaker walls
    # (unshare -rn or the audit hook alone), which do not keep tenants apart; each run is
    # told so. False (the default): it refuses such runs.
    unsafe_sandbox_without_bwrap: bool = False

    # Runs this worker process hosts at once (docs/shared-base.md). 1 (the default): one
    # run a worker, on a solo pool. More: a thread pool of that many; LoRA runs of one
    # base on the JAX engine then share the base's weights, and all take fair turns on
    # the device.
    runs_per_worker: int = Field(default=1, ge=1, le=64)

    # A run's trainer over resources.hosts > 1 processes (docs/multi-host.md): Ray actors.
    # ray_address: a running Ray cluster to join ("auto", "ray://head:10001"); unset, the
    # worker starts a local one. Each trainer process reserves trainer_host_cpus CPUs and
    # trainer_host_gpus GPUs, placed by trainer_placement (PACK: on as few nodes as fit;
    # STRICT_SPREAD: one per node). A gang start that Ray cannot place within
    # trainer_start_timeout_s, or a call unanswered within trainer_call_timeout_s, ends
    # the attempt as a lost trainer process does.
    ray_address: str | None = None
    trainer_host_cpus: float = Field(default=1.0, ge=0)
    trainer_host_gpus: float = Field(default=0.0, ge=0)
    trainer_placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    trainer_start_timeout_s: float = Field(default=300.0, gt=0)
    trainer_call_timeout_s: float = Field(default=1800.0, gt=0)

    @field_validator("env_url_allowlist")
    @classmethod
    def _allowlist_parses(cls, value: str | None) -> str | None:
        Allowlist.parse(value, embedded=False)  # a bad entry stops the worker at start-up
        return value

    @field_validator("artifact_store")
    @classmethod
    def _store_url_parses(cls, value: str | None) -> str | None:
        from rl_core.store import store_setting

        return store_setting(value)  # a bad URL stops start-up, naming the setting

    @property
    def embedded(self) -> bool:
        """The embedded default: a SQLite-file broker, so the control plane and this worker
        share one machine (a worker holds no database URL to tell it by, as the API does)."""
        return self.broker_url is None or self.broker_url.startswith("sqla+sqlite")

    def sandbox_walls(self) -> WallPolicy:
        """What this worker accepts for tenant code (`rl_core.envs.walls`)."""
        from rl_core.envs.walls import WallPolicy, operator_accepts_weak_wall

        if self.unsafe_sandbox_without_bwrap:
            return operator_accepts_weak_wall(f"{UNSAFE_SANDBOX}=1")
        if self.embedded:
            accepted_by = "the embedded single-user default (rlaas quickstart)"
            return WallPolicy(weak_wall="warn", accepted_by=accepted_by)
        opt_out = f"{UNSAFE_SANDBOX}=1 (which gives up the wall between tenants)"
        return WallPolicy(weak_wall="refuse", opt_out=opt_out)

    def env_allowlist(self) -> Allowlist:
        return Allowlist.parse(self.env_url_allowlist, embedded=self.embedded)

    def artifacts_dir(self) -> Path:
        return self.artifacts_path or self.data_dir / "artifacts"

    def store_target(self, run_id: str) -> StoreTarget | None:
        """Where a run's checkpoints and exports go beyond this disk (None: nowhere); the
        run's keys lie under its id."""
        from rl_core.store import open_store
        from rl_core.training.stored import StoreTarget

        store = (
            open_store(self.artifact_store, endpoint=self.s3_endpoint)
            if self.artifact_store
            else None
        )
        return StoreTarget(store, run_id, keep_cap=self.keep_checkpoints_max)

    def state_store(self) -> ArtifactStore:
        """Where a Tinker model worker keeps saved training state (docs/tinker.md): the
        artifact store, else the artifacts folder as one (the control plane, on the same
        machine, opens the same folder to delete and count it)."""
        from rl_core.store import open_store

        if self.artifact_store:
            return open_store(self.artifact_store, endpoint=self.s3_endpoint)
        return open_store(f"file://{self.artifacts_dir().absolute()}")

    def models_dir(self) -> Path:
        """``RLAAS_MODELS_PATH``, else ``<data dir>/models``."""
        return self.models_path or self.data_dir / "models"

    def resolved_broker_url(self) -> str:
        if self.broker_url:
            return self.broker_url
        return f"sqla+sqlite:///{self.data_dir / 'broker.db'}"

    def resolved_worker_token(self) -> str:
        """This worker's credential, else the shared token: the configured one, or the one
        the embedded control plane wrote."""
        if self.worker_credential:
            return self.worker_credential
        if self.worker_token:
            return self.worker_token
        token_file = self.data_dir / "worker_token"
        if token_file.exists():
            return token_file.read_text(encoding="utf-8").strip()
        raise RuntimeError(
            "RLAAS_WORKER_CREDENTIAL is not set and no embedded token exists at "
            f"{token_file}; enrol this worker (`rlaas workers issue NAME` on the control "
            "plane's host prints its credential) or start the embedded control plane first"
        )
