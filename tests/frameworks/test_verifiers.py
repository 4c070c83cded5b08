"""A verifiers multi-turn tool environment (``vf.ToolEnv``, verifiers 0.3) trains a run.

Written as verifiers documents an environment (a dataset, a tool, a rubric) and run
with its own ``evaluate`` against one endpoint: a ``ClientConfig`` whose base URL is the
run's shared URL (one client for every rollout), the session of each call named by
verifiers' own routing header, ``X-Session-ID`` from the rollout's ``trajectory_id``,
and its GRPO group by ``X-Session-Group`` from the ``example_id`` (its
``extra_headers_from_state``). ``tool_choice: "required"`` in the sampling args makes
every turn a call (written by the tiny random model under the grammar) and
``max_turns`` ends the rollout. After ``evaluate``, each rollout's rubric reward ends
its session.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import verifiers as vf
from datasets import Dataset

from rl_core.agent.toolcalls import scan_tool_calls
from sdk.sessions import SessionGateway
from tests.frameworks.harness import GROUP, assert_trained_on_tool_calls, run_sessions

pytestmark = pytest.mark.minutes(1)

TOKEN_VAR = "RLAAS_FRAMEWORKS_RUN_TOKEN"  # verifiers reads the key from an environment variable


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def used_the_tool(completion: Any, answer: str) -> float:
    """The rubric: 1 when a tool result in the rollout is the answer."""
    return float(any(m.get("role") == "tool" and m.get("content") == answer for m in completion))


def environment(task: int) -> vf.ToolEnv:
    # example_id: the task, so each task's rollouts name a group of their own.
    row = {"example_id": task, "question": f"What is {task} + 4?", "answer": str(task + 4)}
    dataset = Dataset.from_list([row])
    return vf.ToolEnv(
        dataset=dataset,
        eval_dataset=dataset,
        tools=[add],
        rubric=vf.Rubric(funcs=[used_the_tool]),
        max_turns=2,
    )


def episode_group(
    env: vf.ToolEnv, gateway: SessionGateway, member: int, calls: list[tuple[str, Any]]
) -> None:
    """One example's rollouts (a GRPO group), played by verifiers; member 0 plays them.
    The calls each rollout received go to ``calls`` before its session ends (the run may
    end, and this raise, between two rollouts' ends)."""
    if member:
        return
    config = vf.ClientConfig(
        api_base_url=gateway.shared_url,
        api_key_var=TOKEN_VAR,
        max_retries=0,
        extra_headers_from_state={"X-Session-ID": "trajectory_id", "X-Session-Group": "example_id"},
    )
    # The async form: the sync one starts its own loop with signal handlers.
    results = asyncio.run(
        env.evaluate(
            client=config,
            model="policy",
            num_examples=1,
            rollouts_per_example=GROUP,
            sampling_args={"max_tokens": 128, "tool_choice": "required"},
            state_columns=["trajectory_id"],
        )
    )
    for output in results["outputs"]:
        for message in output.get("completion") or ():
            for call in message.get("tool_calls") or ():
                # Saved outputs hold each call as JSON text (verifiers' sanitize_tool_calls).
                data = json.loads(call) if isinstance(call, str) else call
                data = data.get("function", data)
                calls.append((data["name"], data["arguments"]))
            # A turn cut at the token limit is text, not a call (finish_reason
            # "length"), even when its call was whole and only the end of the turn was
            # cut off: the client received the model's call as content.
            for block in scan_tool_calls(str(message.get("content") or "")):
                if block.name is not None:
                    calls.append((block.name, block.arguments_text))
        if output.get("error") is not None:
            # A rollout verifiers aborted (its completion is not kept): not scored, as
            # a failed agent's session is cancelled rather than given a made-up reward.
            gateway.cancel(output["trajectory_id"])
        else:
            gateway.end(output["trajectory_id"], reward=float(output["reward"]))


@pytest.mark.timeout(300)
def test_a_verifiers_tool_environment_trains_a_sessions_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Built here: a verifiers environment installs signal handlers, which only the main
    # thread may (the clients play in threads beside the run).
    envs = [environment(task) for task in range(8)]

    calls: list[tuple[str, Any]] = []

    def episode(gateway: SessionGateway, task: int, member: int) -> None:
        monkeypatch.setenv(TOKEN_VAR, gateway.token)
        episode_group(envs[task % len(envs)], gateway, member, calls)

    outcome = run_sessions(tmp_path, episode)
    assert_trained_on_tool_calls(outcome, calls)
