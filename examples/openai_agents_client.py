"""An openai-agents ``Agent`` trained by rlaas: the SDK's own code, a session per episode.

    rlaas train examples/openai-agents.yaml --out runs/openai-agents &
    .venv/bin/python examples/openai_agents_client.py runs/openai-agents [--responses]

Each episode opens a session (a task's group of ``group_size``), runs the agent on
it, and ends it with a reward: 1 when the final answer holds the sum. Chat
Completions by default (``OpenAIChatCompletionsModel`` on the session's URL); with
``--responses`` the SDK's default Responses model on the run's shared URL, the
session named by the model (``session:<id>``).
"""

from __future__ import annotations

import asyncio
import random
import sys
import uuid

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

from sdk.errors import RlaasError
from sdk.sessions import SessionGateway


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent(model: object, task: str) -> Agent:
    return Agent(
        name="adder",
        instructions="Use the add tool, then answer with the sum only.",
        tools=[add],
        model=model,  # type: ignore[arg-type]
        model_settings=ModelSettings(extra_headers={"X-Session-Group": task}),
    )


async def episode(gateway: SessionGateway, task: int, responses: bool) -> float:
    a, b = random.Random(task).randint(1, 50), random.Random(-task).randint(1, 50)
    question = f"What is {a} + {b}?"
    if responses:
        name = uuid.uuid4().hex  # this episode's session, named by the model
        client = AsyncOpenAI(base_url=gateway.shared_url, api_key=gateway.token)
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
        try:
            result = await Runner.run(
                agent(f"session:{name}", f"task-{task}"), question, run_config=config
            )
            reward = float(str(a + b) in str(result.final_output))
        except AgentsException:
            reward = 0.0
        gateway.end(name, reward=reward)
        return reward
    with gateway.open(group=f"task-{task}", wait_s=60) as session:
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key)
        model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
        result = await Runner.run(agent(model, f"task-{task}"), question)
        reward = float(str(a + b) in str(result.final_output))
        session.end(reward=reward)
    return reward


async def main(out: str, responses: bool) -> None:
    set_tracing_disabled(True)  # traces would go to OpenAI
    gateway = SessionGateway.from_folder(out, wait_s=600)
    for task in range(10_000):
        try:  # four sessions of one task: a GRPO group
            rewards = await asyncio.gather(*(episode(gateway, task, responses) for _ in range(4)))
        except RlaasError as exc:  # the run ended
            print(exc)
            return
        print(f"task {task}: rewards {rewards}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], "--responses" in sys.argv))
