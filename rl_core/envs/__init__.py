"""Environments: the `Environment` protocol and the built-in registry."""

from __future__ import annotations

from collections.abc import Callable

from rl_core.envs.base import Action, Environment, Message, Reset, Step, ToolCall
from rl_core.envs.guess_number import GuessNumber
from rl_core.errors import UnknownEnvironment

BUILTINS: dict[str, Callable[[], Environment]] = {"guess_number": GuessNumber}


def get_environment(name: str) -> Environment:
    """A fresh instance of the built-in environment ``name``."""
    factory = BUILTINS.get(name)
    if factory is not None:
        return factory()
    if name.startswith("env_"):
        raise UnknownEnvironment(
            name, BUILTINS, "is a registered webhook environment, which rl_core cannot call yet"
        )
    raise UnknownEnvironment(name, BUILTINS)


__all__ = [
    "BUILTINS",
    "Action",
    "Environment",
    "Message",
    "Reset",
    "Step",
    "ToolCall",
    "get_environment",
]
