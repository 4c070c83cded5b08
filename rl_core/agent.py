"""The agent: plays one episode and keeps its token ledger.

The ledger is the exact sequence of token ids the trainer will see: the
rendered prompt, then for every turn the tokens the model produced (as the
engine returned them, never re-tokenised from text) and the observation
tokens rendered after them. ``loss_mask`` is 1 exactly on model-produced
tokens, and ``logprobs`` carries the sampler's logprob there (0 elsewhere),
so the trainer can compute importance ratios against the behaviour policy.

Every episode ends in one explicit state:

- ``done``: the environment said so;
- ``truncated``: a limit ended it first (``max_turns``, ``max_context``, or a
  turn that reached ``max_new_tokens`` without an end-of-turn token);
- ``timeout``: ``episode_timeout_s`` passed;
- ``env_error``: the environment raised; the episode is dropped and counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from rl_core.envs.base import Action, Environment, Message
from rl_core.rollout.base import RolloutEngine, SamplingParams
from rl_core.tokenizer import Tokenizer

log = logging.getLogger(__name__)

EndState = Literal["done", "truncated", "timeout", "env_error"]
END_STATES: tuple[EndState, ...] = ("done", "truncated", "timeout", "env_error")
CLOSE_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig:
    max_turns: int = 8
    max_new_tokens: int = 64
    max_context: int = 1024
    system_prompt: str | None = None


@dataclasses.dataclass
class Trajectory:
    """One episode as the trainer consumes it. The three lists are aligned."""

    episode_id: str
    tokens: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    end_state: EndState = "truncated"
    policy_version: int = 0  # the policy that produced the first model token
    error: str | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)

    def append_observation(self, ids: Sequence[int]) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def append_model(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)


class Agent:
    """Runs episodes of one environment with one engine, tokenizer and sampling setup."""

    def __init__(
        self,
        *,
        engine: RolloutEngine,
        tokenizer: Tokenizer,
        config: AgentConfig,
        sampling: SamplingParams,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.sampling = sampling

    async def run_episode(
        self,
        env: Environment,
        *,
        episode_id: str,
        env_seed: int,
        sample_seed: int,
        env_config: Mapping[str, Any],
        timeout_s: float | None = None,
    ) -> Trajectory:
        """Play one episode to an end state; never raises for environment failures."""
        traj = Trajectory(episode_id=episode_id, policy_version=self.engine.policy_version)
        try:
            async with asyncio.timeout(timeout_s):
                await self._play(env, traj, env_seed, sample_seed, env_config)
        except TimeoutError:
            traj.end_state = "timeout"
        except _EnvFailed as exc:
            traj.end_state, traj.error = "env_error", str(exc.__cause__ or exc)
            log.warning("episode %s: environment failed: %s", episode_id, traj.error)
        finally:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await env.close(episode_id)
            except Exception:  # a failed close must not lose the episode
                log.warning("episode %s: close failed", episode_id, exc_info=True)
        return traj

    async def _play(
        self,
        env: Environment,
        traj: Trajectory,
        env_seed: int,
        sample_seed: int,
        env_config: Mapping[str, Any],
    ) -> None:
        tok, cfg = self.tokenizer, self.config
        try:
            reset = await env.reset(traj.episode_id, env_seed, env_config)
        except Exception as exc:
            raise _EnvFailed from exc
        messages: list[Message] = list(reset.messages)
        if cfg.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
        traj.append_observation(tok.render_messages(messages) + tok.assistant_prefix())
        traj.info.update(reset.info)

        while True:
            if traj.turns >= cfg.max_turns:
                traj.end_state = "truncated"
                return
            budget = min(cfg.max_new_tokens, cfg.max_context - len(traj.tokens))
            if budget < 1:
                traj.end_state = "truncated"
                return
            seed = (sample_seed * 1_000_003 + traj.turns) % (1 << 31)
            (completion,) = await self.engine.generate(
                [traj.tokens], max_new_tokens=budget, sampling=self.sampling, seeds=[seed]
            )
            if traj.turns == 0:
                traj.policy_version = completion.policy_version
            traj.append_model(completion.tokens, completion.logprobs)
            traj.turns += 1
            if completion.finish_reason != "stop":
                # The turn never ended; its text is not a finished answer to act on.
                traj.end_state = "truncated"
                return
            action = Action(content=tok.decode(completion.tokens[:-1]))
            try:
                result = await env.step(traj.episode_id, traj.turns, action)
            except Exception as exc:
                raise _EnvFailed from exc
            traj.reward += float(result.reward)
            traj.info.update(result.info)
            if result.done:
                traj.end_state = "done"
                return
            observation = tok.render_messages(result.messages) + tok.assistant_prefix()
            if len(traj.tokens) + len(observation) >= cfg.max_context:
                traj.end_state = "truncated"
                return
            traj.append_observation(observation)


class _EnvFailed(Exception):
    """Internal marker: the environment (not the agent or engine) raised."""


__all__ = ["END_STATES", "Agent", "AgentConfig", "EndState", "Trajectory"]
