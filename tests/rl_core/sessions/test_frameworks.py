"""What real client libraries send, served over loopback: the official ``openai`` 3.x client
and LangChain's ``ChatOpenAI`` (what LangGraph agents call), unchanged from their documented
usage, against the session gateway (`worker.gateway`, a `SessionBroker`, `ScriptedEngine`).

Each client's HTTP requests are captured as they leave it (an httpx event hook), so each
test shows both what the framework sends and that it is served: the engine is asked
for the grammar, sampler and alternatives the request implies, the answer parses in the
client's own types, and the session's trajectory holds the sampled tokens.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from rl_core.agent.ledger import Trajectory
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.broker import SessionBroker
from rl_core.sessions.session import SessionConfig
from sdk.sessions import Session, SessionGateway
from worker.gateway import serve_gateway

TOKEN = "run-token-of-the-frameworks-test"
TOK = BuiltinTokenizer()
ARGUMENTS = '{"a": 3,  "b":4}'  # odd spacing: it must come back as sampled


def call_text(name: str, arguments: str = ARGUMENTS) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


class Loopback:
    """A gateway and its broker on an event loop in a thread; ``episodes`` slots offered,
    each its own group; the engine answers the n-th call with ``replies[n]``."""

    def __init__(self, replies: list[str], episodes: int = 4) -> None:
        tokens = [[*TOK.encode(r), TOK.end_of_turn_id] for r in replies]
        self.engine = ScriptedEngine(tokens, stop_ids=[TOK.end_of_turn_id])
        config = SessionConfig(sampling=SamplingParams(temperature=1.0), max_new_tokens=256)
        self.broker = SessionBroker(engine=self.engine, tokenizer=TOK, config=config, group_size=1)
        self.finished: list[Trajectory] = []
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self.loop.run_until_complete, args=(self._main(episodes),)
        )
        self._thread.start()
        assert self._ready.wait(10), "the gateway did not start"

    async def _main(self, episodes: int) -> None:
        self._stop = asyncio.Event()
        async with serve_gateway(self.broker, token=TOKEN) as url:
            self.url = url
            tasks = [asyncio.create_task(self._episode(g)) for g in range(episodes)]
            self._ready.set()
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _episode(self, group: int) -> None:
        traj = Trajectory(episode_id=f"g{group}", group=group, member=0)
        await self.broker.play(traj, timeout_s=30)
        self.finished.append(traj)

    def open(self) -> Session:
        return SessionGateway(self.url, TOKEN).open()

    def trajectory(self, session_id: str) -> Trajectory:
        for _ in range(200):
            found = [t for t in self.finished if t.episode_id == session_id]
            if found:
                return found[0]
            threading.Event().wait(0.05)
        raise AssertionError(f"session {session_id} did not finish")

    def close(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def loopback(request: pytest.FixtureRequest) -> Iterator[Loopback]:
    served = Loopback(request.param)
    try:
        yield served
    finally:
        served.close()


class Captured:
    """The JSON bodies a client sends, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def hook(self, request: httpx.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.bodies.append(json.loads(request.read()))

    async def async_hook(self, request: httpx.Request) -> None:
        self.hook(request)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"request": [self.hook]})


ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("loopback", [[call_text("add"), "It is 7."]], indirect=True)
def test_openai_3_strict_forced_tool_greedy_and_echoed_back(loopback: Loopback) -> None:
    assert int(openai.__version__.split(".")[0]) >= 3
    captured = Captured()
    session = loopback.open()
    client = session.openai(http_client=captured.client())
    messages: list[Any] = [{"role": "user", "content": "What is 3 + 4?"}]
    first = client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=[ADD_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        store=False,
        metadata={"task": "sum"},
        user="u-1",
        safety_identifier="hashed",
        prompt_cache_key="k",
        service_tier="auto",
        reasoning_effort="low",
        verbosity="low",
        modalities=["text"],
    )
    (call,) = first.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert (call.function.name, call.function.arguments) == ("add", ARGUMENTS)
    assert first.choices[0].finish_reason == "tool_calls"
    content = (first.choices[0].logprobs and first.choices[0].logprobs.content) or []
    assert len(content[0].top_logprobs) == 2
    asked = loopback.engine.calls[0]
    assert asked["sampling"].temperature == 0.0 and asked["top_logprobs"] == 2
    assert asked["grammars"] is not None and "%json" in asked["grammars"][0].lark

    # Echoed back as the client holds it, with a provider's reasoning beside it (verifiers).
    echoed = {**first.choices[0].message.model_dump(exclude_none=True), "reasoning_content": ""}
    messages += [echoed, {"role": "tool", "tool_call_id": call.id, "content": "7"}]
    second = client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL])  # type: ignore[list-item]
    assert second.choices[0].message.content == "It is 7."
    assert session.end(reward=1.0)["prefix_breaks"] == 0

    traj = loopback.trajectory(session.session_id)
    p0, c0 = loopback.engine.prompts[0], [*TOK.encode(call_text("add")), TOK.end_of_turn_id]
    assert traj.tokens[: len(p0) + len(c0)] == p0 + c0  # token-exact, one sample
    # Both calls offer a strict tool, so both are constrained; only the first was greedy.
    assert traj.info["constrained"] == 2
    assert [c["temperature"] for c in traj.info["call_samplers"]] == [0.0]

    sent = captured.bodies[0]
    assert sent["tools"][0]["function"]["strict"] is True and sent["parallel_tool_calls"] is False
    assert sent["tool_choice"] == "required" and sent["temperature"] == 0


