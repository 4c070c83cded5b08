"""The OpenAI chat-completions request: what is served, and OpenAI's error body for the rest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rl_core.protocol.chat_completions import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionError,
    Choice,
    ReplyMessage,
    SystemMessage,
    ToolCallOut,
    ToolMessage,
    Usage,
    UserMessage,
    parse_request,
)

USER = {"role": "user", "content": "What is 12 * 7?"}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_0_0", "content": "84"}
CALL = {
    "id": "call_0_0",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "12 * 7"}'},
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "policy", "messages": [USER], **fields}


def refusal(request: Any) -> dict[str, Any]:
    with pytest.raises(ChatCompletionError) as caught:
        parse_request(request)
    assert caught.value.status == 400
    error = caught.value.body()
    assert set(error) == {"error"}
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["type"] == "invalid_request_error"
    return dict(error["error"])


def test_everything_served_parses() -> None:
    request = parse_request(
        json.dumps(
            {
                "model": "policy",
                "messages": [
                    {"role": "developer", "content": "Be brief."},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is"},
                            {"type": "text", "text": "12 * 7?"},
                        ],
                    },
                    {"role": "assistant", "content": None, "tool_calls": [CALL], "refusal": None},
                    {"role": "tool", "tool_call_id": "call_0_0", "content": "84"},
                ],
                "tools": [TOOL],
                "tool_choice": "auto",
                "temperature": 1,
                "top_p": 1.0,
                "max_tokens": 64,
                "max_completion_tokens": 64,
                "stop": None,
                "n": 1,
                "logprobs": True,
                "top_logprobs": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "seed": 7,
                "parallel_tool_calls": True,
            }
        ).encode()
    )
    system, user, assistant, tool = request.messages
    assert isinstance(system, SystemMessage) and system.content == "Be brief."
    assert isinstance(user, UserMessage) and user.content == "What is\n12 * 7?"
    assert isinstance(assistant, AssistantMessage) and assistant.content is None
    assert assistant.tool_calls is not None
    assert assistant.tool_calls[0].function.arguments == '{"expression": "12 * 7"}'
    assert isinstance(tool, ToolMessage) and tool.tool_call_id == "call_0_0"
    assert request.token_limit == 64 and request.calls_tools and request.temperature == 1.0
    assert not parse_request(body(tools=[TOOL], tool_choice="none")).calls_tools
    assert parse_request(body()).token_limit is None


def test_what_frameworks_send_is_served_or_accepted() -> None:
    """The fields openai-agents, LangChain and verifiers send, each taken (the session and
    the grammar act on the served ones; the rest are accepted with no effect here)."""
    strict_tool = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    request = parse_request(
        body(
            tools=[strict_tool],
            tool_choice={"type": "function", "function": {"name": "calculator"}},
            parallel_tool_calls=False,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "final_output", "strict": True, "schema": {}},
            },
            temperature=0,
            top_p=0.9,
            top_k=-1,
            frequency_penalty=0.5,
            presence_penalty=-0.5,
            logprobs=True,
            top_logprobs=20,
            n=1,
            store=True,
            metadata={"run": "a"},
            user="someone",
            safety_identifier="hashed",
            service_tier="auto",
            prompt_cache_key="k",
            prompt_cache_retention="24h",
            reasoning_effort="low",
            verbosity="low",
            modalities=["text"],
            logit_bias={},
            min_p=0.0,
            repetition_penalty=1.0,
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": False},
        )
    )
    assert request.tools is not None and request.tools[0].function.strict
    assert request.top_logprobs_asked == 20 and request.temperature == 0
    assert parse_request(body(top_logprobs=3)).top_logprobs_asked == 0  # needs logprobs
    json_object = parse_request(body(response_format={"type": "json_object"}))
    assert json_object.response_format is not None


def test_echoed_assistant_fields_are_accepted() -> None:
    """What verifiers, openai-agents and LangChain send back with an answer."""
    echoed = {
        "role": "assistant",
        "content": "",
        "name": "agent",
        "reasoning_content": "I should add.",
        "reasoning": None,
        "reasoning_details": [{"type": "reasoning.text", "text": "..."}],
        "refusal": None,
        "annotations": [],
        "audio": None,
        "function_call": None,
        "tool_calls": [{**CALL, "index": 0}],
    }
    request = parse_request(
        {
            "model": "m",
            "messages": [{**USER, "name": "alice"}, echoed, {**TOOL_RESULT, "name": "c"}],
        }
    )
    assistant = request.messages[1]
    assert isinstance(assistant, AssistantMessage) and assistant.reasoning_content
    error = refusal({"model": "m", "messages": [USER, {**echoed, "function_call": {"name": "f"}}]})
    assert (error["param"], error["code"]) == ("messages[1].function_call", "unsupported_value")


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("logit_bias", {"42": 10}, "unsupported_value"),
        ("functions", [], "unsupported_parameter"),
        ("prediction", {"type": "content", "content": "x"}, "unsupported_parameter"),
        ("guided_json", {}, "unsupported_parameter"),  # vLLM's, or any unknown field
        ("min_p", 0.1, "unsupported_value"),
        ("repetition_penalty", 1.1, "unsupported_value"),
        ("modalities", ["text", "audio"], "unsupported_value"),
    ],
)
def test_a_field_not_served_is_refused_by_name(field: str, value: Any, code: str) -> None:
    error = refusal(body(**{field: value}))
    assert (error["param"], error["code"]) == (field, code)
    assert f"'{field}'" in error["message"]


def test_a_field_not_served_inside_a_message_or_tool_is_refused_by_its_path() -> None:
    odd = {**USER, "cache_control": {"type": "ephemeral"}}
    error = refusal({"model": "m", "messages": [USER, odd]})
    assert (error["param"], error["code"]) == ("messages[1].cache_control", "unsupported_parameter")
    tool = {"type": "function", "function": {**TOOL["function"], "examples": []}}
    error = refusal(body(tools=[tool]))
    assert (error["param"], error["code"]) == (
        "tools[0].function.examples",
        "unsupported_parameter",
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "messages[0].content",
        ),
    ],
)
def test_a_value_not_served_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    error = refusal(body(**fields))
    assert (error["param"], error["code"]) == (param, "unsupported_value")


def test_n_above_one_says_what_to_do_instead() -> None:
    message = refusal(body(n=2))["message"]
    assert "2 sessions with the same group name" in message and "/v1/sessions" in message


def test_every_problem_is_named_in_the_one_error() -> None:
    """LangChain's with_structured_output(method="function_calling") once met "(1 more
    problem after this one)": every problem is named now, ``param`` the first's."""
    error = refusal(
        body(n=3, logit_bias={"1": 5}, guided_json={}, temperature=9, messages=[USER, {}])
    )
    message = error["message"]
    assert message.startswith("This request has 5 problems: (1) ")
    for named in ("'messages[1].role'", "'temperature'", "'n'", "'logit_bias'", "'guided_json'"):
        assert named in message
    assert error["param"] == "messages[1].role"  # the first, in the body's order
    assert "more problem" not in message


