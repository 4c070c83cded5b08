"""The Responses API and the shared (per-request named) URL on the session gateway.

The official ``openai`` client (3.x) over real HTTP on loopback against the gateway and
a `SessionBroker` with `ScriptedEngine` (`tests.worker.test_gateway.Served`): a tool
call, its output sent back, streamed and not, chained by ``previous_response_id`` or by
echoing the items; what the ledger holds is the engine's tokens, one sample.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from sdk.sessions import SessionGateway
from tests.worker.test_gateway import ANSWER, ARGUMENTS, CALLING, TOKEN, TOOLS, Served, served

__all__ = ["served"]  # the fixture, shared with test_gateway

FLAT_TOOLS: list[dict[str, Any]] = [
    {"type": "function", **{k: v for k, v in TOOLS[0]["function"].items()}}
]
QUESTION = "What is 3 + 4?"


def _tool_output(call: Any) -> dict[str, Any]:
    args = json.loads(call.arguments)
    return {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": str(args["a"] + args["b"]),
    }


def _expected_tokens(served: Served) -> tuple[list[int], list[int]]:
    c0 = [*served.tok.encode(CALLING), served.tok.end_of_turn_id]
    c1 = [*served.tok.encode(ANSWER), served.tok.end_of_turn_id]
    return c0, c1


@pytest.mark.parametrize("chain", ["echo", "previous_response_id"])
def test_a_responses_agent_plays_a_session_recorded_token_exact(served: Served, chain: str) -> None:
    session = SessionGateway(served.url, TOKEN).open(group="task-1")
    client = session.openai(max_retries=0)
    first = client.responses.create(
        model="policy",
        instructions="You add numbers.",
        input=QUESTION,
        tools=FLAT_TOOLS,  # type: ignore[arg-type]
        store=True,
        metadata={"task": "1"},
        include=["message.output_text.logprobs"],
    )
    assert first.status == "completed" and first.metadata == {"task": "1"}
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, call.arguments) == ("add", ARGUMENTS)
    if chain == "echo":
        items = [
            {"role": "user", "content": QUESTION},
            *[item.model_dump(exclude_none=True) for item in first.output],
            _tool_output(call),
        ]
        second = client.responses.create(
            model="policy",
            instructions="You add numbers.",
            input=items,
            tools=FLAT_TOOLS,  # type: ignore[arg-type]
        )
    else:
        second = client.responses.create(
            model="policy",
            instructions="You add numbers.",
            previous_response_id=first.id,
            input=[_tool_output(call)],  # type: ignore[list-item]
            tools=FLAT_TOOLS,  # type: ignore[arg-type]
        )
    assert second.output_text == ANSWER
    assert second.usage is not None and second.usage.output_tokens == 2
    assert session.end(reward=1.0)["prefix_breaks"] == 0

    (traj,) = served.wait_finished(1)
    p0, p1 = served.engine.prompts
    c0, c1 = _expected_tokens(served)
    assert p1[: len(p0) + len(c0)] == p0 + c0  # the second call extends the first
    assert traj.tokens == p1 + c1
    assert [traj.tokens[i] for i, m in enumerate(traj.loss_mask) if m] == c0 + c1
    assert "You add numbers." in served.tok.decode(p0)


def test_a_responses_call_renders_the_prompt_a_chat_call_renders(served: Served) -> None:
    gateway = SessionGateway(served.url, TOKEN)
    chat = gateway.open().openai(max_retries=0)
    chat.chat.completions.create(
        model="policy",
        messages=[{"role": "system", "content": "Hi."}, {"role": "user", "content": QUESTION}],
        tools=TOOLS,  # type: ignore[arg-type]
    )
    responses = gateway.open().openai(max_retries=0)
    responses.responses.create(
        model="policy",
        instructions="Hi.",
        input=QUESTION,
        tools=FLAT_TOOLS,  # type: ignore[arg-type]
    )
    p_chat, p_responses = served.engine.prompts
    assert p_chat == p_responses


def test_streaming_responses_as_the_openai_client_reads_them(served: Served) -> None:
    client = SessionGateway(served.url, TOKEN).open().openai(max_retries=0)
    with client.responses.stream(
        model="policy",
        input=QUESTION,
        tools=FLAT_TOOLS,  # type: ignore[arg-type]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    (call,) = final.output
    assert call.type == "function_call" and call.arguments == ARGUMENTS

    events = client.responses.create(
        model="policy",
        input=[
            {"role": "user", "content": QUESTION},
            call.model_dump(exclude_none=True),  # type: ignore[list-item]
            _tool_output(call),  # type: ignore[list-item]
        ],
        tools=FLAT_TOOLS,  # type: ignore[arg-type]
        stream=True,
    )
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(texts) == ANSWER


def test_what_the_responses_route_does_not_serve_is_refused_naming_it(served: Served) -> None:
    client = SessionGateway(served.url, TOKEN).open().openai(max_retries=0)
    cases = [
        ({"conversation": "conv_1"}, "conversation"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"truncation": "auto"}, "truncation"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content",
        ),
    ]
    for fields, param in cases:
        body: dict[str, Any] = {"model": "policy", "input": QUESTION, **fields}
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(**body)
        assert caught.value.body["param"] == param, caught.value.body  # type: ignore[index]


# --- one base URL for many sessions ----------------------------------------------------


def _shared(served: Served, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{served.url}/v1/openai", api_key=TOKEN, max_retries=0, default_headers=headers
    )


def test_sessions_named_per_request_share_one_client(served: Served) -> None:
    client = _shared(served)

    def episode(name: str, group: str) -> str:
        headers = {"X-Session-ID": name, "X-Session-Group": group}
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        first = client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=TOOLS,
            extra_headers=headers,  # type: ignore[arg-type]
        )
        message = first.choices[0].message
        (call,) = message.tool_calls or []
        messages += [
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "7"},
        ]
        second = client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=TOOLS,
            extra_headers=headers,  # type: ignore[arg-type]
        )
        return second.choices[0].message.content or ""

    names = [f"rollout-{i}" for i in range(4)]
    # One after another: the scripted engine answers calls in the order they come.
    answers = [episode(name, group) for name, group in zip(names, "aabb", strict=True)]
    assert answers == [ANSWER] * 4
    for i, name in enumerate(names):
        ended = httpx.post(
            f"{served.url}/v1/openai/sessions/{name}/end",
            json={"reward": float(i)},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert ended.status_code == 200, ended.text
        assert ended.json()["calls"] == 2 and ended.json()["prefix_breaks"] == 0
    finished = served.wait_finished(4)
    # The names' groups are GRPO groups: each pair of names is one collector group.
    by_reward = {t.reward: t for t in finished}
    assert by_reward[0.0].group == by_reward[1.0].group != by_reward[2.0].group
    assert all(t.turns == 2 and t.info["prefix_breaks"] == 0 for t in finished)


def test_a_session_named_by_model_and_what_the_shared_url_refuses(served: Served) -> None:
    client = _shared(served)
    answer = client.responses.create(model="session:by-model", input=QUESTION)
    assert answer.model == "session:by-model"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert "X-Session-ID" in caught.value.message
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{served.url}/v1/openai", api_key="wrong", max_retries=0
        ).responses.create(model="session:x", input="hi")
    cancel = httpx.post(
        f"{served.url}/v1/openai/sessions/by-model/cancel",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert cancel.status_code == 200
    with pytest.raises(openai.ConflictError) as ended:  # a name is one episode
        client.responses.create(model="session:by-model", input=QUESTION)
    assert "new id" in ended.value.message