class Sum(BaseModel):
    a: int
    b: int


@pytest.mark.parametrize("loopback", [['{"a": 3, "b": 4}']], indirect=True)
def test_openai_3_parse_with_a_pydantic_response_format(loopback: Loopback) -> None:
    captured = Captured()
    client = loopback.open().openai(http_client=captured.client())
    parsed = client.chat.completions.parse(
        model="policy",
        messages=[{"role": "user", "content": "Split 7."}],
        response_format=Sum,
    )
    assert parsed.choices[0].message.parsed == Sum(a=3, b=4)
    fmt = captured.bodies[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert loopback.engine.calls[0]["grammars"] is not None


@pytest.mark.parametrize("loopback", [["7"]], indirect=True)
def test_openai_3_n_above_one_is_refused_saying_what_to_do(loopback: Loopback) -> None:
    client = loopback.open().openai()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], n=2, logit_bias={"1": 3}
        )
    body: dict[str, Any] = caught.value.body  # type: ignore[assignment]
    assert body["param"] == "n" and "2 problems" in body["message"]
    assert "same group name" in body["message"] and "'logit_bias'" in body["message"]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def chat_model(session: Session, captured: Captured, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model="policy",
        base_url=session.base_url,
        api_key=session.api_key,  # type: ignore[arg-type]
        http_client=captured.client(),
        max_retries=0,
        **options,
    )