def test_a_forcing_choice_must_name_one_of_the_tools() -> None:
    error = refusal(body(tool_choice="required"))
    assert (error["param"], error["code"]) == ("tool_choice", "invalid_value")
    named = {"type": "function", "function": {"name": "weather"}}
    error = refusal(body(tools=[TOOL], tool_choice=named))
    assert error["param"] == "tool_choice.function.name" and "calculator" in error["message"]


@pytest.mark.parametrize(
    ("request_body", "param", "code"),
    [
        ({"messages": [USER]}, "model", "missing_required_parameter"),
        ({"model": "m", "messages": []}, "messages", "invalid_value"),
        (
            {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
            "messages[0].role",
            "invalid_value",
        ),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role", "invalid_value"),
        (
            {"model": "m", "messages": [{"role": "tool", "content": "4"}]},
            "messages[0].tool_call_id",
            "missing_required_parameter",
        ),
        (
            {"model": "m", "messages": [{"role": "assistant"}]},
            "messages[0].content",
            "invalid_value",
        ),
        (
            {"model": "m", "messages": [{"role": "assistant", "content": "x", "refusal": 3}]},
            "messages[0].refusal",
            "invalid_value",
        ),
        (
            body(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
            "response_format.json_schema.name",
            "missing_required_parameter",
        ),
        (body(response_format={"type": "xml"}), "response_format", "invalid_value"),
        (body(top_logprobs=21, logprobs=True), "top_logprobs", "invalid_value"),
        (body(frequency_penalty=-2.5), "frequency_penalty", "invalid_value"),
        (body(temperature="0.7"), "temperature", "invalid_value"),
        (body(temperature=2.5), "temperature", "invalid_value"),
        (body(max_tokens=0), "max_tokens", "invalid_value"),
        (body(max_tokens=8, max_completion_tokens=9), "max_completion_tokens", "invalid_value"),
        (body(stream=1), "stream", "invalid_value"),
        (body(stop=["a", "b", "c", "d", "e"]), "stop", "invalid_value"),
        (body(stop=""), "stop", "invalid_value"),
        (body(stop=["END", ""]), "stop", "invalid_value"),
        (body(stop=[1]), "stop", "invalid_value"),
        (body(stop={"s": 1}), "stop", "invalid_value"),
        (body(tool_choice=3), "tool_choice", "invalid_value"),
        (
            body(tools=[{"type": "function", "function": {"name": "two words"}}]),
            "tools[0].function.name",
            "invalid_value",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": ["Hi"]}]},
            "messages[0].content",
            "invalid_value",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Hi", "cache": 1}]}
                ],
            },
            "messages[0].content",
            "invalid_value",
        ),
    ],
)
def test_invalid_requests_name_their_field(
    request_body: dict[str, Any], param: str, code: str
) -> None:
    error = refusal(request_body)
    assert (error["param"], error["code"]) == (param, code)
    assert param.split(".")[-1].split("[")[0] in error["message"]


