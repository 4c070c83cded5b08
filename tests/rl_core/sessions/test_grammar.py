"""The grammar a constrained call is sampled under, checked with llguidance itself.

Each grammar is compiled by llguidance (the library the engines mask tokens with) and
run over texts byte by byte, with a byte-level tokenizer: what it accepts is what a
model could sample under the mask. Texts it accepts are then read by the session's own
reply reader, so a constrained answer is shown to parse into the calls it spells, the
arguments as sampled.
"""

from __future__ import annotations

from typing import Any

import llguidance
import pytest

from rl_core.agent.toolcalls import scan_tool_calls
from rl_core.pretrained.chat_tokenizer import ChatTokenizer
from rl_core.protocol.chat_completions import parse_request
from rl_core.sessions.grammar import constrained, output_grammar, schema_problems

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
ADD = {"type": "function", "function": {"name": "add", "strict": True, "parameters": ADD_SCHEMA}}
# Not strict: its arguments are any JSON object, whatever its schema says.
NOTE = {
    "type": "function",
    "function": {"name": "note", "parameters": {"type": "object", "properties": {}}},
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}

TEXT = "The sum is 7."
CALL = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
HERMES = '<tool_call>\n{"name": "add", "arguments": {"a":3,  "b":4}}\n</tool_call>'
NOTE_CALL = '<tool_call>{"name": "note", "arguments": {"anything": ["goes"]}}</tool_call>'
BAD_ARGS = '<tool_call>{"name": "add", "arguments": {"a": 3}}</tool_call>'
EXTRA_ARG = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4, "c": 5}}</tool_call>'
UNKNOWN = '<tool_call>{"name": "sub", "arguments": {"a": 3, "b": 4}}</tool_call>'
JSON_ANSWER = '{"answer": 7}'


