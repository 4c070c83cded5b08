"""A LangGraph ReAct agent (``create_react_agent`` + ``ChatOpenAI``) trains a sessions run.

As LangGraph's docs write one, pointed at a session's URL: ``ChatOpenAI(base_url=...,
api_key=...)`` with its tools bound strictly and a forced ``tool_choice``
(``bind_tools(tools, tool_choice="required", strict=True)``, so that the tiny random
model's first answer is a call, written under the grammar), and a ``return_direct``
tool, so the agent ends once the tool ran rather than call it forever. LangChain keeps
a call's arguments parsed, so they are compared as JSON with the stored call's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from sdk.sessions import SessionGateway
from tests.frameworks.harness import assert_trained_on_tool_calls, run_sessions

pytestmark = pytest.mark.minutes(1)


def episode(gateway: SessionGateway, task: int, member: int) -> list[tuple[str, Any]]:
    received: list[tuple[str, Any]] = []

    @tool(return_direct=True)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        received.append(("add", {"a": a, "b": b}))
        return a + b

    with gateway.open(group=f"task-{task}", wait_s=60) as session:
        model = ChatOpenAI(
            model="policy",
            base_url=session.base_url,
            api_key=session.api_key,  # type: ignore[arg-type]
            max_tokens=128,  # type: ignore[call-arg]
            max_retries=0,
        )
        agent = create_react_agent(
            model.bind_tools([add], tool_choice="required", strict=True),
            tools=[add],
            prompt="Answer with the sum. Use the add tool.",
        )
        result = agent.invoke({"messages": [("user", "What is 3 + 4?")]})
        answer = result["messages"][-1].content
        session.end(reward=float(answer == "7") + member / 10)
    return received


@pytest.mark.timeout(300)
def test_a_langgraph_react_agent_trains_a_sessions_run(tmp_path: Path) -> None:
    outcome = run_sessions(tmp_path, episode)
    calls = [call for played in outcome.played for call in played]
    assert_trained_on_tool_calls(outcome, calls, parsed=True)
