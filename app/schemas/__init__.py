"""Request and response bodies, one module per group of routes.

``runs``: the public run routes; ``internal``: the worker routes. Routes import
from here so a body can move between modules without touching them.
"""

from app.schemas._base import Body, Timestamp
from app.schemas.internal import (
    ClaimBody,
    ClaimRead,
    GatewayBody,
    HeartbeatBody,
    HeartbeatRead,
    IngestRead,
    MetricsBody,
    PointIn,
    StatusBody,
    StatusRead,
    UpdateIn,
)
from app.schemas.runs import (
    EventPage,
    EventRead,
    MetricsRead,
    PointRead,
    RunCreate,
    RunPage,
    RunRead,
)

__all__ = [
    "Body",
    "ClaimBody",
    "ClaimRead",
    "EventPage",
    "EventRead",
    "GatewayBody",
    "HeartbeatBody",
    "HeartbeatRead",
    "IngestRead",
    "MetricsBody",
    "MetricsRead",
    "PointIn",
    "PointRead",
    "RunCreate",
    "RunPage",
    "RunRead",
    "StatusBody",
    "StatusRead",
    "Timestamp",
    "UpdateIn",
]