@pytest.mark.parametrize("loopback", [[call_text("add"), "It is 7."]], indirect=True)
def test_langchain_strict_tools_forced_greedy_with_penalty(loopback: Loopback) -> None:
    captured = Captured()
    session = loopback.open()
    model = chat_model(session, captured, temperature=0, frequency_penalty=0.5)
    bound = model.bind_tools([add], strict=True, tool_choice="add")
    history: list[Any] = [HumanMessage("What is 3 + 4?")]
    reply = bound.invoke(history)
    (call,) = reply.tool_calls
    assert (call["name"], call["args"]) == ("add", {"a": 3, "b": 4})
    # LangGraph's ToolNode step, then the model again: LangChain re-serialises the
    # arguments it echoes, and the session still renders the model's own tokens.
    history += [reply, ToolMessage("7", tool_call_id=call["id"])]
    final = bound.invoke(history)
    assert final.content == "It is 7."
    assert session.end(reward=1.0)["prefix_breaks"] == 0

    first, second = captured.bodies
    assert first["tools"][0]["function"]["strict"] is True
    assert first["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert (first["temperature"], first["frequency_penalty"]) == (0, 0.5)
    echoed = second["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert echoed != ARGUMENTS and json.loads(echoed) == json.loads(ARGUMENTS)
    used = loopback.engine.calls[0]["sampling"]
    assert (used.temperature, used.frequency_penalty) == (0.0, 0.5)
    traj = loopback.trajectory(session.session_id)
    assert traj.info["prefix_breaks"] == 0 and len(traj.samples) == 1


@pytest.mark.parametrize(
    ("loopback", "method"),
    [
        (['{"a": 3, "b": 4}'], "json_schema"),
        ([call_text("Sum")], "function_calling"),
        (['{"a": 3, "b": 4}'], "json_mode"),
    ],
    indirect=["loopback"],
)
def test_langchain_structured_output_every_method(loopback: Loopback, method: str) -> None:
    captured = Captured()
    model = chat_model(loopback.open(), captured)
    structured = model.with_structured_output(Sum, method=method)  # type: ignore[arg-type]
    prompt = "Split 7 into a and b; answer in JSON with keys a and b."
    assert structured.invoke(prompt) == Sum(a=3, b=4)
    sent = captured.bodies[0]
    if method == "function_calling":
        assert sent["tool_choice"]["function"]["name"] == "Sum"
        assert sent["parallel_tool_calls"] is False
    else:
        kind = "json_schema" if method == "json_schema" else "json_object"
        assert sent["response_format"]["type"] == kind
    assert loopback.engine.calls[0]["grammars"] is not None


@pytest.mark.parametrize("loopback", [[call_text("add_numbers"), "It is 7."]], indirect=True)
def test_openai_agents_chat_completions_model_with_a_default_function_tool(
    loopback: Loopback,
) -> None:
    """openai-agents' ``OpenAIChatCompletionsModel``: ``@function_tool`` sends ``strict: true``."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no export to OpenAI's tracing service

    @function_tool
    def add_numbers(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    captured = Captured()
    session = loopback.open()
    client = openai.AsyncOpenAI(
        base_url=session.base_url,
        api_key=session.api_key,
        http_client=httpx.AsyncClient(event_hooks={"request": [captured.async_hook]}),
    )
    agent = Agent(
        name="adder",
        instructions="Add with the tool.",
        tools=[add_numbers],
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        model_settings=ModelSettings(temperature=0.3, parallel_tool_calls=False, top_logprobs=2),
    )
    result = asyncio.run(Runner.run(agent, "What is 3 + 4?"))
    assert result.final_output == "It is 7."
    assert session.end(reward=1.0)["prefix_breaks"] == 0

    first = captured.bodies[0]
    assert first["tools"][0]["function"]["strict"] is True
    assert first["parallel_tool_calls"] is False and first["top_logprobs"] == 2
    asked = loopback.engine.calls[0]
    assert asked["grammars"] is not None and asked["sampling"].temperature == 0.3
    traj = loopback.trajectory(session.session_id)
    assert traj.info["prefix_breaks"] == 0 and traj.info["constrained"] == 2


@pytest.mark.parametrize("loopback", [[call_text("add"), "It is 7."]], indirect=True)
def test_a_langgraph_react_agent_with_strict_tools_and_temperature_zero(loopback: Loopback) -> None:
    from langgraph.prebuilt import create_react_agent

    captured = Captured()
    session = loopback.open()
    model = chat_model(session, captured, temperature=0).bind_tools([add], strict=True)
    agent = create_react_agent(model, [add])
    state = agent.invoke({"messages": [HumanMessage("What is 3 + 4?")]})
    assert state["messages"][-1].content == "It is 7."
    assert state["messages"][2].content == "7"  # the tool ran on the sampled arguments
    assert session.end(reward=1.0)["prefix_breaks"] == 0
    assert all(body["tools"][0]["function"]["strict"] is True for body in captured.bodies)
    traj = loopback.trajectory(session.session_id)
    calls = [c["sampling"].temperature for c in loopback.engine.calls]
    assert calls == [0.0, 0.0] and traj.info["constrained"] == 2 and len(traj.samples) == 1
