"""Bodies of GET /v1/limits."""

from __future__ import annotations

from pydantic import BaseModel, Field


class QuotasRead(BaseModel):
    runs_in_flight: int = Field(description="Queued, starting or running runs at once")
    requests_per_minute: int = Field(description="Requests to /v1 (a bucket: this many at once)")
    body_bytes: int = Field(description="Largest request body")
    run_seconds: int | None = Field(
        description="Seconds the tenant's runs may hold workers in the rolling period "
        "(null: no budget)"
    )
    run_seconds_period_s: int = Field(description="The rolling period of run_seconds")
    train_steps: int | None = Field(description="Most train.steps one run may ask (null: no cap)")
    dataset_bytes: int = Field(description="Bytes all of the tenant's datasets may take")
    artifact_bytes: int = Field(
        description="Bytes the tenant's stored artifacts may take: its runs' kept checkpoints "
        "and exports, its uploaded adapters, and its Tinker models' saved states"
    )


class UsageRead(BaseModel):
    runs_in_flight: int
    requests_available: int = Field(description="Requests that may be sent now without a 429")
    run_seconds: int = Field(description="Seconds the tenant's runs held workers in the period")
    dataset_bytes: int = Field(description="Bytes the tenant's datasets take")
    artifact_bytes: int = Field(
        description="Bytes the tenant's runs' kept checkpoints and exports (as of each run's "
        "newest checkpoint), its uploaded adapters and its Tinker models' saved states take"
    )


class TinkerQuotasRead(BaseModel):
    """The Tinker-compatible API's limits (docs/tinker.md), set by the operator: the
    tenant's own where the operator set one (``rlaas tenants quota``), else the setting."""

    models_per_base: int | None = Field(
        description="LoRA models the tenant may hold on one base model "
        "(RLAAS_TINKER_MAX_MODELS_PER_BASE; null: no limit)"
    )
    calls_in_flight: int | None = Field(
        description="Work calls (futures) not yet finished "
        "(RLAAS_TINKER_MAX_CALLS_IN_FLIGHT; null: no limit)"
    )
    tokens_per_minute: int | None = Field(
        description="Tokens of forward/forward_backward data and of samples (prompt plus "
        "max_tokens times num_samples) a minute: a bucket, this many at once "
        "(RLAAS_TINKER_TOKENS_PER_MINUTE; null: no limit)"
    )


class TinkerUsageRead(BaseModel):
    models: dict[str, int] = Field(description="The tenant's models on each base model")
    calls_in_flight: int = Field(description="The tenant's work calls not yet finished")
    tokens_available: int | None = Field(
        description="Tokens that may be spent now without a 429 (null: no limit)"
    )


class TinkerLimitsRead(BaseModel):
    quotas: TinkerQuotasRead
    usage: TinkerUsageRead


class AcceleratorRead(BaseModel):
    """One accelerator the deployment runs runs on (RLAAS_QUEUES)."""

    accelerator: str = Field(description="What a spec names in resources.accelerator")
    max_hosts: int = Field(description="The most resources.hosts a run may ask for")
    max_rollout_servers: int = Field(
        description="The most resources.rollout_servers a run may ask for"
    )


class ResourcesRead(BaseModel):
    """What a spec's ``resources`` may ask of this deployment (docs/accelerators.md)."""

    accelerators: list[AcceleratorRead] = Field(description="Those offered, each on its queue")
    default_accelerator: str = Field(
        description="Where a run goes whose spec names no resources.accelerator"
    )


class LimitsRead(BaseModel):
    quotas: QuotasRead
    usage: UsageRead
    resources: ResourcesRead
    tinker: TinkerLimitsRead = Field(description="The Tinker-compatible API's (/api/v1)")
