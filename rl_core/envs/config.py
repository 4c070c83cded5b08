"""Reading an environment's ``config`` mapping into its frozen config dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from rl_core.errors import EnvironmentFailure

C = TypeVar("C")


def parse_config(cls: type[C], config: Mapping[str, Any], env_name: str) -> C:
    """``cls(**config)``, with unknown keys and bad values as one `EnvironmentFailure`."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(config) - known)
    if unknown:
        raise EnvironmentFailure(
            f"{env_name}: unknown config keys {unknown}; known keys are {sorted(known)}"
        )
    try:
        return cls(**dict(config))
    except (TypeError, ValueError) as exc:
        raise EnvironmentFailure(f"{env_name}: bad config: {exc}") from exc
