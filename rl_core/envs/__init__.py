"""Environments: the `Environment` protocol, the built-ins, and building one from a spec."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from rl_core.envs.base import Action, Environment, Message, Reset, Step, ToolCall
from rl_core.envs.calculator import Calculator
from rl_core.envs.callbacks import CallbackSource, MemoryCallbacks
from rl_core.envs.code_exec import CodeExec
from rl_core.envs.dataset import DatasetEnv
from rl_core.envs.guess_number import GuessNumber
from rl_core.envs.judge import LLMJudge
from rl_core.envs.next_number import NextNumber
from rl_core.envs.openenv import OpenEnvEnvironment
from rl_core.envs.reasoning_gym import ReasoningGym
from rl_core.envs.scored import Scored, Scorer
from rl_core.envs.scorer import WebhookScorer
from rl_core.envs.simulated import SimulatedLatency
from rl_core.envs.walls import SINGLE_USER, WallPolicy
from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
from rl_core.errors import EnvironmentFailure, UnknownEnvironment
from rl_core.protocol.ecosystem import OPENENV, ConfigProblem, OpenEnvConfig, parse_config
from rl_core.rewards import parse_reward

if TYPE_CHECKING:
    from rl_core.spec import EnvironmentSpec

BUILTINS: dict[str, Callable[[], Environment]] = {
    "guess_number": GuessNumber,
    "next_number": NextNumber,
    "calculator": Calculator,
    "code_exec": CodeExec,
    "sim_latency": SimulatedLatency,
    "dataset": DatasetEnv,
    # A dataset of reasoning-gym, named in environment.config (docs/ecosystem.md).
    "reasoning_gym": ReasoningGym,
}


def get_environment(name: str) -> Environment:
    """A fresh instance of the built-in environment ``name``."""
    factory = BUILTINS.get(name)
    if factory is not None:
        return factory()
    if name.startswith("env_"):
        raise UnknownEnvironment(
            name, BUILTINS, "is a registered webhook environment; build it with build_environment"
        )
    raise UnknownEnvironment(name, BUILTINS)


def build_environment(
    env_spec: EnvironmentSpec,
    *,
    webhooks: Mapping[str, WebhookTarget] | None = None,
    callbacks: CallbackSource | None = None,
    walls: WallPolicy | None = None,
) -> Environment:
    """The environment a run's spec names: a built-in, ``env_<id>`` found in
    ``webhooks`` (the worker gets it from the claim answer), or ``openenv``, whose
    ``config.environment`` is found there; wrapped in `Scored` when the spec
    attaches reward functions by name. ``walls``: whether the
    host lets tenant code (``code_exec``) run behind a wall weaker than bubblewrap
    (`rl_core.envs.walls`; None: a single-user machine's policy)."""
    name = env_spec.name
    env: Environment
    if name == OPENENV:
        env = _openenv(env_spec.config, webhooks or {})
    elif name.startswith("env_"):
        target = (webhooks or {}).get(name)
        if target is None:
            raise UnknownEnvironment(
                name,
                BUILTINS,
                "is a registered webhook environment, but this run was given no URL for it "
                "(run it through the control plane, or pass webhooks={id: WebhookTarget(...)})",
            )
        env = WebhookEnvironment(target, callbacks=callbacks, policy=env_spec.webhook)
    elif name == CodeExec.name:
        env = CodeExec(walls or SINGLE_USER)
    else:
        env = get_environment(name)
        if isinstance(env, ReasoningGym | DatasetEnv):
            # A bad reasoning-gym config (its own env, or a dataset's procedural source)
            # fails the run here, before its first episode.
            env.prepare(env_spec.config)
    if env_spec.reward:
        env = Scored(
            env,
            parse_reward(env_spec.reward),
            scorer=_scorer(env_spec, webhooks or {}),
            judge=_judge(env_spec, webhooks or {}),
        )
    return env


def _judge(env_spec: EnvironmentSpec, webhooks: Mapping[str, WebhookTarget]) -> LLMJudge | None:
    """The ``judge`` reward's LLM judge (``environment.judge``), its URL and key found in
    ``webhooks`` as a webhook environment's are (the worker gets them from the claim)."""
    if env_spec.judge is None:
        return None
    target = webhooks.get(env_spec.judge.endpoint)
    if target is None:
        raise UnknownEnvironment(
            env_spec.judge.endpoint,
            BUILTINS,
            "is the judge this run names (environment.judge.endpoint), but this run was "
            "given no URL for it (register it with POST /v1/environments and run through "
            "the control plane, or pass webhooks={id: WebhookTarget(...)})",
        )
    return LLMJudge(target, env_spec.judge)


def _scorer(env_spec: EnvironmentSpec, webhooks: Mapping[str, WebhookTarget]) -> Scorer | None:
    """The ``webhook`` reward's endpoint (``environment.scorer``), found in ``webhooks``
    as a webhook environment is (the worker gets it from the claim answer)."""
    if env_spec.scorer is None:
        return None
    target = webhooks.get(env_spec.scorer)
    if target is None:
        raise UnknownEnvironment(
            env_spec.scorer,
            BUILTINS,
            "is the scorer endpoint this run names (environment.scorer), but this run was "
            "given no URL for it (register it with POST /v1/environments and run through "
            "the control plane, or pass webhooks={id: WebhookTarget(...)})",
        )
    return WebhookScorer(target, policy=env_spec.webhook)


def _openenv(config: Mapping[str, object], webhooks: Mapping[str, WebhookTarget]) -> Environment:
    try:
        cfg: OpenEnvConfig = parse_config(OPENENV, dict(config))
    except ConfigProblem as exc:
        raise EnvironmentFailure(f"{OPENENV}: {exc}") from None
    if cfg.url is not None:  # a local run: no control plane registered it
        return OpenEnvEnvironment(WebhookTarget(id="openenv", url=cfg.url, secret=""), cfg)
    assert cfg.environment is not None
    target = webhooks.get(cfg.environment)
    if target is None:
        raise UnknownEnvironment(
            cfg.environment,
            BUILTINS,
            "is the OpenEnv server this run names (environment.config.environment), but "
            "this run was given no URL for it (register it with POST /v1/environments and "
            "run through the control plane, or pass webhooks={id: WebhookTarget(...)})",
        )
    return OpenEnvEnvironment(target, cfg)


__all__ = [
    "BUILTINS",
    "Action",
    "CallbackSource",
    "Environment",
    "MemoryCallbacks",
    "Message",
    "OpenEnvEnvironment",
    "ReasoningGym",
    "Reset",
    "Step",
    "ToolCall",
    "WebhookEnvironment",
    "WebhookTarget",
    "build_environment",
    "get_environment",
]
