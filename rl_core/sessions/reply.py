"""The sampled tokens of one call as the answer's message: content and/or tool calls.

The text is the completion decoded without its end-of-turn token (as the built-in
agent reads it); when the request gives ``stop`` strings and that text reaches one,
the answer is the tokens up to the one that completes it, shown up to the string
(`rl_core.sessions.stop`). Tool calls are read in the text shown, only when the
request offers tools with ``tool_choice`` ``"auto"`` and the turn ended (at the
end-of-turn token or a stop string; ``finish_reason`` ``"length"`` is a cut-off
text, not an answer to act on); then each readable ``<tool_call>{json}</tool_call>``
block becomes a call whose ``arguments`` is the arguments' text exactly as sampled
(`rl_core.agent.toolcalls.scan_tool_calls`), so a client that hands it to its tool,
or echoes it back, sees the model's own bytes. The content is the text outside those
blocks, stripped (null when empty); a block that cannot be read stays in the content,
where the client can see what the model wrote. Without tool calls the content is the
text as sampled, unstripped.

`SampledText.text` is the sampled text the message stands for: the session renders
the message from it when the client sends it back (`rl_core.sessions.render`), and
`SampledText.kept` the tokens it records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from rl_core.agent.toolcalls import scan_tool_calls
from rl_core.models.tokenizer import Tokenizer
from rl_core.protocol.chat_completions import (
    ChoiceLogprobs,
    FinishReason,
    FunctionCallOut,
    ReplyMessage,
    TokenLogprob,
    ToolCallOut,
    TopLogprob,
)
from rl_core.protocol.completions import CompletionLogprobs
from rl_core.rollout.base import Completion
from rl_core.sessions.stop import find_stop


@dataclasses.dataclass(frozen=True)
class SampledText:
    """The part of a completion an answer stands for, and its text."""

    shown: str  # what the client reads: no end-of-turn token, nothing from a stop string on
    text: str  # the text of the answer's tokens, a stop string included (rendered when echoed)
    text_tokens: int  # how many of the completion's tokens ``text`` decodes (their logprobs)
    kept: int  # how many of them the answer stands for: recorded, trained on
    finish_reason: Literal["stop", "length"]


def read_text(
    completion: Completion, tokenizer: Tokenizer, stop: Sequence[str] = ()
) -> SampledText:
    """The completion as text: to its end-of-turn token, or cut at the first stop string."""
    ended = completion.finish_reason == "stop"
    body = completion.tokens[:-1] if ended else completion.tokens
    cut = find_stop(body, stop, tokenizer)
    if cut is not None:
        return SampledText(cut.shown, cut.text, cut.kept, cut.kept, "stop")
    text = tokenizer.decode(body)
    kept = len(completion.tokens)  # the end-of-turn token too: the model ended its turn
    return SampledText(text, text, len(body), kept, "stop" if ended else "length")


@dataclasses.dataclass(frozen=True)
class Reply:
    message: ReplyMessage
    finish_reason: FinishReason
    sampled: SampledText


def read_reply(
    completion: Completion,
    tokenizer: Tokenizer,
    *,
    calls_tools: bool,
    id_prefix: str,
    stop: Sequence[str] = (),
) -> Reply:
    """The answer ``completion`` stands for; tool call ids are ``f"{id_prefix}_{i}"``."""
    sampled = read_text(completion, tokenizer, stop)
    text, finish = sampled.shown, sampled.finish_reason
    blocks = [
        (b.start, b.end, b.name, b.arguments_text)
        for b in (scan_tool_calls(text) if calls_tools and finish == "stop" else ())
        if b.name is not None and b.arguments_text is not None  # a readable call
    ]
    if not blocks:
        return Reply(ReplyMessage(content=text), finish, sampled)
    calls, outside, cursor = [], [], 0
    for i, (start, end, name, arguments) in enumerate(blocks):
        function = FunctionCallOut(name=name, arguments=arguments)
        calls.append(ToolCallOut(id=f"{id_prefix}_{i}", function=function))
        outside.append(text[cursor:start])
        cursor = end
    outside.append(text[cursor:])
    content = "".join(outside).strip() or None
    return Reply(ReplyMessage(content=content, tool_calls=calls), "tool_calls", sampled)


def recorded(completion: Completion, sampled: SampledText) -> Completion:
    """What the ledger records of ``completion``: the tokens the answer stands for."""
    if sampled.kept == len(completion.tokens):
        return completion
    # Cut at a stop string: the turn ended there, though on no stop token.
    return dataclasses.replace(
        completion,
        tokens=completion.tokens[: sampled.kept],
        logprobs=completion.logprobs[: sampled.kept],
        finish_reason="stop",
    )


# Per token of a completion, its most likely alternatives: (token id, logprob), best first.
TopCandidates = Sequence[Sequence[tuple[int, float]]]


def token_logprobs(
    tokens: Sequence[int],
    logprobs: Sequence[float],
    tokenizer: Tokenizer,
    *,
    top: TopCandidates | None = None,
) -> ChoiceLogprobs:
    """OpenAI's ``logprobs.content``: each token (special ones spelled out) with its logprob,
    its UTF-8 bytes, and with ``top`` (the engine's ``Completion.top_logprobs``) its most
    likely alternatives, as OpenAI lists them."""
    content = []
    for i, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
        piece = _piece(token, tokenizer)
        alternatives = [
            TopLogprob(token=p, logprob=float(lp), bytes=list(p.encode()))
            for p, lp in ((_piece(t, tokenizer), lp) for t, lp in (top[i] if top else ()))
        ]
        content.append(
            TokenLogprob(
                token=piece,
                logprob=float(logprob),
                bytes=list(piece.encode()),
                top_logprobs=alternatives,
            )
        )
    return ChoiceLogprobs(content=content)


def text_logprobs(
    tokens: Sequence[int],
    logprobs: Sequence[float],
    tokenizer: Tokenizer,
    *,
    start: int,
    top: TopCandidates | None = None,
) -> CompletionLogprobs:
    """The legacy ``logprobs``: each token, its logprob, its ``top_logprobs`` entry (the
    ``top`` alternatives, then the sampled token: OpenAI always adds it; with ``logprobs:
    0`` it is alone) and its offset from the prompt's start (the prompt ``start``
    characters long; the tokens' texts counted as ``tokens`` spells them)."""
    pieces = [_piece(token, tokenizer) for token in tokens]
    offsets, at = [], start
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    values = [float(lp) for lp in logprobs]
    entries = []
    for i, (piece, value) in enumerate(zip(pieces, values, strict=True)):
        entry = {_piece(t, tokenizer): float(lp) for t, lp in (top[i] if top else ())}
        entry.setdefault(piece, value)
        entries.append(entry)
    return CompletionLogprobs(
        tokens=pieces, token_logprobs=values, top_logprobs=entries, text_offset=offsets
    )


def _piece(token: int, tokenizer: Tokenizer) -> str:
    return tokenizer.decode([token], skip_special=False)


__all__ = [
    "Reply",
    "SampledText",
    "TopCandidates",
    "read_reply",
    "read_text",
    "recorded",
    "text_logprobs",
    "token_logprobs",
]
