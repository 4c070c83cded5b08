"""Streaming: a finished answer as chunk events that a client reassembles into the same message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rl_core.protocol.chat_completions.answer import (
    ChatCompletion,
    Choice,
    ChoiceLogprobs,
    FunctionCallOut,
    ReplyMessage,
    TokenLogprob,
    ToolCallOut,
    Usage,
)
from rl_core.protocol.chat_completions.stream import DONE, stream_completion


def accumulate(events: list[str]) -> dict[str, Any]:
    """What a client does with the stream (the official clients' accumulation), written
    independently of the code under test: parse each ``data:`` event, join the deltas."""
    assert events[-1] == DONE
    message: dict[str, Any] = {"role": None, "content": None}
    calls: dict[int, dict[str, Any]] = {}
    out: dict[str, Any] = {"finish_reason": None, "logprobs": None, "usage": None, "ids": set()}
    for event in events[:-1]:
        assert event.startswith("data: ") and event.endswith("\n\n")
        chunk = json.loads(event[len("data: ") : -2])
        assert chunk["object"] == "chat.completion.chunk"
        out["ids"].add(chunk["id"])
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for choice in chunk["choices"]:
            assert set(choice) == {"index", "delta", "logprobs", "finish_reason"}
            delta = choice["delta"]
            if "role" in delta:
                message["role"] = delta["role"]
            if delta.get("content") is not None:
                message["content"] = (message["content"] or "") + delta["content"]
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(part["index"], {"function": {"arguments": ""}})
                for key in ("id", "type"):
                    if key in part:
                        call[key] = part[key]
                function = part.get("function") or {}
                if "name" in function:
                    call["function"]["name"] = function["name"]
                call["function"]["arguments"] += function.get("arguments", "")
            if choice["logprobs"]:
                out["logprobs"] = (out["logprobs"] or []) + choice["logprobs"]["content"]
            if choice["finish_reason"]:
                out["finish_reason"] = choice["finish_reason"]
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": c["type"], "function": c["function"]}
            for _, c in sorted(calls.items())
        ]
    out["message"] = message
    return out


def answer(message: ReplyMessage, finish: Any, logprobs: ChoiceLogprobs | None = None) -> Any:
    return ChatCompletion(
        id="chatcmpl-s-3",
        created=1700000000,
        model="policy",
        choices=[Choice(message=message, finish_reason=finish, logprobs=logprobs)],
        usage=Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15),
    )


def call(i: int, arguments: str) -> ToolCallOut:
    return ToolCallOut(id=f"call_3_{i}", function=FunctionCallOut(name="calc", arguments=arguments))


MESSAGES = {
    "text": ReplyMessage(content="  The answer is 84, café ✓ — done.\n"),
    "empty text": ReplyMessage(content=""),
    "tool calls only": ReplyMessage(
        content=None,
        tool_calls=[call(0, '{"expression":  "12 * 7"}'), call(1, "{}")],
    ),
    "text and tool calls": ReplyMessage(
        content="Let me compute that for you carefully.",
        tool_calls=[call(0, '{"expression": "(1 + 2) * 3", "note": "a long argument text"}')],
    ),
}


@pytest.mark.parametrize("name", sorted(MESSAGES))
@pytest.mark.parametrize("piece_chars", [1, 5, 1000])
def test_chunks_reassemble_to_the_same_message(name: str, piece_chars: int) -> None:
    message = MESSAGES[name]
    finish = "tool_calls" if message.tool_calls else "stop"
    done = answer(message, finish)
    got = accumulate(stream_completion(done, piece_chars=piece_chars))
    assert got["message"] == message.echo()
    assert got["finish_reason"] == finish
    assert got["ids"] == {"chatcmpl-s-3"} and got["usage"] is None and got["logprobs"] is None


def test_the_order_of_the_events_and_the_usage_chunk() -> None:
    done = answer(MESSAGES["text and tool calls"], "tool_calls")
    events = stream_completion(done, include_usage=True, piece_chars=20)
    chunks = [json.loads(e[len("data: ") : -2]) for e in events[:-1]]
    first, last = chunks[0], chunks[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["finish_reason"] is None  # sent as null, not left out
    assert chunks[1]["choices"][0]["delta"] == {"content": "Let me compute that "}
    opening = next(c for c in chunks if "tool_calls" in c["choices"][0]["delta"])
    assert opening["choices"][0]["delta"]["tool_calls"] == [
        {
            "index": 0,
            "id": "call_3_0",
            "type": "function",
            "function": {"name": "calc", "arguments": ""},
        }
    ]
    assert chunks[-2]["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    ]
    assert last["choices"] == [] and last["usage"] == done.usage.model_dump()
    assert events[-1] == "data: [DONE]\n\n"


def test_logprobs_come_back_in_the_stream() -> None:
    logprobs = ChoiceLogprobs(
        content=[
            TokenLogprob(token=t, logprob=-0.5 * i, bytes=list(t.encode()))
            for i, t in enumerate(["8", "4", "."])
        ]
    )
    done = answer(ReplyMessage(content="84."), "stop", logprobs)
    got = accumulate(stream_completion(done, piece_chars=1))
    assert got["logprobs"] == done.model_dump(mode="json")["choices"][0]["logprobs"]["content"]
    assert got["message"] == {"role": "assistant", "content": "84."}