class _Bytes:
    """A tokenizer whose tokens are the 256 bytes (and an end token): any text spells."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<end>"]
    special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def grammar_of(**fields: Any) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "3+4?"}], **fields}
    grammar = output_grammar(parse_request(body))
    assert grammar is not None
    compiled = llguidance.LLMatcher.grammar_from_lark(grammar.lark)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled, TOKENIZER)
    assert not is_error and messages == [], messages
    return compiled


def accepts(compiled: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(TOKENIZER, compiled, log_level=0)
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


# The texts every grammar is run over, by name.
TEXTS = {
    "text": TEXT,
    "call": CALL,
    "hermes": HERMES,  # newlines around the JSON, its own spacing in the arguments
    "note": NOTE_CALL,
    "missing_arg": BAD_ARGS,
    "extra_arg": EXTRA_ARG,
    "unknown_tool": UNKNOWN,
    "json": JSON_ANSWER,
    "other_json": '{"x": [1, {"y": null}]}',
    "wrong_json": '{"answer": "seven"}',
    "text_then_call": f"Let me add.\n{CALL}",
    "two_calls": f"{CALL}\n{NOTE_CALL}\n",
    "same_call_twice": f"{CALL}{CALL}",
    "spaced_call": f" {CALL}\n",
    "text_then_note": f"Adding: {NOTE_CALL}",
    "call_then_text": f"{CALL} and then some text",
    "stray_tag": "Text that mentions <tool_call> without a call",
    "padded": f"{CALL}\n{CALL}" + " " * 9,
}
FREE_TEXT = {"text", "json", "other_json", "wrong_json"}  # text with no call in it
JSON_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "out", "strict": True, "schema": ANSWER_SCHEMA},
}
CASES: list[tuple[dict[str, Any], set[str]]] = [
    # auto, a strict tool beside one that is not: text, or text then calls, each call's
    # arguments under its tool's schema (any object for the tool that is not strict).
    (
        {"tools": [ADD, NOTE]},
        FREE_TEXT
        | {"call", "hermes", "note", "text_then_call", "two_calls", "same_call_twice"}
        | {"spaced_call", "text_then_note"},
    ),
    (
        {"tools": [ADD], "tool_choice": "required"},
        {"call", "hermes", "same_call_twice", "spaced_call"},
    ),
    (
        {"tools": [ADD, NOTE], "tool_choice": {"type": "function", "function": {"name": "add"}}},
        {"call", "hermes", "spaced_call"},
    ),
    (
        {"tools": [ADD, NOTE], "parallel_tool_calls": False},
        FREE_TEXT | {"call", "hermes", "note", "text_then_call", "spaced_call", "text_then_note"},
    ),
    (
        {"tools": [ADD], "response_format": JSON_FORMAT},
        {"json", "call", "hermes", "same_call_twice", "spaced_call"},
    ),
    ({"response_format": {"type": "json_object"}}, {"json", "other_json", "wrong_json"}),
    ({"tools": [ADD], "tool_choice": "none", "response_format": JSON_FORMAT}, {"json"}),
]


@pytest.mark.parametrize(("fields", "accepted"), CASES)
def test_the_grammar_compiles_and_accepts_exactly_its_texts(
    fields: dict[str, Any], accepted: set[str]
) -> None:
    compiled = grammar_of(**fields)
    assert {name for name, text in TEXTS.items() if accepts(compiled, text)} == accepted


def test_what_the_grammar_accepts_reads_back_as_the_calls_it_spells() -> None:
    """The reply reader finds each call in a constrained text, its arguments byte-exact."""
    for text in (HERMES, f"Let me add.\n{CALL}", f"{CALL}\n{NOTE_CALL}\n"):
        blocks = [b for b in scan_tool_calls(text) if b.ok]
        assert blocks and all(b.name in ("add", "note") for b in blocks)
        for block in blocks:
            assert block.arguments_text is not None and block.arguments_text in text
    (block,) = scan_tool_calls(HERMES)
    assert block.arguments_text == '{"a":3,  "b":4}'


def test_free_requests_have_no_grammar() -> None:
    for fields in (
        {},
        {"tools": [NOTE]},
        {"tools": [NOTE], "tool_choice": "auto", "parallel_tool_calls": True},
        {"tools": [ADD], "tool_choice": "none"},
        {"response_format": {"type": "text"}},
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
        request = parse_request(body)
        assert not constrained(request) and output_grammar(request) is None


def test_a_schema_llguidance_cannot_compile_is_refused_by_its_field() -> None:
    broken = {"type": "object", "properties": {"a": {"type": "integer", "minimum": "x"}}}
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": broken}}
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "nonsense"}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    problems = schema_problems(parse_request({**body, "tools": [tool], "response_format": fmt}))
    assert [p.param for p in problems] == [
        "tools[0].function.parameters",
        "response_format.json_schema.schema",
    ]
    assert all(p.code == "invalid_value" for p in problems)
    assert schema_problems(parse_request({**body, "tools": [ADD]})) == []


def test_with_a_real_tokenizer_the_sampled_call_and_its_end_of_turn_pass_the_mask(
    smollm2_chat: ChatTokenizer,
) -> None:
    """SmolLM2's BPE tokens of a forced call, then its end-of-turn token, are what the
    grammar lets through (the engines build their masks from the tokenizer the same way);
    text before a forced call is not."""
    tokenizer = llguidance.LLTokenizer(
        smollm2_chat.tokenizer.backend.to_str(), eos_token=smollm2_chat.end_of_turn_id
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "3+4?"}], "tools": [ADD]}
    grammar = output_grammar(parse_request({**body, "tool_choice": "required"}))
    assert grammar is not None
    compiled = llguidance.LLMatcher.grammar_from_lark(grammar.lark)

    matcher = llguidance.LLMatcher(tokenizer, compiled, log_level=0)
    sampled = [*smollm2_chat.encode(HERMES), smollm2_chat.end_of_turn_id]
    assert matcher.consume_tokens(sampled) and matcher.is_stopped(), matcher.get_error()
    chatty = llguidance.LLMatcher(tokenizer, compiled, log_level=0)
    assert not chatty.consume_tokens(smollm2_chat.encode(f"Sure: {HERMES}"))
