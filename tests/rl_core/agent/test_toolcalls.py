from __future__ import annotations

import json

from rl_core.agent.toolcalls import (
    describe_tools,
    parse_tool_calls,
    render_tool_call,
    scan_tool_calls,
)
from rl_core.envs import Action, ToolCall


def test_plain_text_answer_has_no_calls() -> None:
    parsed = parse_tool_calls("  The answer is 42.\n")
    assert parsed.content == "The answer is 42."
    assert parsed.tool_calls == () and parsed.errors == ()
    assert parsed.to_action() == Action(content="The answer is 42.")


def test_several_calls_and_text_around_them() -> None:
    text = (
        "Let me compute.\n"
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>done'
    )
    parsed = parse_tool_calls(text, id_prefix="t1")
    assert parsed.tool_calls == (
        ToolCall(id="t1_0", name="calculator", arguments={"expression": "2+3"}),
        ToolCall(id="t1_1", name="search", arguments={"q": "x"}),
    )
    assert parsed.content == "Let me compute.\n\ndone"
    assert parsed.errors == ()


def test_arguments_as_json_string_and_parameters_alias() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>{"name": "b", "parameters": {"y": 2}}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
    )
    calls = parse_tool_calls(text).tool_calls
    assert [(c.name, c.arguments) for c in calls] == [("a", {"x": 1}), ("b", {"y": 2}), ("c", {})]


def test_malformed_blocks_become_errors_and_observations_never_exceptions() -> None:
    text = (
        "<tool_call>{not json}</tool_call>"
        '<tool_call>["name"]</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "x", "arguments": 3}</tool_call>'
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "cut", "argu'
    )
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.tool_calls] == ["ok"]
    reasons = [e.reason for e in parsed.errors]
    assert len(reasons) == 5
    assert "invalid JSON" in reasons[0]
    assert "object" in reasons[1]
    assert "name" in reasons[2]
    assert "'arguments' must be a JSON object" in reasons[3]
    assert "invalid JSON" in reasons[4] or "</tool_call>" in reasons[4]
    messages = parsed.error_messages()
    assert [m["tool_call_id"] for m in messages] == [
        "call_0",
        "call_1",
        "call_2",
        "call_3",
        "call_5",
    ]
    assert all(m["role"] == "tool" and "could not parse" in m["content"] for m in messages)
    assert parsed.content == ""


def test_unclosed_valid_json_is_an_error_naming_the_missing_tag() -> None:
    parsed = parse_tool_calls('answer <tool_call>{"name": "a", "arguments": {}}')
    assert parsed.tool_calls == ()
    assert parsed.errors[0].reason == "missing </tool_call>"
    assert parsed.content == "answer"


def test_render_round_trips() -> None:
    text = render_tool_call("calculator", {"expression": "1 + 1"})
    (call,) = parse_tool_calls(text).tool_calls
    assert (call.name, call.arguments) == ("calculator", {"expression": "1 + 1"})


def test_scan_keeps_each_blocks_place_and_its_arguments_as_written() -> None:
    arguments = '{"expression":  "12 * 7",\n "note": "caf\u00e9 \u2713", "x": [1,2]}'
    first = f'<tool_call> {{ "arguments" : {arguments} , "name":"calc" }} </tool_call>'
    second = '<tool_call>{"name": "b", "arguments": "{\\"q\\": 1}"}</tool_call>'
    third = '<tool_call>{"name": "c", "parameters": {"y" :2}}</tool_call>'
    text = "Thinking.\n" + first + " and " + second + third + "<tool_call>{oops}</tool_call>"
    blocks = scan_tool_calls(text)
    assert [b.ok for b in blocks] == [True, True, True, False]
    assert [text[b.start : b.end] for b in blocks[:3]] == [first, second, third]
    assert blocks[0].name == "calc" and blocks[0].arguments_text == arguments
    assert json.loads(arguments) == blocks[0].arguments
    assert blocks[1].arguments_text == '{"q": 1}'  # the OpenAI style: the string's own text
    assert blocks[2].arguments_text == '{"y" :2}'
    assert blocks[3].error is not None and "invalid JSON" in blocks[3].error
    # The same reading as parse_tool_calls, which is built on it.
    parsed = parse_tool_calls(text)
    assert [c.arguments for c in parsed.tool_calls] == [b.arguments for b in blocks[:3]]
    assert len(parsed.errors) == 1


def test_scan_arguments_when_absent_or_blank_or_repeated() -> None:
    blocks = scan_tool_calls(
        '<tool_call>{"name": "a"}</tool_call>'
        '<tool_call>{"name": "b", "arguments": " "}</tool_call>'
        '<tool_call>{"name": "c", "arguments": {"v": 1}, "arguments": {"v": 2}}</tool_call>'
    )
    assert [b.arguments_text for b in blocks] == ["{}", "{}", '{"v": 2}']
    assert blocks[2].arguments == {"v": 2}  # the last repeated key, as json.loads keeps it


def test_describe_tools_lists_each_schema_in_the_hermes_text() -> None:
    tools = [
        {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "search", "description": "Find caf\u00e9s"}},
    ]
    text = describe_tools(tools)
    assert text.startswith("# Tools\n\nYou may call one or more functions")
    body = text.split("<tools>\n")[1].split("\n</tools>")[0]
    assert [json.loads(line) for line in body.split("\n")] == tools
    assert "Find caf\u00e9s" in text  # not escaped to \\u00e9
    assert text.endswith(
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
