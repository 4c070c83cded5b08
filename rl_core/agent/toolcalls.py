"""Tool calls in the JSON-in-tags format of Qwen and Hermes-style chat templates.

A model asks for a tool by writing, anywhere in its message, one or more::

    <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>

Everything outside the tags is the plain-text part of the message (an answer,
or the model thinking aloud). `parse_tool_calls` never raises on what a model
wrote: a block whose JSON is broken, or that lacks a name, becomes an entry of
``errors`` and an observation (`ParsedAction.error_messages`) that tells the
model what was wrong, so a policy can learn the format instead of the episode
crashing. Usage from the agent::

    parsed = parse_tool_calls(text, id_prefix=f"t{turn}")
    result = await env.step(episode_id, turn, parsed.to_action())
    observation = parsed.error_messages() + result.messages

`scan_tool_calls` is the same reading with positions: each block's place in the
text and the exact text of its arguments, for a server that must hand the
sampled arguments back byte for byte (`rl_core.sessions`). `describe_tools`
writes the tool list in the Hermes/Qwen system-prompt text, for templates that
have no ``tools`` of their own.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rl_core.envs.base import Action, Message, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# Non-greedy up to the next closing tag; an unclosed tag runs to the end of the text.
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCallError:
    """One block that could not be read as a tool call."""

    id: str  # the id the call would have had, so the observation can answer it
    raw: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    """An assistant message split into its text and its tool calls."""

    content: str  # the text outside the tool-call blocks, stripped
    tool_calls: tuple[ToolCall, ...] = ()
    errors: tuple[ToolCallError, ...] = ()

    def to_action(self) -> Action:
        return Action(content=self.content, tool_calls=self.tool_calls)

    def error_messages(self) -> list[Message]:
        """One ``tool`` message per malformed block, saying what to fix."""
        return [
            {
                "role": "tool",
                "tool_call_id": err.id,
                "content": f"error: could not parse tool call: {err.reason}. Write "
                f'{OPEN}{{"name": "<tool>", "arguments": {{...}}}}{CLOSE} with valid JSON.',
            }
            for err in self.errors
        ]


@dataclasses.dataclass(frozen=True)
class ToolCallBlock:
    """One ``<tool_call>`` block of a text, read or not.

    ``start:end`` is the block in the text, tags included. For a readable block,
    ``arguments_text`` is the arguments exactly as written: the JSON object's own
    text (spacing and key order kept), or the decoded string when the model wrote
    the OpenAI style (a JSON string holding JSON), or ``"{}"`` when it wrote none
    (or a blank string).
    """

    start: int
    end: int
    raw: str  # between the tags, stripped
    name: str | None = None
    arguments: dict[str, Any] | None = None
    arguments_text: str | None = None
    error: str | None = None  # why it is not a call; None for a call

    @property
    def ok(self) -> bool:
        return self.error is None


def scan_tool_calls(text: str) -> list[ToolCallBlock]:
    """Every block of ``text`` in order, each a call or the reason it is not one."""
    blocks: list[ToolCallBlock] = []
    for match in _BLOCK.finditer(text):
        raw = match.group(1).strip()
        call, reason = _read_call(raw)
        if call is None or not match.group(0).endswith(CLOSE):
            error = reason or f"missing {CLOSE}"
            blocks.append(ToolCallBlock(match.start(), match.end(), raw, error=error))
            continue
        name, arguments = call
        blocks.append(
            ToolCallBlock(
                match.start(),
                match.end(),
                raw,
                name=name,
                arguments=arguments,
                arguments_text=_arguments_text(raw),
            )
        )
    return blocks


def parse_tool_calls(text: str, *, id_prefix: str = "call") -> ParsedAction:
    """Split ``text`` into plain content and tool calls; ids are ``f"{id_prefix}_{i}"``."""
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    for index, block in enumerate(scan_tool_calls(text)):
        call_id = f"{id_prefix}_{index}"
        if block.ok and block.name is not None and block.arguments is not None:
            calls.append(ToolCall(id=call_id, name=block.name, arguments=block.arguments))
        else:
            errors.append(ToolCallError(id=call_id, raw=block.raw, reason=block.error or ""))
    content = _BLOCK.sub("", text).strip()
    return ParsedAction(content=content, tool_calls=tuple(calls), errors=tuple(errors))


def _read_call(raw: str) -> tuple[tuple[str, dict[str, Any]] | None, str | None]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(data, dict):
        return None, "the JSON must be an object with 'name' and 'arguments'"
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return None, "missing 'name' (a non-empty string)"
    # "parameters" is what some Llama-style models write for "arguments".
    args: Any = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f"'arguments' is a string but not valid JSON ({exc.msg})"
    if not isinstance(args, dict):
        return None, "'arguments' must be a JSON object"
    return (name, args), None


def _arguments_text(raw: str) -> str:
    """The arguments of a readable block (`_read_call` accepted ``raw``) as written."""
    spans = _member_spans(raw)
    key = "arguments" if "arguments" in spans else "parameters" if "parameters" in spans else None
    if key is None:
        return "{}"
    start, end = spans[key]
    value = json.loads(raw[start:end])
    if isinstance(value, str):  # blank is no arguments, as `_read_call` reads it
        return value if value.strip() else "{}"
    return raw[start:end]


_DECODER = json.JSONDecoder()


def _member_spans(raw: str) -> dict[str, tuple[int, int]]:
    """Where each member's value sits in the text of a JSON object (the last of a repeated
    key, as ``json.loads`` keeps it). ``raw`` must be a valid JSON object."""
    spans: dict[str, tuple[int, int]] = {}
    pos = _skip_space(raw, 0) + 1  # past "{"
    while raw[pos := _skip_space(raw, pos)] != "}":
        key, pos = _DECODER.raw_decode(raw, pos)
        pos = _skip_space(raw, _skip_space(raw, pos) + 1)  # past ":"
        _, end = _DECODER.raw_decode(raw, pos)
        spans[key] = (pos, end)
        pos = _skip_space(raw, end)
        if raw[pos] == ",":
            pos += 1
    return spans


def _skip_space(text: str, pos: int) -> int:
    while text[pos] in " \t\n\r":
        pos += 1
    return pos


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a model would write for this call (used by tests and scripted policies)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"


# The system-prompt text of Qwen2.5's template (the Hermes format), which the models
# that write <tool_call> blocks were trained to read.
_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def describe_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools (``{"type": "function", "function": {...}}`` schemas) as system-prompt text."""
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return _TOOLS_HEAD + lines + _TOOLS_TAIL


__all__ = [
    "ParsedAction",
    "ToolCallBlock",
    "ToolCallError",
    "describe_tools",
    "parse_tool_calls",
    "render_tool_call",
    "scan_tool_calls",
]
