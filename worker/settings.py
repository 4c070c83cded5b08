"""Worker settings, read from the environment.

A worker needs three things: where the broker is, where the control plane is,
and the token that proves it is a worker. It never gets database credentials.
Unset, they mean the embedded default that ``rlaas quickstart`` uses: a
SQLite-file broker and a control plane on loopback, sharing one data folder
(where the control plane left the worker token it generated).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLAAS_", extra="ignore")

    data_dir: Path = Field(default_factory=lambda: Path("~/.rlaas").expanduser())
    broker_url: str | None = None
    api_url: str = "http://127.0.0.1:8000"
    worker_token: str | None = None
    # One queue per accelerator class; a CPU worker serves "cpu".
    queue: str = "cpu"
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_seconds: float = 60.0
    heartbeat_seconds: float = 5.0
    # How long the worker keeps retrying the control plane before giving up
    # on a report (the API may be restarting).
    api_retry_seconds: float = 120.0

    # Checkpoints and profiles, one folder per run. Workers that may resume each
    # other's runs must share it (a volume; a bucket path in production).
    artifacts_path: Path | None = None

    # Where hf:/gguf: model sources of runs are found: a spec names a path inside it.
    models_path: Path | None = None

    def artifacts_dir(self) -> Path:
        return self.artifacts_path or self.data_dir / "artifacts"

    def models_dir(self) -> Path:
        """``RLAAS_MODELS_PATH``, else ``<data dir>/models``."""
        return self.models_path or self.data_dir / "models"

    def resolved_broker_url(self) -> str:
        if self.broker_url:
            return self.broker_url
        return f"sqla+sqlite:///{self.data_dir / 'broker.db'}"

    def resolved_worker_token(self) -> str:
        """The configured token, or the one the embedded control plane wrote."""
        if self.worker_token:
            return self.worker_token
        token_file = self.data_dir / "worker_token"
        if token_file.exists():
            return token_file.read_text(encoding="utf-8").strip()
        raise RuntimeError(
            "RLAAS_WORKER_TOKEN is not set and no embedded token exists at "
            f"{token_file}; start the control plane first or set RLAAS_WORKER_TOKEN"
        )
