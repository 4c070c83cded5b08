"""openai-agents (0.24), as its docs write an agent, trains a sessions run.

An ``Agent`` with a default ``@function_tool`` (which sends ``strict: true``), run by
``Runner.run``, through both model classes: ``OpenAIChatCompletionsModel`` on a
session's own URL, and the default Responses model (a plain model name, resolved by an
``OpenAIProvider`` with the run's shared URL as its ``base_url``), the session named by the model
(``session:<id>``). ``tool_choice="required"`` makes the first call a tool call (the
SDK resets it to auto after a tool ran, its default), which the tiny random model
writes under the grammar; the agent then answers in text and the episode ends with a
reward.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    AgentsException,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.types.responses import ResponseFunctionToolCall

from sdk.sessions import SessionGateway
from tests.frameworks.harness import assert_trained_on_tool_calls, run_sessions

pytestmark = pytest.mark.minutes(1)


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent(model: Any, group: str) -> Agent:
    return Agent(
        name="adder",
        instructions="Answer with the sum. Use the add tool.",
        tools=[add],
        model=model,
        model_settings=ModelSettings(
            tool_choice="required", max_tokens=128, extra_headers={"X-Session-Group": group}
        ),
    )


def tool_calls(result: Any) -> list[tuple[str, str]]:
    """(name, arguments) of every tool call the model made, as the SDK received them."""
    return [
        (item.name, item.arguments)
        for response in result.raw_responses
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall)
    ]


def chat_completions_episode(gateway: SessionGateway, task: int, member: int) -> Any:
    with gateway.open(group=f"task-{task}", wait_s=60) as session:
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
        result = asyncio.run(
            Runner.run(agent(model, f"task-{task}"), "What is 3 + 4?", max_turns=4)
        )
        session.end(reward=float(bool(tool_calls(result))) + member / 10)
    return tool_calls(result)


def responses_episode(gateway: SessionGateway, task: int, member: int) -> Any:
    name = f"agents-{task}-{member}"
    # A model name, so the provider's default model class (Responses), on the run's
    # shared URL: the session is named by the model.
    # A client per episode: each runs on an event loop of its own (asyncio.run in a
    # thread), and the provider's default would share one HTTP pool between loops.
    client = AsyncOpenAI(base_url=gateway.shared_url, api_key=gateway.token, max_retries=0)
    provider = OpenAIProvider(openai_client=client)
    run = Runner.run(
        agent(f"session:{name}", f"task-{task}"),
        "What is 3 + 4?",
        max_turns=4,
        run_config=RunConfig(model_provider=provider, tracing_disabled=True),
    )
    try:
        result: Any = asyncio.run(run)
        reward = 1.0
    except AgentsException as exc:
        # The random model's text answer after the tool ran is cut at the token limit:
        # an incomplete response, which the SDK raises on (as it would for OpenAI's).
        # The episode's calls are recorded all the same; the agent failed, so 0.
        result, reward = exc.run_data, 0.0
    gateway.end(name, reward=reward + member / 10)
    return tool_calls(result)


@pytest.mark.timeout(300)
def test_an_agent_on_chat_completions_trains_a_sessions_run(tmp_path: Path) -> None:
    set_tracing_disabled(True)  # no traces sent to OpenAI
    outcome = run_sessions(tmp_path, chat_completions_episode)
    calls = [call for played in outcome.played for call in played]
    assert_trained_on_tool_calls(outcome, calls)


@pytest.mark.timeout(300)
def test_an_agent_on_the_default_responses_model_trains_a_sessions_run(tmp_path: Path) -> None:
    set_tracing_disabled(True)
    outcome = run_sessions(tmp_path, responses_episode)
    calls = [call for played in outcome.played for call in played]
    assert_trained_on_tool_calls(outcome, calls)
