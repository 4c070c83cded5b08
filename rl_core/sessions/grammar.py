"""The grammar a call's answer is sampled under, in llguidance's Lark dialect.

Strict tools, forcing tool choices, ``parallel_tool_calls: false`` and
``response_format`` are served by constrained decoding: the engine masks every token
that would take the text out of the grammar (`rl_core.rollout.base.Grammar`). The
grammar describes the model's own output format, the one the session already reads
(`rl_core.sessions.reply`) and describes to the model (`rl_core.sessions.render`):
Hermes tool calls, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, so a
constrained answer is read exactly as a free one, its arguments the text sampled.

- **A tool's arguments**: its ``parameters`` schema (``%json``) when it is ``strict``;
  any JSON object when not (a tool the client did not ask to be strict is constrained
  only as far as the call format needs). The schema is enforced as JSON Schema reads
  it: OpenAI's strict subset (``additionalProperties: false``, every property
  required) is what clients send, but not required here.
- **What may be written**, by ``tool_choice``: ``auto``: free text, or text and then
  calls (the text cannot hold ``<tool_call>`` but as a call); ``required``: calls
  only; a named function: one call of it; ``none``: no call (and no grammar, unless a
  ``response_format`` asks for JSON). ``parallel_tool_calls: false``: at most one
  call. Whitespace is allowed where the Hermes format has it (around the JSON, up to
  8 characters, so a model cannot pad forever), and after the last call.
- **The answer's format**: ``json_schema`` (strict or not: a client that sends a
  schema wants its answer to parse) or ``json_object``: the answer is that JSON,
  unless it calls tools.

No grammar (None) when none of these is asked: the answer is sampled free, as before.
The end of the turn is the engine's: it may end the turn wherever the grammar is
complete.

`schema_problems` checks each schema with llguidance (when it is installed, as on a
worker) so that a schema it cannot compile is refused naming its field, before the
engine sees it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from rl_core.agent.toolcalls import CLOSE, OPEN
from rl_core.protocol.chat_completions import (
    ChatCompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedToolChoice,
    Problem,
    Tool,
)
from rl_core.rollout.base import Grammar

ANY_OBJECT: dict[str, Any] = {"type": "object"}
# Text without the opening tag anywhere in it: llguidance's regex intersection and negation.
_TEXT = r"TEXT: /(.|\n)*/ & ~/(.|\n)*" + OPEN + r"(.|\n)*/"
_SPACE = r"/[ \t\n]{1,8}/"


def constrained(request: ChatCompletionRequest) -> bool:
    """Whether the request needs constrained decoding at all."""
    json_answer = isinstance(request.response_format, JsonObjectFormat | JsonSchemaFormat)
    if not request.calls_tools:
        return json_answer
    forced = request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice)
    strict = any(t.function.strict for t in request.tools or ())
    return json_answer or forced or strict or request.parallel_tool_calls is False


def output_grammar(request: ChatCompletionRequest) -> Grammar | None:
    """The grammar of the answer to ``request``; None when it is sampled free."""
    if not constrained(request):
        return None
    answer = _answer_schema(request)
    rules = [f"WS: {_SPACE}", f"TAIL: {_SPACE}", f"OPEN: /[ \\t\\n]{{0,8}}{OPEN}/"]
    if answer is not None:
        rules.append(f"answer: %json {_json(answer)}")
    if not request.calls_tools:
        return Grammar("\n".join(["start: answer", *rules]))
    choice = request.tool_choice
    tools = list(request.tools or ())
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == choice.function.name]
    rules += _call_rules(tools)
    many = request.parallel_tool_calls is not False and not isinstance(choice, NamedToolChoice)
    more = " (OPEN call)*" if many else ""
    if choice == "required" or isinstance(choice, NamedToolChoice):
        start = f"start: OPEN call{more} TAIL?"
    elif answer is not None:  # auto, with a JSON answer: the answer, or calls
        start = f"start: answer | OPEN call{more} TAIL?"
    else:  # auto: free text, or text and then calls
        rules += [_TEXT, f"text_open[lazy]: /(.|\\n)*{OPEN}/"]
        start = f"start: TEXT | text_open call{more} TAIL?"
    return Grammar("\n".join([start, *rules]))


def _call_rules(tools: Sequence[Tool]) -> list[str]:
    """One call: ``{"name": <a tool's>, "arguments": <its arguments>}`` then the closing tag."""
    functions = [f"fn_{i}" for i in range(len(tools))]
    rules = [
        f'call: WS? "{{" WS? "\\"name\\"" WS? ":" WS? ({" | ".join(functions)}) WS? "}}" '
        f"WS? {_lark_string(CLOSE)}"
    ]
    for rule, tool in zip(functions, tools, strict=True):
        fn = tool.function
        schema = (fn.parameters or ANY_OBJECT) if fn.strict else ANY_OBJECT
        rules.append(
            f'{rule}: {_lark_string(json.dumps(fn.name))} WS? "," WS? '
            f'"\\"arguments\\"" WS? ":" WS? %json {_json(schema)}'
        )
    return rules


def _answer_schema(request: ChatCompletionRequest) -> dict[str, Any] | None:
    fmt = request.response_format
    if isinstance(fmt, JsonSchemaFormat):
        return fmt.json_schema.schema_ or ANY_OBJECT
    if isinstance(fmt, JsonObjectFormat):
        return ANY_OBJECT
    return None


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a Lark string literal


def _json(schema: dict[str, Any]) -> str:
    return json.dumps(schema)  # in its order: llguidance keeps the properties' order


def schema_problems(request: ChatCompletionRequest) -> list[Problem]:
    """Each schema the grammar embeds that llguidance cannot compile, by its field."""
    if not constrained(request):
        return []
    schemas: list[tuple[str, dict[str, Any]]] = []
    if request.calls_tools:
        for i, tool in enumerate(request.tools or ()):
            if tool.function.strict and tool.function.parameters is not None:
                schemas.append((f"tools[{i}].function.parameters", tool.function.parameters))
    if isinstance(request.response_format, JsonSchemaFormat):
        schema = request.response_format.json_schema.schema_
        if schema is not None:
            schemas.append(("response_format.json_schema.schema", schema))
    problems = []
    for param, schema in schemas:
        error = _schema_error(_json(schema))
        if error:
            problems.append(
                Problem(
                    param,
                    f"Invalid value for '{param}': constrained decoding cannot compile this "
                    f"JSON schema: {error.splitlines()[0]}.",
                    "invalid_value",
                )
            )
    return problems


@functools.lru_cache(maxsize=256)
def _schema_error(schema: str) -> str | None:
    """llguidance's complaint about a JSON schema; None when it compiles or llguidance
    is not installed (the engine, which needs it, then refuses the grammar itself)."""
    try:
        import llguidance  # on workers (the engines' constrained decoding); absent in `app`
    except ImportError:
        return None
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    except ValueError as exc:
        return str(exc) or "not a JSON object"
    error = llguidance.LLMatcher.validate_grammar(grammar)
    return error or None


__all__ = ["ANY_OBJECT", "constrained", "output_grammar", "schema_problems"]
