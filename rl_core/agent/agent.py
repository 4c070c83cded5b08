"""The agent: plays one episode and keeps its token ledger (`rl_core.agent.ledger`).

Each turn the agent renders the whole conversation with the chat template,
asks the engine to continue it, parses the reply (tool calls in the
``<tool_call>{json}</tool_call>`` format of Qwen/Hermes templates, or plain
text) and hands the action to the environment. The model's tokens go into the
ledger exactly as sampled; what the template renders after them (the
observation, the next assistant prefix) is appended only if the new rendering
extends the old one, else a new training sample starts (see the ledger).

Every episode ends in one explicit state, with a reason:

- ``done`` (``env_done``): the environment said so;
- ``truncated``: a limit ended it first: ``max_turns``, ``max_context``,
  ``max_new_tokens`` (a turn that never ended, unless ``cut_turn`` is ``send``: then
  the cut turn is the action, the template closes it, and the episode goes on),
  ``max_episode_tokens``,
  ``max_episode_s`` (checked between turns), ``turn_timeout_s`` (a model call
  that took too long; its partial turn is discarded);
- ``timeout``: ``episode_timeout`` (the hard deadline of the whole episode) or
  ``env_timeout`` (one environment call past ``env_timeout_s``);
- ``env_error`` (``env_reset`` / ``env_step``): the environment raised;
- ``cancelled``: the run stopped while the episode was in flight.

The last three are not the policy's doing; the collector removes such episodes
from the batch and counts them, it never scores them 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any, Literal

from rl_core.agent.ledger import END_STATES, Sample, Trajectory
from rl_core.agent.toolcalls import parse_tool_calls
from rl_core.envs.base import Action, Environment, Message
from rl_core.envs.errors import FailureBudgetExhausted
from rl_core.errors import SandboxRefused
from rl_core.host.telemetry import SpanRecorder, now_us
from rl_core.models.tokenizer import Tokenizer
from rl_core.rollout.base import Completion, RolloutEngine, SamplingParams

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig:
    max_turns: int = 8
    max_new_tokens: int = 64  # per turn
    max_context: int = 1024  # tokens of one sample
    system_prompt: str | None = None
    tool_call_format: Literal["hermes", "none"] = "hermes"
    max_episode_tokens: int | None = None  # model tokens over all turns
    max_episode_s: float | None = None
    turn_timeout_s: float | None = None
    env_timeout_s: float = 300.0
    # A turn cut at max_new_tokens: "end" the episode there (truncated, the rewards so
    # far), or "send" its text to the environment as the turn's action, which scores it
    # as it scores any answer (a game's invalid move, a wrong format), and go on.
    cut_turn: Literal["end", "send"] = "end"


class Agent:
    """Runs episodes of one environment with one engine, tokenizer and sampling setup."""

    def __init__(
        self,
        *,
        engine: RolloutEngine,
        tokenizer: Tokenizer,
        config: AgentConfig,
        sampling: SamplingParams,
        recorder: SpanRecorder | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.sampling = sampling
        self.recorder = recorder or SpanRecorder()
        self._warned_cut = False  # an observation past max_context is logged once per run

    async def run_episode(
        self,
        env: Environment,
        *,
        episode_id: str,
        env_seed: int,
        sample_seed: int,
        env_config: Mapping[str, Any],
        timeout_s: float | None = None,
        into: Trajectory | None = None,
    ) -> Trajectory:
        """Play one episode to an end state; never raises for environment failures.

        ``into`` is filled in place (the collector watches it while it runs).
        Cancellation ends it as ``cancelled``, closes the environment, and
        propagates.
        """
        traj = into or Trajectory(episode_id=episode_id)
        traj.policy_version = self.engine.policy_version
        traj.started = time.monotonic()  # the episode's own time, not its wait for a slot
        traj.sampling = {
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "top_k": self.sampling.top_k,
        }
        start_us, t0 = now_us(), time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                await self._play(env, traj, env_seed, sample_seed, env_config)
        except TimeoutError:
            traj.end("timeout", "episode_timeout")
        except _EnvFailed as exc:
            traj.error = str(exc.__cause__ or exc)
            if isinstance(exc.__cause__, _EnvTimedOut):
                traj.end("timeout", "env_timeout")
            else:
                traj.end("env_error", exc.call)
                log.warning("episode %s: environment failed: %s", episode_id, traj.error)
        except asyncio.CancelledError:
            traj.end("cancelled", "cancelled")
            await self._close_regardless(env, traj)
            raise
        except BaseException:  # the run's own failure (FailureBudgetExhausted) ends the run
            await self._close_regardless(env, traj)
            raise
        await self._close(env, traj)
        self.recorder.add(
            "rollout",
            start_us=start_us,
            dur_us=int((time.perf_counter() - t0) * 1e6),
            track=f"episode/{episode_id}",
            step=traj.policy_version,
            args={"end_state": traj.end_state, "turns": traj.turns},
        )
        return traj

    async def _close_regardless(self, env: Environment, traj: Trajectory) -> None:
        """The close of an episode the run abandons (it stops or fails): it goes out even
        if this task is cancelled again meanwhile, as a failing run's task groups cancel
        their children once more; `_close` bounds it by ``CLOSE_TIMEOUT_S``. The protocol
        promises a close after every reset, whatever happened."""
        closing = asyncio.ensure_future(self._close(env, traj))
        while not closing.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(closing)

    async def _close(self, env: Environment, traj: Trajectory) -> None:
        try:
            with self._span("env_step", traj, call="close"):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await env.close(traj.episode_id)
        except Exception:  # a failed close must not lose the episode
            log.warning("episode %s: close failed", traj.episode_id, exc_info=True)

    async def _play(
        self,
        env: Environment,
        traj: Trajectory,
        env_seed: int,
        sample_seed: int,
        env_config: Mapping[str, Any],
    ) -> None:
        tok, cfg = self.tokenizer, self.config
        started = time.monotonic()
        reset = await self._env_call(
            traj, "reset", env.reset(traj.episode_id, env_seed, env_config)
        )
        messages: list[Message] = list(reset.messages)
        if cfg.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
        traj.info.update(reset.info)
        prompt = tok.render_messages(messages) + tok.assistant_prefix()
        if len(prompt) >= cfg.max_context:
            self._observation_cut(traj, len(prompt), 0, _chars(reset.messages))
            traj.end("truncated", "max_context")
            return
        traj.sample.append_observation(prompt)

        while True:
            if traj.turns >= cfg.max_turns:
                return traj.end("truncated", "max_turns")
            if cfg.max_episode_s is not None and time.monotonic() - started >= cfg.max_episode_s:
                return traj.end("truncated", "max_episode_s")
            left = cfg.max_context - len(traj.sample.tokens)
            episode_left = (
                cfg.max_episode_tokens - traj.model_tokens
                if cfg.max_episode_tokens is not None
                else cfg.max_new_tokens
            )
            budget = min(cfg.max_new_tokens, left, episode_left)
            if budget < 1:
                return traj.end("truncated", _budget_reason(cfg, left, episode_left))
            completion = await self._model_call(traj, budget, sample_seed)
            if completion is None:
                return traj.end("truncated", "turn_timeout_s")
            traj.sample.append_model(completion.tokens, completion.logprobs, traj.turns)
            traj.turns += 1
            cut = completion.finish_reason != "stop"
            if cut:
                # The turn never ended: not a finished answer to act on, unless the spec
                # sends it as it is (only a turn cut by its own limit: past the context's
                # or the episode's budget there is no next turn to play).
                reason = _budget_reason(cfg, left, episode_left, budget)
                if cfg.cut_turn != "send" or reason != "max_new_tokens":
                    return traj.end("truncated", reason)
                traj.info["cut_turns"] = int(traj.info.get("cut_turns", 0)) + 1
            text = tok.decode(completion.tokens if cut else completion.tokens[:-1])
            action, notes = self._parse(text, traj.turns)
            result = await self._env_call(
                traj, "step", env.step(traj.episode_id, traj.turns, action), turn=traj.turns
            )
            traj.reward += float(result.reward)
            traj.turn_rewards.append(float(result.reward))
            traj.info.update(result.info)
            if result.done:
                with self._span("reward", traj, turn=traj.turns):
                    traj.info["env_reward"] = traj.reward
                return traj.end("done", "env_done")
            spoken = [*messages, {"role": "assistant", "content": text}]
            messages = [*spoken, *notes, *result.messages]
            over = self._extend(traj, tok.render_messages(spoken), prompt, messages, cut)
            if over is not None:
                self._observation_cut(traj, over, len(traj.sample.tokens), _chars(result.messages))
                return traj.end("truncated", "max_context")
            prompt = tok.render_messages(messages) + tok.assistant_prefix()

    def _extend(
        self,
        traj: Trajectory,
        spoken: list[int],
        prompt: list[int],
        messages: list[Message],
        cut: bool = False,
    ) -> int | None:
        """Append the observation to the ledger, or start a new sample: None; past
        max_context, the observation's length in tokens (it was not appended). ``cut``:
        the model's turn was cut before its end-of-turn token, which the template writes
        and the observation then carries (untrained: the model did not say it)."""
        tok = self.tokenizer
        following = tok.render_messages(messages) + tok.assistant_prefix()
        extends = spoken[: len(prompt)] == prompt and following[: len(spoken)] == spoken
        if extends:
            # The model stopped at its end-of-turn token; what the template writes after
            # that token (SmolLM2's "\n") is not in the ledger yet, so it leads the
            # observation: the next prompt is then exactly the template's rendering.
            trailer = _after_last(spoken, tok.end_of_turn_id)
            ended = traj.sample.tokens[-1:] == [tok.end_of_turn_id]
            closing = trailer if ended else [tok.end_of_turn_id, *trailer] if cut else []
            observation = closing + following[len(spoken) :]
            if len(traj.sample.tokens) + len(observation) >= self.config.max_context:
                return len(observation)
            traj.sample.append_observation(observation)
            return None
        # The template rewrote history: the model's next context is a new sequence.
        if len(following) >= self.config.max_context:
            return len(following)
        traj.samples.append(Sample())
        traj.sample.append_observation(following)
        return None

    def _observation_cut(self, traj: Trajectory, tokens: int, held: int, chars: int) -> None:
        """An observation that does not fit in what is left of ``max_context`` ends the
        episode ``truncated`` (``max_context``) before the model sees it. Said three
        ways, as the environment's author needs it: the episode's info
        (``observation_truncated``), a per-step count (``env/observation_truncated``,
        from that info) and one warning per run with the sizes and the limit."""
        limit = self.config.max_context
        traj.info["observation_truncated"] = {
            "turn": traj.turns,
            "tokens": tokens,
            "chars": chars,
            "context_tokens": held,
            "max_context": limit,
        }
        if self._warned_cut:
            return
        self._warned_cut = True
        log.warning(
            "episode %s: the environment's %s (%d characters, %d tokens) does not fit "
            "agent.max_context=%d tokens (%d already in context): the episode ends truncated "
            "(max_context) before the model sees it. Raise agent.max_context or send less; "
            "counted per step as env/observation_truncated, logged once per run",
            traj.episode_id,
            f"observation after step {traj.turns}" if traj.turns else "reset observation",
            chars,
            tokens,
            limit,
            held,
        )

    def _parse(self, text: str, turn: int) -> tuple[Action, list[Message]]:
        if self.config.tool_call_format == "none":
            return Action(content=text), []
        parsed = parse_tool_calls(text, id_prefix=f"t{turn}")
        return parsed.to_action(), parsed.error_messages()

    async def _model_call(
        self, traj: Trajectory, budget: int, sample_seed: int
    ) -> Completion | None:
        seed = (sample_seed * 1_000_003 + traj.turns) % (1 << 31)
        traj.enter("model_call")
        with self._span("model_call", traj, turn=traj.turns + 1) as args:
            try:
                async with asyncio.timeout(self.config.turn_timeout_s):
                    (completion,) = await self.engine.generate(
                        [traj.sample.tokens],
                        max_new_tokens=budget,
                        sampling=self.sampling,
                        seeds=[seed],
                    )
            except TimeoutError:
                args["timed_out"] = True
                return None
            args["tokens"] = len(completion.tokens)
        if traj.turns == 0:
            traj.policy_version = completion.policy_version
        traj.turn_versions.append(completion.policy_version)
        return completion

    async def _env_call(self, traj: Trajectory, call: str, aw: Any, *, turn: int = 0) -> Any:
        traj.enter("env_step")
        with self._span("env_step", traj, call=call, turn=turn):
            try:
                async with asyncio.timeout(self.config.env_timeout_s):
                    return await aw
            except TimeoutError as exc:
                late = _EnvTimedOut(
                    f"environment {call} took longer than env_timeout_s="
                    f"{self.config.env_timeout_s}; raise agent.env_timeout_s"
                )
                late.__cause__ = exc
                raise _EnvFailed(f"env_{call}") from late
            except (FailureBudgetExhausted, SandboxRefused):
                raise  # not this episode's failure: the run's, so it must end the run
            except Exception as exc:
                raise _EnvFailed(f"env_{call}") from exc

    def _span(self, name: str, traj: Trajectory, **args: Any) -> Any:
        return self.recorder.span(
            name, track=f"episode/{traj.episode_id}", step=traj.policy_version, **args
        )


def _budget_reason(
    cfg: AgentConfig, context_left: int, episode_left: int, budget: int | None = None
) -> str:
    """Which limit bound the turn's token budget (the one that ended the episode)."""
    bound = min(cfg.max_new_tokens, context_left, episode_left) if budget is None else budget
    if bound == context_left and context_left < cfg.max_new_tokens:
        return "max_context"
    if cfg.max_episode_tokens is not None and bound == episode_left < cfg.max_new_tokens:
        return "max_episode_tokens"
    return "max_new_tokens"


class _EnvFailed(Exception):
    """Internal marker: the environment (not the agent or engine) failed; ``call`` says where."""

    def __init__(self, call: str) -> None:
        super().__init__(call)
        self.call = call


class _EnvTimedOut(Exception):
    pass


def _chars(messages: list[Message]) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages)


def _after_last(ids: list[int], token: int) -> list[int]:
    """The ids after the last ``token`` in ``ids`` ([] if it is last or absent)."""
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            return ids[i + 1 :]
    return []


__all__ = ["END_STATES", "Agent", "AgentConfig", "Trajectory"]
