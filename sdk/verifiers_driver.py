"""Train on a verifiers environment: its dataset, its rollout loop, its rubric's reward.

verifiers (PyPI ``verifiers``, 0.3.x; ``import verifiers as vf``) writes an
environment as a dataset of prompts, a rollout loop (``SingleTurnEnv``,
``MultiTurnEnv``, ``ToolEnv``, ...) that calls a model through an OpenAI-compatible
client, and a ``Rubric`` that scores the finished rollout. This driver plays it
against a ``sessions`` run, changing nothing in it:

- for each prompt of the environment's dataset, ``group_size`` sessions of one
  group (GRPO's group: the same prompt), each opened on the run's gateway;
- each rollout gets its own client, an ``AsyncOpenAI`` on its session's base URL
  and key (wrapped in ``vf.OpenAIChatCompletionsClient``), so every call the
  rollout loop makes lands in that session, tools and all;
- verifiers scores the rollout with its rubric (``Environment.run_rollout``), and
  the session ends with that reward. A rollout that failed (verifiers records the
  error; the model call was refused, a tool raised) is cancelled instead: a made-up
  reward would teach the policy something false.

Rubrics score each rollout alone (``score_rollout``): a rubric whose reward needs
the whole group (``score_group``, e.g. a pairwise judge) is not served yet.

::

    from sdk.sessions import SessionGateway
    from sdk.verifiers_driver import drive

    env = vf.load_environment("my-env")           # or your own vf.Environment
    played = asyncio.run(drive(SessionGateway.for_run(url, key, run_id), env, group_size=8))

``rlaas verifiers run --run RUN_ID --env MODULE:FUNC`` does the same from the shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from sdk.errors import RlaasError
from sdk.sessions import Session, SessionGateway


@dataclasses.dataclass(frozen=True)
class Played:
    """One rollout: its example, its session, and how it ended (``reward`` None when it
    was cancelled; ``error`` says why)."""

    example_id: int
    session_id: str
    reward: float | None
    error: str | None = None


def load(target: str, args: Mapping[str, Any] | None = None) -> Any:
    """A verifiers environment: ``MODULE:FUNC`` called with ``args``, or an installed
    environment's id (``vf.load_environment(id, **args)``)."""
    import verifiers as vf

    if ":" in target:
        module_name, _, attr = target.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise RlaasError(
                f"--env {target}: cannot load {attr} from {module_name}: {exc}"
            ) from None
        env = factory(**dict(args or {})) if callable(factory) else factory
    else:
        env = vf.load_environment(target, **dict(args or {}))
    if not isinstance(env, vf.Environment):
        raise RlaasError(f"--env {target} gave a {type(env).__name__}, not a vf.Environment")
    return env


async def drive(
    gateway: SessionGateway,
    env: Any,
    *,
    group_size: int,
    rollouts: int | None = None,
    concurrency: int = 8,
    examples: int = -1,
    model: str = "policy",
    sampling_args: Mapping[str, Any] | None = None,
    open_wait_s: float = 60.0,
    on_played: Callable[[Played], None] | None = None,
) -> list[Played]:
    """Play ``env``'s rollouts on ``gateway``'s run, ``group_size`` per prompt, the
    dataset's first ``examples`` prompts (all: -1) round and round, until ``rollouts``
    have been played or the run stops opening sessions (it finished, or failed)."""
    dataset = env.get_dataset(n=examples).to_list()
    if not dataset:
        raise RlaasError("the verifiers environment's dataset is empty")
    limit = math.inf if rollouts is None else rollouts
    slots = asyncio.Semaphore(concurrency)
    played: list[Played] = []
    over = asyncio.Event()  # the run opens no more sessions
    started = 0

    async def one(example: dict[str, Any], group: str) -> None:
        try:
            try:
                session = await asyncio.to_thread(gateway.open, group, wait_s=open_wait_s)
            except (RlaasError, httpx.HTTPError):
                over.set()  # the run ended, or serves nobody: nothing more to play
                return
            result = await _rollout(env, session, example, model, dict(sampling_args or {}))
            played.append(result)
            if on_played is not None:
                on_played(result)
        finally:
            slots.release()

    async with asyncio.TaskGroup() as tasks:
        for round_ in itertools.count():
            for example in dataset:
                group = f"vf-{example['example_id']}-r{round_}"
                for _ in range(group_size):
                    await slots.acquire()
                    if over.is_set() or started >= limit:
                        slots.release()
                        return played
                    started += 1
                    tasks.create_task(one(example, group))
    return played  # pragma: no cover (the loop above returns)


async def _rollout(
    env: Any, session: Session, example: dict[str, Any], model: str, sampling: dict[str, Any]
) -> Played:
    """One verifiers rollout through ``session``, scored by the environment's rubric."""
    import openai
    import verifiers as vf

    native = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    example_id = int(example["example_id"])
    try:
        output = await env.run_rollout(
            example, vf.OpenAIChatCompletionsClient(native), model, sampling
        )
        error = output.get("error")
        if error:
            why = error.get("error_chain_repr") if isinstance(error, dict) else str(error)
            await asyncio.to_thread(_cancel_quietly, session)
            return Played(example_id, session.session_id, None, f"cancelled: {why}")
        reward = float(output["reward"])
        await asyncio.to_thread(session.end, reward)
        return Played(example_id, session.session_id, reward)
    except Exception as exc:
        if not session.ended:
            await asyncio.to_thread(_cancel_quietly, session)
        return Played(example_id, session.session_id, None, f"cancelled: {exc!r}")
    finally:
        await native.close()


def _cancel_quietly(session: Session) -> None:
    # The run may be gone: the session times out there anyway.
    with contextlib.suppress(Exception):
        session.cancel()


__all__ = ["Played", "drive", "load"]
