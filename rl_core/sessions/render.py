"""A chat-completions request as the prompt token ids the policy continues.

The prompt is what the model's chat template renders for the request, through the
`Tokenizer` protocol the built-in agent uses (``render_messages`` then
``assistant_prefix``), so a session's model sees what the built-in agent's model
sees for the same conversation. Three choices make it fit a client that echoes the
session's own answers back:

- **An assistant message this session produced is rendered from the text the model
  sampled** (`SampledReplies`: the message's content and tool calls -> that text).
  The answer split the text into content and tool calls, and joining them again
  would lose what lay between (a newline before a ``<tool_call>``, the JSON's
  spacing); the sampled text re-renders to the sampled tokens wherever the tokenizer
  reads it back the same way. A message is this session's when it comes back as
  sent, or when its tool calls carry this session's call ids with the same names and
  the same arguments *as JSON values* and its content is the same: LangChain echoes
  an answer's arguments re-serialised (``json.dumps`` of the parsed object), which
  is still the model's answer. Any other assistant message (written or edited by the
  client) is rendered canonically (`assistant_text`). Echoed fields that are not the
  model's text (``reasoning_content``, ``refusal``, ...) are not rendered.
- **Tools are described in the system message** in the Hermes/Qwen text
  (`rl_core.agent.toolcalls.describe_tools`), appended to the first system message
  or as a new one. The `Tokenizer` protocol renders messages only, and small
  models' templates (SmolLM2's) drop a ``tools`` list anyway. They are described
  even with ``tool_choice: "none"``, so that the choice does not change the
  context of the turns before.
- ``developer`` messages are rendered as ``system``; a tool message keeps its
  ``tool_call_id`` for templates that read it.

**The model's own tokens, spliced back** (`splice`): a sampled text does not always
encode back to the tokens that were sampled (a random-init model's characters merge
into one of the tokenizer's words; a BPE model samples a non-canonical split), so the
rendered prompt can spell the history right and still differ from it in tokens. When
the rendered prompt's *text* starts with the previous call's prompt and completion,
the prompt is those exact tokens followed by the template's tokens for what came
after. This is what the built-in agent does (it continues its own ledger), and the
model then sees, and is trained on, what it sampled. A prompt whose text departs
from the history (an edited or dropped message) is not touched: the ledger records a
prefix break (`rl_core.sessions.ledger`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rl_core.agent.toolcalls import CLOSE, OPEN, describe_tools
from rl_core.models.tokenizer import Tokenizer
from rl_core.protocol.chat_completions import (
    AssistantMessage,
    ChatCompletionRequest,
    ReplyMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)

# An assistant message by what a client sees of it: its content, and each tool call's
# (id, name, arguments). The ids are unique per session, so a key names one answer.
ReplyKey = tuple[str | None, tuple[tuple[str, str, str], ...]]


def reply_key(message: AssistantMessage | ReplyMessage) -> ReplyKey:
    calls = tuple(
        (call.id, call.function.name, call.function.arguments) for call in message.tool_calls or ()
    )
    return message.content, calls


class SampledReplies:
    """This session's answers -> the text the model sampled for each."""

    def __init__(self) -> None:
        self._exact: dict[ReplyKey, str] = {}
        self._by_ids: dict[tuple[str, ...], tuple[ReplyKey, str]] = {}

    def add(self, message: ReplyMessage, text: str) -> None:
        key = reply_key(message)
        self._exact[key] = text
        if key[1]:
            self._by_ids[tuple(call[0] for call in key[1])] = (key, text)

    def text_of(self, message: AssistantMessage) -> str | None:
        """The sampled text of ``message`` if it is one of this session's answers."""
        key = reply_key(message)
        if key in self._exact:
            return self._exact[key]
        found = self._by_ids.get(tuple(call[0] for call in key[1])) if key[1] else None
        if found is None:
            return None
        (content, calls), text = found
        same = (key[0] or "").strip() == (content or "").strip() and all(
            name == other_name and _same_json(arguments, other_arguments)
            for (_, name, arguments), (_, other_name, other_arguments) in zip(
                key[1], calls, strict=True
            )
        )
        return text if same else None


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except json.JSONDecodeError:
        return False


