"""The sampled tokens of one call as the answer's message: content and/or tool calls.

The text is the completion decoded without its end-of-turn token (as the built-in
agent reads it). Tool calls are read only when the request offers tools with
``tool_choice`` ``"auto"`` and the turn ended (``finish_reason`` ``"length"``
is a cut-off text, not an answer to act on); then each readable
``<tool_call>{json}</tool_call>`` block becomes a call whose ``arguments`` is the
arguments' text exactly as sampled (`rl_core.agent.toolcalls.scan_tool_calls`), so
a client that hands it to its tool, or echoes it back, sees the model's own bytes.
The content is the text outside those blocks, stripped (null when empty); a block
that cannot be read stays in the content, where the client can see what the model
wrote. Without tool calls the content is the text as sampled, unstripped.

`Reply.text` is the sampled text the message stands for: the session renders the
message from it when the client sends it back (`rl_core.sessions.render`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rl_core.agent.toolcalls import scan_tool_calls
from rl_core.models.tokenizer import Tokenizer
from rl_core.protocol.chat_completions import (
    ChoiceLogprobs,
    FinishReason,
    FunctionCallOut,
    ReplyMessage,
    TokenLogprob,
    ToolCallOut,
)
from rl_core.rollout.base import Completion


@dataclasses.dataclass(frozen=True)
class Reply:
    message: ReplyMessage
    finish_reason: FinishReason
    text: str  # the sampled text, end-of-turn token left out
    text_tokens: int  # how many of the completion's tokens ``text`` decodes


def read_reply(
    completion: Completion, tokenizer: Tokenizer, *, calls_tools: bool, id_prefix: str
) -> Reply:
    """The answer ``completion`` stands for; tool call ids are ``f"{id_prefix}_{i}"``."""
    ended = completion.finish_reason == "stop"
    body = completion.tokens[:-1] if ended else completion.tokens
    text = tokenizer.decode(body)
    finish: FinishReason = "stop" if ended else "length"
    blocks = [
        (b.start, b.end, b.name, b.arguments_text)
        for b in (scan_tool_calls(text) if calls_tools and ended else ())
        if b.name is not None and b.arguments_text is not None  # a readable call
    ]
    if not blocks:
        return Reply(ReplyMessage(content=text), finish, text, len(body))
    calls, outside, cursor = [], [], 0
    for i, (start, end, name, arguments) in enumerate(blocks):
        function = FunctionCallOut(name=name, arguments=arguments)
        calls.append(ToolCallOut(id=f"{id_prefix}_{i}", function=function))
        outside.append(text[cursor:start])
        cursor = end
    outside.append(text[cursor:])
    content = "".join(outside).strip() or None
    return Reply(ReplyMessage(content=content, tool_calls=calls), "tool_calls", text, len(body))


def token_logprobs(
    tokens: Sequence[int], logprobs: Sequence[float], tokenizer: Tokenizer
) -> ChoiceLogprobs:
    """OpenAI's ``logprobs.content``: each token (special ones spelled out) and its logprob."""
    content = []
    for token, logprob in zip(tokens, logprobs, strict=True):
        piece = tokenizer.decode([token], skip_special=False)
        content.append(
            TokenLogprob(token=piece, logprob=float(logprob), bytes=list(piece.encode()))
        )
    return ChoiceLogprobs(content=content)


__all__ = ["Reply", "read_reply", "token_logprobs"]
