"""Control-plane settings, from ``RLAAS_*`` environment variables.

Unset database and broker URLs mean the embedded default: SQLite files and a
server-less broker under ``RLAAS_DATA_DIR``. There a missing worker token is
generated once and left in the data folder for local workers; anywhere else a
missing token is an error at start-up, never a guessable default.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SettingsError(RuntimeError):
    """A setting is missing or unsafe; the message says which and what to set."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLAAS_", extra="ignore")

    data_dir: Path = Field(default_factory=lambda: Path("~/.rlaas").expanduser())
    database_url: str | None = None
    broker_url: str | None = None
    worker_token: str | None = None
    secret_key: str | None = None
    task_queue: str = "cpu"
    reaper_interval_s: float = 5.0
    max_attempts: int = 3

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

    def resolved_worker_token(self) -> str:
        if self.worker_token:
            return self.worker_token
        if not self.embedded:
            raise SettingsError(
                "RLAAS_WORKER_TOKEN must be set when RLAAS_DATABASE_URL points at a server"
            )
        token_file = self.data_dir / "worker_token"
        if token_file.exists():
            return token_file.read_text(encoding="utf-8").strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        token_file.write_text(token + "\n", encoding="utf-8")
        token_file.chmod(0o600)
        return token
