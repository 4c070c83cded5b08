"""Typed errors of the RL core.

Every expected failure of a training run raises one of these, with a message
that says what to change. The worker renders ``type: message`` into the run's
failure, so the class names are part of what a user reads.

::

    RlCoreError
    ├── UnsupportedModelSource   model.source names a kind or preset not built yet
    ├── UnknownEnvironment       environment.name is not a built-in (or not supported yet)
    ├── UnsupportedSpec          a valid spec asks for a feature rl_core does not have yet
    ├── EnvironmentFailure       an environment's reset/step raised or broke the protocol
    ├── SandboxRefused           this host has no wall strong enough for tenant code: the run fails
    ├── RolloutError             the rollout engine was asked for something it cannot do
    ├── NoTrajectories           a whole step produced nothing to train on
    ├── ClientFaults             a sessions run's clients failed past rollout.client_fault_budget
    └── TrainerHostLost          a trainer process of a multi-host run died or stopped answering
"""

from __future__ import annotations

from collections.abc import Iterable


class RlCoreError(Exception):
    """Base class of every error raised on purpose by ``rl_core``."""


class UnsupportedModelSource(RlCoreError):
    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"model source {source!r}: {reason}")
        self.source = source


class UnknownEnvironment(RlCoreError):
    def __init__(self, name: str, known: Iterable[str], reason: str | None = None) -> None:
        known = sorted(known)
        why = reason or "is not a built-in environment"
        super().__init__(f"environment {name!r} {why}; built-ins are: {', '.join(known)}")
        self.name = name
        self.known = tuple(known)


class UnsupportedSpec(RlCoreError):
    """The spec is valid (the API accepted it) but names something not built yet."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


class EnvironmentFailure(RlCoreError):
    """An environment call failed; the episode ends as ``env_error``, the run goes on."""


class SandboxRefused(RlCoreError):
    """The host cannot build the sandbox wall that tenant code needs (bubblewrap) and its
    operator accepts no weaker one. Not an `EnvironmentFailure`: no episode could run here,
    so the run fails at once with this reason instead of retrying episode after episode."""


class RolloutError(RlCoreError):
    pass


class NoTrajectories(RlCoreError):
    """Every episode of a step timed out or failed, so there is nothing to learn from."""


class ClientFaults(RlCoreError):
    """``rollout.client_fault_budget`` sessions in a row ended without a reward (cancelled
    or timed out by their clients): the clients are broken, not the run."""


class TrainerHostLost(RlCoreError):
    """A trainer process of a multi-host run is gone (or stopped answering); every one of
    the run's trainer processes has been stopped (rl_core.training.trainer_group).
    Retryable: the attempt ends as a lost worker's, and the run's next attempt resumes
    from its last checkpoint, on the same number of processes or another."""

    retryable = True
