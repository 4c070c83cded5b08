"""A LangGraph ReAct agent (``create_react_agent`` + ``ChatOpenAI``) trained by rlaas.

    rlaas train examples/langgraph-react.yaml --out runs/langgraph-react &
    .venv/bin/python examples/langgraph_client.py runs/langgraph-react

Each episode opens a session, points ``ChatOpenAI`` at its URL, runs the agent, and
ends the session with a reward: 1 when the last message holds the sum.
"""

from __future__ import annotations

import random
import sys
from concurrent.futures import ThreadPoolExecutor

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from sdk.errors import RlaasError
from sdk.sessions import SessionGateway


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def episode(gateway: SessionGateway, task: int) -> float:
    a, b = random.Random(task).randint(1, 50), random.Random(-task).randint(1, 50)
    with gateway.open(group=f"task-{task}", wait_s=60) as session:
        model = ChatOpenAI(model="policy", base_url=session.base_url, api_key=session.api_key)
        agent = create_react_agent(
            model.bind_tools([add], strict=True), tools=[add], prompt="Use the add tool."
        )
        result = agent.invoke({"messages": [("user", f"What is {a} + {b}?")]})
        reward = float(str(a + b) in str(result["messages"][-1].content))
        session.end(reward=reward)
    return reward


def main(out: str) -> None:
    gateway = SessionGateway.from_folder(out, wait_s=600)
    with ThreadPoolExecutor(4) as pool:
        for task in range(10_000):
            try:  # four sessions of one task: a GRPO group
                rewards = list(pool.map(episode, [gateway] * 4, [task] * 4))
            except RlaasError as exc:  # the run ended
                print(exc)
                return
            print(f"task {task}: rewards {rewards}")


if __name__ == "__main__":
    main(sys.argv[1])
