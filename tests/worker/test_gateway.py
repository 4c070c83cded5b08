"""The session gateway over real HTTP on loopback, driven by the official ``openai`` client.

The gateway and a `SessionBroker` run on an event loop in a thread, as in a run; what
would be the collector is a few `SessionBroker.play` tasks (one per episode slot of each
group); the engine is `ScriptedEngine` (chosen token ids, no model). The client side is
what a user writes: `sdk.sessions.SessionGateway` and ``openai.OpenAI``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from rl_core.agent.ledger import Trajectory
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.broker import SessionBroker
from rl_core.sessions.session import SessionConfig
from sdk.errors import RlaasError
from sdk.sessions import SessionGateway
from worker.gateway import serve_gateway

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
ARGUMENTS = '{"a": 3,  "b":4}'  # odd spacing: it must come back as sampled
CALLING = f'<tool_call>{{"name": "add", "arguments": {ARGUMENTS}}}</tool_call>'
ANSWER = "7"
TOKEN = "run-token-of-the-test-gateway"


class Served:
    """A broker and its gateway on a loop of their own; ``slots`` episodes offered per group."""

    def __init__(self, groups: int, group_size: int, timeout_s: float, token: str = TOKEN) -> None:
        self.token = token
        self.tok = BuiltinTokenizer()
        replies = [[*self.tok.encode(t), self.tok.end_of_turn_id] for t in (CALLING, ANSWER)]
        self.engine = ScriptedEngine(replies, stop_ids=[self.tok.end_of_turn_id])
        self.broker = SessionBroker(
            engine=self.engine,
            tokenizer=self.tok,
            config=SessionConfig(sampling=SamplingParams(temperature=1.0), max_new_tokens=256),
            group_size=group_size,
        )
        self.finished: list[Trajectory] = []
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self.loop.run_until_complete, args=(self._main(groups, group_size, timeout_s),)
        )
        self._thread.start()
        assert self._ready.wait(10), "the gateway did not start"

    async def _main(self, groups: int, group_size: int, timeout_s: float) -> None:
        self._stop = asyncio.Event()

        self._timeout_s = timeout_s
        async with serve_gateway(self.broker, token=self.token) as url:
            self.url = url
            tasks = self._tasks = [
                asyncio.create_task(self._episode(g, m))
                for g in range(groups)
                for m in range(group_size)
            ]
            self._ready.set()
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _episode(self, group: int, member: int) -> None:
        traj = Trajectory(episode_id=f"g{group}-e{member}", group=group, member=member)
        await self.broker.play(traj, timeout_s=self._timeout_s)
        self.finished.append(traj)

    def offer(self, group: int, member: int) -> None:
        """One more episode, as the collector starts one when admission allows."""

        def start() -> None:
            self._tasks.append(asyncio.create_task(self._episode(group, member)))

        self.loop.call_soon_threadsafe(start)

    def wait_finished(self, n: int, timeout_s: float = 10) -> list[Trajectory]:
        """Episodes that ended, and sessions a client fault ended (their slots offered
        again), once there are ``n``."""
        for _ in range(int(timeout_s * 20)):
            ended = self.finished + list(self.broker._faulted)
            if len(ended) >= n:
                return ended
            threading.Event().wait(0.05)
        raise AssertionError(f"{len(self.finished)} of {n} episodes finished")

    def close(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    groups, size, timeout_s = getattr(request, "param", (2, 2, 30.0))
    s = Served(groups, size, timeout_s)
    try:
        yield s
    finally:
        s.close()


def agent_loop(client: openai.OpenAI, **fields: Any) -> list[Any]:
    """An ordinary tool-using agent written against the openai package."""
    messages: list[Any] = [{"role": "user", "content": "What is 3 + 4?"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, **fields)
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        args = json.loads(call.function.arguments)
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}
        )
    second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    return [first, second]


def test_an_openai_agent_plays_a_session_recorded_token_exact(served: Served) -> None:
    gateway = SessionGateway(served.url, TOKEN)
    session = gateway.open(group="task-1")
    first, second = agent_loop(session.openai(), logprobs=True)

    (call,) = first.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("add", ARGUMENTS)
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].logprobs.content[0].logprob == pytest.approx(-0.1)
    assert second.choices[0].message.content == ANSWER
    assert session.end(reward=1.0) == {
        "session_id": session.session_id,
        "calls": 2,
        "prefix_breaks": 0,
    }

    (traj,) = served.wait_finished(1)
    assert traj.episode_id == session.session_id and traj.end_state == "done"
    p0, p1 = served.engine.prompts
    c0 = [*served.tok.encode(CALLING), served.tok.end_of_turn_id]
    c1 = [*served.tok.encode(ANSWER), served.tok.end_of_turn_id]
    # The second prompt extends the first call's prompt and answer: one sample.
    assert p1[: len(p0) + len(c0)] == p0 + c0
    assert traj.tokens == p1 + c1
    assert [traj.tokens[i] for i, m in enumerate(traj.loss_mask) if m] == c0 + c1
    assert traj.reward == 1.0 and traj.turns == 2 and traj.info["prefix_breaks"] == 0


def test_streaming_answers_as_openai_chunks(served: Served) -> None:
    session = SessionGateway(served.url, TOKEN).open()
    client = session.openai()
    stream = client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "What is 3 + 4?"}],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
    )
    assert arguments == ARGUMENTS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_a_field_that_is_not_served_is_refused_naming_it(served: Served) -> None:
    client = SessionGateway(served.url, TOKEN).open().openai()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], logit_bias={"1": 5}
        )
    assert caught.value.body["param"] == "logit_bias"  # type: ignore[index]
    assert "sampl" in caught.value.message


@pytest.mark.parametrize("served", [(1, 2, 30.0)], indirect=True)
def test_no_free_episode_is_a_429_with_retry_after(served: Served) -> None:
    gateway = SessionGateway(served.url, TOKEN)
    gateway.open("a"), gateway.open("a")  # the run's only group
    answer = httpx.post(
        f"{served.url}/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"}, json={}
    )
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "1"
    assert answer.json()["error"]["code"] == "no_free_session"
    with pytest.raises(RlaasError, match="429"):
        gateway.open(wait_s=0)


@pytest.mark.parametrize("served", [(1, 1, 30.0)], indirect=True)
def test_an_open_that_waits_takes_the_next_episode_as_soon_as_it_is_offered(
    served: Served,
) -> None:
    gateway = SessionGateway(served.url, TOKEN)
    gateway.open()  # the only episode
    waited: list[float] = []

    def open_later() -> None:
        start = time.monotonic()
        gateway.open(wait_s=10)
        waited.append(time.monotonic() - start)

    opener = threading.Thread(target=open_later)
    opener.start()
    time.sleep(0.3)  # the client is waiting at the server now
    offered = time.monotonic()
    served.offer(1, 0)
    opener.join(10)
    # Taken when offered, not after a whole-second Retry-After.
    assert waited and waited[0] - 0.3 < 0.5, waited
    assert time.monotonic() - offered < 0.5
    bad = httpx.post(
        f"{served.url}/v1/sessions",
        headers={"Authorization": f"Bearer {TOKEN}"},
        json={"wait_s": 3600},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "wait_s"


@pytest.mark.parametrize("served", [(3, 2, 30.0)], indirect=True)
def test_sessions_of_one_group_name_share_a_group(served: Served) -> None:
    gateway = SessionGateway(served.url, TOKEN)
    a1, b1, a2, a3 = (gateway.open(g) for g in ("a", "b", "a", "a"))
    group = {s.session_id: s.session_id.split("-")[0] for s in (a1, b1, a2, a3)}
    assert group[a1.session_id] == group[a2.session_id] != group[b1.session_id]
    # Its group full, a name starts another.
    assert group[a3.session_id] not in (group[a1.session_id], group[b1.session_id])


def test_keys_open_only_their_own_session(served: Served) -> None:
    gateway = SessionGateway(served.url, TOKEN)
    mine, other = gateway.open(), gateway.open()
    body = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}
    stolen = httpx.post(
        f"{other.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {mine.api_key}"},
        json=body,
    )
    assert stolen.status_code == 404
    assert stolen.json()["error"]["code"] == "session_not_found"
    assert (
        httpx.post(
            f"{served.url}/v1/sessions", headers={"Authorization": f"Bearer {mine.api_key}"}
        ).status_code
        == 401
    )
    assert httpx.post(f"{mine.base_url}/chat/completions", json=body).status_code == 401


def test_a_cancelled_session_is_not_trained_on_and_is_closed(served: Served) -> None:
    gateway = SessionGateway(served.url, TOKEN)
    with pytest.raises(RuntimeError), gateway.open() as session:
        agent_loop(session.openai())
        raise RuntimeError("the client's agent fails")
    (traj,) = served.wait_finished(1)
    assert traj.end_state == "cancelled" and not traj.kept and traj.turns == 2
    with pytest.raises(openai.NotFoundError):
        agent_loop(session.openai())


@pytest.mark.parametrize("served", [(1, 2, 0.5)], indirect=True)
def test_a_session_left_open_times_out_unscored(served: Served) -> None:
    session = SessionGateway(served.url, TOKEN).open()
    agent_loop(session.openai())
    (traj,) = served.wait_finished(1)
    assert traj.end_state == "timeout" and traj.end_reason == "episode_timeout"
    with pytest.raises(RlaasError, match="404"):
        session.end(1.0)


def test_an_end_that_does_not_add_up_is_refused_and_the_session_stays_open(
    served: Served,
) -> None:
    session = SessionGateway(served.url, TOKEN).open()
    with pytest.raises(RlaasError, match="no chat completion calls"):
        session.end(1.0)
    agent_loop(session.openai())
    with pytest.raises(RlaasError, match="one per call"):
        session.end(1.0, turn_rewards=[1.0])
    with pytest.raises(RlaasError, match="sum to"):
        session.end(1.0, turn_rewards=[0.5, 0.0])
    for bad in ({"reward": "1"}, {"reward": float("inf")}, {}):
        answer = httpx.post(
            f"{session.base_url}/end",
            headers={"Authorization": f"Bearer {session.api_key}"},
            content=json.dumps(bad),
        )
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "reward"
    session.end(1.0, turn_rewards=[0.25, 0.75])
    (traj,) = served.wait_finished(1)
    assert traj.turn_rewards == [0.25, 0.75] and traj.end_state == "done"


def test_an_openai_client_completes_text_in_a_session(served: Served) -> None:
    """The legacy /completions route, as ``client.completions.create`` calls it: the
    prompt is the client's text, and a continuation of it joins the recorded sample."""
    session = SessionGateway(served.url, TOKEN).open()
    client = session.openai()
    prompt = "Q: 3 + 4?\nA:"
    first = client.completions.create(
        model="policy", prompt=prompt, max_tokens=64, stop=['"arguments"'], logprobs=0
    )
    (choice,) = first.choices
    assert first.object == "text_completion"
    assert (choice.text, choice.finish_reason) == ('<tool_call>{"name": "add", ', "stop")
    assert choice.logprobs.token_logprobs[0] == pytest.approx(-0.1)
    assert choice.logprobs.text_offset[0] == len(prompt)

    rest = '"arguments": {"a": 3, "b": 4}}</tool_call>\nResult: 7\nA:'
    stream = client.completions.create(
        model="policy",
        prompt=prompt + choice.text + rest,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
    assert session.end(reward=1.0)["prefix_breaks"] == 0

    (traj,) = served.wait_finished(1)
    p0, p1 = served.engine.prompts
    kept = served.tok.encode('<tool_call>{"name": "add", "arguments"')
    assert p0 == served.tok.encode(prompt)  # no chat template
    assert p1[: len(p0) + len(kept)] == p0 + kept
    answer = [*served.tok.encode(ANSWER), served.tok.end_of_turn_id]
    assert [traj.tokens[i] for i, m in enumerate(traj.loss_mask) if m] == kept + answer