def assistant_text(message: AssistantMessage) -> str:
    """A client-written assistant message as the model would have written it: the content,
    then each call as ``<tool_call>{"name": ..., "arguments": <the arguments text>}</tool_call>``.
    """
    calls = "".join(
        f'{OPEN}{{"name": {json.dumps(c.function.name)}, "arguments": {c.function.arguments}}}'
        f"{CLOSE}"
        for c in message.tool_calls or ()
    )
    return (message.content or "") + calls


def template_messages(
    request: ChatCompletionRequest, replies: SampledReplies | None = None
) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them (see the module docstring)."""
    replies = SampledReplies() if replies is None else replies
    out: list[dict[str, Any]] = []
    for message in request.messages:
        if isinstance(message, SystemMessage):
            out.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            out.append({"role": "user", "content": message.content})
        elif isinstance(message, ToolMessage):
            out.append(
                {"role": "tool", "content": message.content, "tool_call_id": message.tool_call_id}
            )
        else:
            text = replies.text_of(message)
            out.append(
                {"role": "assistant", "content": assistant_text(message) if text is None else text}
            )
    if request.tools:
        tools = [tool.model_dump(mode="json", exclude_none=True) for tool in request.tools]
        out = _with_tools(out, describe_tools(tools))
    return out


def render_prompt(
    request: ChatCompletionRequest,
    tokenizer: Tokenizer,
    replies: SampledReplies | None = None,
) -> list[int]:
    """The prompt token ids: the rendered messages, then the assistant's opening.

    Raises what the tokenizer raises for messages its template refuses (`ValueError`,
    `rl_core.errors.RlCoreError`).
    """
    messages = template_messages(request, replies)
    return tokenizer.render_messages(messages) + tokenizer.assistant_prefix()


def splice(
    prompt: Sequence[int],
    history: Sequence[int],
    tokenizer: Tokenizer,
    *,
    sampled: Sequence[int] | None = None,
) -> list[int] | None:
    """``history`` (the session's tokens so far: the last call's prompt + completion) + the
    rest of ``prompt``, when ``prompt``'s text starts with ``history``'s text and one of its
    token boundaries lies where that text ends; None when the texts depart (see the module
    docstring).

    ``sampled`` marks the tokens the model sampled (1) in ``history`` (its loss mask): their
    text is taken as the client read it, the special tokens the model sampled inside an
    answer left out (as the answer left them out) and the stop token that ended an answer
    (end-of-turn or end-of-sequence) as the template's end-of-turn.
    """
    common = 0
    for a, b in zip(prompt, history, strict=False):
        if a != b:
            break
        common += 1
    if common == len(history):
        return list(prompt)  # already an extension
    text = _as_read(history, sampled, common, tokenizer)
    # Walk the prompt's tokens from where the two part until their text covers the
    # history's: a boundary there splices; text that departs first, or no boundary, not.
    for end in range(common + 1, len(prompt) + 1):
        piece = tokenizer.decode(prompt[common:end], skip_special=False)
        if piece == text:
            return [*history, *prompt[end:]]
        if len(piece) >= len(text) or not text.startswith(piece.rstrip("\ufffd")):
            return None
    return None


def _as_read(
    history: Sequence[int], sampled: Sequence[int] | None, start: int, tokenizer: Tokenizer
) -> str:
    """``history[start:]`` as text, the model's answers as the client read them."""
    if sampled is None:
        return tokenizer.decode(history[start:], skip_special=False)
    parts, run_start = [], start
    for i in range(start, len(history) + 1):
        if i < len(history) and (i == run_start or sampled[i] == sampled[run_start]):
            continue
        run = history[run_start:i]
        if not sampled[run_start]:
            parts.append(tokenizer.decode(run, skip_special=False))
        elif run and run[-1] in (tokenizer.end_of_turn_id, tokenizer.eos_id):
            # The answer's stop token: the template closes the turn its own way.
            closing = tokenizer.decode([tokenizer.end_of_turn_id], skip_special=False)
            parts.append(tokenizer.decode(run[:-1]) + closing)
        else:
            parts.append(tokenizer.decode(run))
        run_start = i
    return "".join(parts)


def _with_tools(messages: Sequence[dict[str, Any]], description: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{description}"}, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]


__all__ = [
    "ReplyKey",
    "SampledReplies",
    "assistant_text",
    "render_prompt",
    "reply_key",
    "splice",
    "template_messages",
]
