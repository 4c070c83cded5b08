from __future__ import annotations

from rl_core.agent.toolcalls import parse_tool_calls, render_tool_call
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
