"""What the SDK's calls return: frozen dataclasses read from the API's JSON.

Each keeps the JSON it came from in ``raw`` where the API may add fields, so a
newer server never breaks an older client. The records the RL core defines
(text segments, in-flight snapshots, trajectories) are ``rl_core.records``'
own types: one definition on both sides of the wire, read with their own
``from_json``. The rest stay here, each for a stated reason: a client's
return types keep ``raw`` and never refuse a field a newer server adds, and
some differ from the worker's records (``Span`` is read back from Chrome
trace events; ``Checkpoint`` has ``created_at``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from rl_core.records import InflightSnapshot, TrajectoryRecord

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
T = TypeVar("T")


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True)
class Run:
    id: str
    status: str
    name: str | None
    current_step: int
    error: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(
            id=data["id"],
            status=data["status"],
            name=data.get("name"),
            current_step=int(data.get("current_step") or 0),
            error=data.get("error"),
            raw=data,
        )

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    @property
    def total_steps(self) -> int | None:
        steps = self.raw.get("spec", {}).get("train", {}).get("steps")
        return int(steps) if steps else None


@dataclass(frozen=True)
class RunEvent:
    id: int | None
    from_status: str | None
    to_status: str
    reason: str | None
    created_at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunEvent:
        return cls(
            id=data.get("id"),
            from_status=data.get("from_status"),
            to_status=data["to_status"],
            reason=data.get("reason"),
            created_at=_time(data.get("created_at")),
        )


@dataclass(frozen=True)
class MetricPoint:
    step: int
    name: str
    value: float


@dataclass(frozen=True)
class MetricsStep:
    """One step's metrics, as the live stream sends them."""

    step: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class StatusChange:
    """The run's status, sent by the stream when it opens and on every transition."""

    status: str

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


StreamEvent = MetricsStep | StatusChange


# Not rl_core.records.Span: read back from the timeline's Chrome trace events (track by name).
@dataclass(frozen=True)
class Span:
    name: str
    track: str
    start_us: int
    dur_us: int
    step: int | None
    args: dict[str, Any]


@dataclass(frozen=True)
class Timeline:
    """A window of the run's stage spans. ``raw`` is Chrome trace JSON: save it, open it in
    Perfetto. ``truncated``: the window held more; ask again from ``next_start_us``."""

    spans: list[Span]
    truncated: bool
    next_start_us: int | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timeline:
        events = data.get("traceEvents", [])
        tracks = {
            e["tid"]: e.get("args", {}).get("name", str(e["tid"]))
            for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name"
        }
        spans = [
            Span(
                name=e["name"],
                track=tracks.get(e["tid"], str(e["tid"])),
                start_us=int(e["ts"]),
                dur_us=int(e.get("dur") or 0),
                step=e.get("args", {}).get("step"),
                args=dict(e.get("args", {})),
            )
            for e in events
            if e.get("ph") == "X"
        ]
        other = data.get("otherData") or {}
        return cls(
            spans=spans,
            truncated=bool(other.get("truncated")),
            next_start_us=other.get("next_start_us"),
            raw=data,
        )


@dataclass(frozen=True)
class Trajectory:
    """A stored sampled trajectory: its id and the ``TrajectoryRecord`` the worker sent."""

    id: int
    record: TrajectoryRecord

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        record = TrajectoryRecord.from_json(data)
        return cls(id=int(data["id"]), record=record)

    @property
    def trained_text(self) -> str:
        """What the loss trains on: the model's own tokens, joined."""
        return "".join(s.text for s in self.record.segments if s.trained)


# rl_core.records.CheckpointRecord plus created_at, as the public read gives it.
@dataclass(frozen=True)
class Checkpoint:
    step: int
    uri: str
    size_bytes: int | None
    created_at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        return cls(
            step=int(data["step"]),
            uri=data["uri"],
            size_bytes=data.get("size_bytes"),
            created_at=_time(data.get("created_at")),
        )


@dataclass(frozen=True)
class Inflight:
    """What the run is waiting on, as of its worker's last heartbeat (None: not reported)."""

    reported_at: datetime | None
    snapshot: InflightSnapshot | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Inflight:
        snap = data.get("snapshot")
        snapshot = InflightSnapshot.from_json(snap) if snap else None
        return cls(reported_at=_time(data.get("reported_at")), snapshot=snapshot)


@dataclass(frozen=True)
class Environment:
    """A registered webhook environment; use ``id`` as the spec's environment.name."""

    id: str
    name: str
    url: str
    timeout_s: float
    max_concurrency: int
    created_at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Environment:
        return cls(
            id=data["id"],
            name=data["name"],
            url=data["url"],
            timeout_s=float(data["timeout_s"]),
            max_concurrency=int(data["max_concurrency"]),
            created_at=_time(data.get("created_at")),
        )


@dataclass(frozen=True)
class Adapter:
    """An uploaded PEFT LoRA adapter; a run starts from it with
    ``model.lora.init_from: adapter:<id>`` (its ``model.lora.rank`` = ``rank``)."""

    id: str
    name: str
    rank: int
    alpha: float
    targets: list[str]
    size_bytes: int
    created_at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Adapter:
        return cls(
            id=data["id"],
            name=data["name"],
            rank=int(data["rank"]),
            alpha=float(data["alpha"]),
            targets=[str(t) for t in data["targets"]],
            size_bytes=int(data["size_bytes"]),
            created_at=_time(data.get("created_at")),
        )


@dataclass(frozen=True)
class Dataset:
    """An uploaded dataset; use ``id`` as the ``dataset`` environment's ``config.dataset``."""

    id: str
    name: str
    format: str
    sha256: str
    size_bytes: int
    rows: int
    fields: list[str]
    created_at: datetime | None
    updated_at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Dataset:
        return cls(
            id=data["id"],
            name=data["name"],
            format=data["format"],
            sha256=data["sha256"],
            size_bytes=int(data["size_bytes"]),
            rows=int(data["rows"]),
            fields=[str(f) for f in data["fields"]],
            created_at=_time(data.get("created_at")),
            updated_at=_time(data.get("updated_at")),
        )


@dataclass(frozen=True)
class ApiKeyInfo:
    """One of your API keys; ``key`` (the secret) only in the answer that created it."""

    id: str
    prefix: str
    created_at: datetime | None
    revoked_at: datetime | None
    key: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ApiKeyInfo:
        return cls(
            id=data["id"],
            prefix=data["prefix"],
            created_at=_time(data.get("created_at")),
            revoked_at=_time(data.get("revoked_at")),
            key=data.get("key"),
        )


@dataclass(frozen=True)
class CheckCall:
    path: str
    ok: bool
    status_code: int | None
    duration_ms: float
    error: str | None


@dataclass(frozen=True)
class EnvironmentCheck:
    """The outcome of calling the webhook once (reset, close) before any compute is spent."""

    ok: bool
    error: str | None
    calls: list[CheckCall]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EnvironmentCheck:
        return cls(
            ok=bool(data["ok"]),
            error=data.get("error"),
            calls=[
                CheckCall(
                    path=c["path"],
                    ok=bool(c["ok"]),
                    status_code=c.get("status_code"),
                    duration_ms=float(c.get("duration_ms") or 0.0),
                    error=c.get("error"),
                )
                for c in data.get("calls", [])
            ],
        )
