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
"""

from __future__ import annotations

import dataclasses
import json
import re
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


def parse_tool_calls(text: str, *, id_prefix: str = "call") -> ParsedAction:
    """Split ``text`` into plain content and tool calls; ids are ``f"{id_prefix}_{i}"``."""
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    for index, match in enumerate(_BLOCK.finditer(text)):
        call_id = f"{id_prefix}_{index}"
        raw = match.group(1).strip()
        closed = match.group(0).endswith(CLOSE)
        call, reason = _read_call(raw)
        if call is not None and closed:
            calls.append(ToolCall(id=call_id, name=call[0], arguments=call[1]))
        else:
            errors.append(ToolCallError(id=call_id, raw=raw, reason=reason or f"missing {CLOSE}"))
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


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a model would write for this call (used by tests and scripted policies)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"


__all__ = ["ParsedAction", "ToolCallError", "parse_tool_calls", "render_tool_call"]
