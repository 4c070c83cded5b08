"""The environment seam, chat-native, mirroring webhook protocol v1 (docs/environment-protocol.md).

Observations are messages to append to the conversation; an action is the
assistant's message. ``(episode_id, step)`` identifies a step: a retried step
must return the same result without advancing the environment twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]  # {"role": ..., "content": ..., "tool_call_id"?: ...}


@dataclasses.dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Action:
    """The assistant's message: its text, and the tool calls parsed from it (if any)."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()


@dataclasses.dataclass(frozen=True)
class Reset:
    messages: list[Message]  # roles system | user
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # JSON schemas
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Step:
    messages: list[Message]  # roles tool | user; may be empty when done
    reward: float
    done: bool
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset: ...

    async def step(self, episode_id: str, step: int, action: Action) -> Step: ...

    async def close(self, episode_id: str) -> None: ...