def test_stop_is_one_string_or_up_to_four() -> None:
    assert parse_request(body(stop="\n")).stop == ("\n",)
    assert parse_request(json.dumps(body(stop=["END", "\n\n"]))).stop == ("END", "\n\n")
    assert parse_request(body(stop=[])).stop is None
    assert "at most 4" in refusal(body(stop=list("abcde")))["message"]


def test_a_body_that_is_not_json_or_not_an_object() -> None:
    assert refusal(b'{"model": ')["code"] == "invalid_json"
    error = refusal(b"[]")
    assert error["param"] is None and error["code"] == "invalid_value"


def test_the_answer_has_openais_shape() -> None:
    answer = ChatCompletion(
        id="chatcmpl-s-0",
        created=1,
        model="policy",
        choices=[
            Choice(
                message=ReplyMessage(content=None, tool_calls=[ToolCallOut.model_validate(CALL)]),
                finish_reason="tool_calls",
            ),
            Choice(index=1, message=ReplyMessage(content="84"), finish_reason="stop"),
        ],
        usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5),
    )
    data = json.loads(answer.to_json())
    assert data["object"] == "chat.completion"
    calls, plain = data["choices"]
    assert calls["message"] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert calls["logprobs"] is None and calls["finish_reason"] == "tool_calls"
    assert plain["message"] == {"role": "assistant", "content": "84"}  # no tool_calls: none
    assert data["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    # What a client sends back is accepted as it is.
    echoed = parse_request({"model": "m", "messages": [USER, answer.choices[0].message.echo()]})
    assert echoed.messages[1] == AssistantMessage.model_validate(
        {"role": "assistant", "content": None, "tool_calls": [CALL]}
    )
