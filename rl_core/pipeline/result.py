"""What a finished (or stopped) run returns to its caller. Pure Python: no JAX."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TrainResult:
    steps_completed: int  # steps this call trained (a resumed run counts from its checkpoint)
    stopped_early: bool  # the host asked for a stop before ``train.steps``
    final_metrics: dict[str, float]  # the last step's metrics
