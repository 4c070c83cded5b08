"""Bodies of the worker routes (/internal/...): the wire contract of ``rl_core.protocol.internal``.

The control plane declares exactly the models the worker builds and parses, so
the two sides cannot drift (tests/app/test_protocol_schemas.py holds them to it).
"""

from __future__ import annotations

from rl_core.protocol.internal import (
    CallbackRead,
    ClaimBody,
    ClaimRead,
    GatewayBody,
    HeartbeatBody,
    HeartbeatRead,
    IngestRead,
    MetricsBody,
    PointIn,
    SandboxIn,
    ServingFailedBody,
    ServingUrlBody,
    StatusBody,
    StatusRead,
    UpdateIn,
    WorkerReportBody,
)

__all__ = [
    "CallbackRead",
    "ClaimBody",
    "ClaimRead",
    "GatewayBody",
    "HeartbeatBody",
    "HeartbeatRead",
    "IngestRead",
    "MetricsBody",
    "PointIn",
    "SandboxIn",
    "ServingFailedBody",
    "ServingUrlBody",
    "StatusBody",
    "StatusRead",
    "UpdateIn",
    "WorkerReportBody",
]
