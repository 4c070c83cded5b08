"""The Responses API's wire half: its request onto chat, the chat answer as a response.

Checked against the openai 3.x package's own types: every event of a stream, and the
response, validate as ``ResponseStreamEvent`` and ``Response``.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response as OpenAIResponse
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from rl_core.protocol.chat_completions import (
    ChatCompletion,
    ChatCompletionError,
    Choice,
    FunctionCallOut,
    ReplyMessage,
    ToolCallOut,
    Usage,
)
from rl_core.protocol.responses import (
    from_chat,
    parse_responses_request,
    response_events,
    to_chat,
)

TOOL = {"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": False}


def request(**fields: Any) -> Any:
    return parse_responses_request({"model": "policy", "input": "What is 3 + 4?", **fields})


def test_items_become_the_chat_messages_the_session_answered_in() -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # another model's: not rendered
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_0_0",
            "name": "add",
            "arguments": '{"a": 3}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_0_0", "output": "7"},
    ]
    chat, kept = to_chat(request(input=items, instructions="Be brief.", tools=[TOOL]))
    assert kept == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {
                    "id": "call_0_0",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0_0", "content": "7"},
    ]
    assert chat.messages[0].role == "system" and len(chat.messages) == 4  # instructions first
    assert chat.tools is not None and chat.tools[0].function.name == "add"


def test_history_comes_before_the_input_and_the_instructions_are_not_kept() -> None:
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    chat, kept = to_chat(request(instructions="Sys."), history)
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "user"]
    assert kept[:2] == history and all(m["role"] != "system" for m in kept)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"conversation": "c"}, "conversation"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"tools": [{"type": "file_search"}]}, "tools[0]"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ],
)
def test_what_is_not_served_is_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ChatCompletionError) as caught:
        to_chat(request(**fields))
    assert caught.value.param == param and caught.value.status == 400


def test_every_problem_of_a_request_is_named() -> None:
    with pytest.raises(ChatCompletionError) as caught:
        request(conversation="c", background=True)
    assert "'conversation'" in caught.value.message and "'background'" in caught.value.message


def test_a_chat_refusal_names_the_responses_field() -> None:
    with pytest.raises(ChatCompletionError) as caught:
        to_chat(request(tool_choice={"type": "function", "name": "nope"}, tools=[TOOL]))
    assert caught.value.param == "tool_choice.name"
    assert "'tool_choice.name'" in caught.value.message


def answer(content: str | None, calls: int, finish: str) -> ChatCompletion:
    tool_calls = [
        ToolCallOut(id=f"call_0_{i}", function=FunctionCallOut(name="add", arguments='{"a":1}'))
        for i in range(calls)
    ]
    message = ReplyMessage(content=content, tool_calls=tool_calls or None)
    return ChatCompletion(
        id="chatcmpl-s-0",
        created=1,
        model="policy",
        choices=[Choice(message=message, finish_reason=finish)],  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15),
    )


@pytest.mark.parametrize(
    ("content", "calls", "finish"),
    [
        ("Hi there, a long enough text to stream.", 0, "stop"),
        (None, 2, "tool_calls"),
        ("Let me.", 1, "tool_calls"),
        ("cut", 0, "length"),
    ],
)
def test_the_answer_and_its_stream_are_what_openai_3_parses(
    content: str | None, calls: int, finish: str
) -> None:
    response = from_chat(
        answer(content, calls, finish),
        request(tools=[TOOL], metadata={"k": "v"}),
        response_id="resp_s_0",
        item_prefix="s_0",
    )
    parsed = OpenAIResponse.model_validate(response.model_dump(mode="json"))
    assert parsed.output_text == (content or "")
    assert [o.type for o in parsed.output] == ["message"] * (content is not None) + [
        "function_call"
    ] * calls
    assert parsed.status == ("incomplete" if finish == "length" else "completed")
    events = response_events(response, piece_chars=8)
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    typed = [adapter.validate_python(e) for e in events]
    assert [e.sequence_number for e in typed] == list(range(len(typed)))
    assert typed[0].type == "response.created" and typed[-1].type == (
        "response.incomplete" if finish == "length" else "response.completed"
    )
    deltas = "".join(e.delta for e in typed if e.type == "response.output_text.delta")
    assert deltas == (content or "")
    arguments = "".join(
        e.delta for e in typed if e.type == "response.function_call_arguments.delta"
    )
    assert arguments == '{"a":1}' * calls
