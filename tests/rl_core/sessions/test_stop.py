"""``stop`` strings: the answer is cut at the token that completes one, and that is recorded.

The engine is `ScriptedEngine` (chosen token ids); the expected ids are written from each
tokenizer's encoding of the texts by hand, and each test checks the token boundaries it
relies on before relying on them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rl_core.models.tokenizer import BuiltinTokenizer, Tokenizer
from rl_core.protocol.chat_completions import (
    ChatCompletion,
    parse_request,
    stream_completion,
)
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.session import ChatSession, SessionConfig
from rl_core.sessions.stop import find_stop
from tests.rl_core.protocol.test_chat_completions_stream import accumulate

SAID = "The answer is 84. END"
AFTER = " and more"  # sampled after the stop string: never shown, never recorded
QUESTION = [{"role": "user", "content": "What is 12 * 7?"}]


def session_of(tok: Tokenizer, *replies: list[int]) -> tuple[ChatSession, ScriptedEngine]:
    engine = ScriptedEngine(replies, stop_ids=[tok.end_of_turn_id])
    config = SessionConfig(sampling=SamplingParams(), max_new_tokens=256)
    return ChatSession("s", engine=engine, tokenizer=tok, config=config), engine


def ask(session: ChatSession, messages: list[dict[str, Any]], **fields: Any) -> ChatCompletion:
    body = {"model": "p", "messages": messages, **fields}
    return asyncio.run(session.complete(parse_request(json.dumps(body))))


def test_the_answer_is_cut_before_the_stop_string_and_the_kept_tokens_are_recorded(
    chat_tokenizer: Tokenizer,
) -> None:
    tok = chat_tokenizer
    kept = tok.encode(SAID)  # the stop string ends at a token boundary of the whole text
    assert tok.encode(SAID + AFTER) == kept + tok.encode(AFTER)
    reply = [*kept, *tok.encode(AFTER), tok.end_of_turn_id]
    session, engine = session_of(tok, reply, [*tok.encode("Yes."), tok.end_of_turn_id])

    first = ask(session, QUESTION, stop="END", logprobs=True)
    (choice,) = first.choices
    assert choice.message.content == "The answer is 84. " and choice.finish_reason == "stop"
    assert first.usage.completion_tokens == len(kept)
    assert choice.logprobs is not None
    content = choice.logprobs.content or []
    assert [t.logprob for t in content] == [-0.1] * len(kept)
    assert "".join(t.token for t in content) == SAID  # the tokens returned spell the stop
    (call,) = session.ledger.calls
    assert list(call.completion) == kept and list(call.logprobs) == [-0.1] * len(kept)

    messages = [*QUESTION, choice.message.echo(), {"role": "user", "content": "Sure?"}]
    ask(session, messages)
    assert session.ledger.prefix_breaks == 0
    p0, p1 = engine.prompts
    # The next call continues the kept tokens; the template closes the turn (an observation).
    assert p1[: len(p0) + len(kept) + 1] == [*p0, *kept, tok.end_of_turn_id]
    traj = session.finish(reward=1.0)
    (sample,) = traj.samples
    model = [i for i, m in enumerate(sample.loss_mask) if m]
    c1 = [*tok.encode("Yes."), tok.end_of_turn_id]
    assert model == [*range(len(p0), len(p0) + len(kept)), *range(len(p1), len(p1) + len(c1))]
    assert sample.tokens == p1 + c1


def test_a_stop_string_across_two_tokens_and_one_inside_a_token() -> None:
    tok = BuiltinTokenizer()
    higher = tok.token_id("higher")  # one token of the builtin vocabulary
    digits = tok.encode("It is 84")
    assert len(tok.encode("84")) == 2 and tok.encode("It is higher") == [*digits[:-2], higher]
    session, _ = session_of(
        tok,
        [*digits, *tok.encode(". Done"), tok.end_of_turn_id],
        [*digits[:-2], higher, *tok.encode(" still"), tok.end_of_turn_id],
    )
    across = ask(session, QUESTION, stop=["84"])
    assert across.choices[0].message.content == "It is "
    assert list(session.ledger.calls[0].completion) == digits  # to the "4" that completes it
    inside = ask(session, QUESTION, stop=["gh"])
    assert inside.choices[0].message.content == "It is hi"  # part of the token's text
    assert list(session.ledger.calls[1].completion) == [*digits[:-2], higher]


def test_the_first_stop_string_to_complete_wins_whatever_its_place_in_the_list() -> None:
    tok = BuiltinTokenizer()
    text = tok.encode("one. two; three")
    cut = find_stop(text, ["three", ";", "."], tok)
    assert cut is not None and (cut.shown, cut.text) == ("one", "one.")
    assert cut.kept == len(tok.encode("one."))
    # Two that complete in the same token: the text shown holds neither.
    overlapping = find_stop(tok.encode("abcd"), ["bc", "abc"], tok)
    assert overlapping is not None and overlapping.shown == "" and overlapping.kept == 3


def test_no_stop_string_in_the_text_leaves_the_answer_as_it_was() -> None:
    tok = BuiltinTokenizer()
    reply = [*tok.encode(SAID), tok.end_of_turn_id]
    plain, _ = session_of(tok, reply)
    stopped, _ = session_of(tok, reply)
    without = ask(plain, QUESTION)
    with_stop = ask(stopped, QUESTION, stop=["STOP", "\n\n"])
    assert with_stop.model_dump() == without.model_dump()
    assert stopped.ledger.calls == plain.ledger.calls
    assert list(stopped.ledger.calls[0].completion) == reply  # the end-of-turn token too


def test_a_stop_string_in_the_text_cuts_before_tool_calls_are_read() -> None:
    tok = BuiltinTokenizer()
    block = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    reply = [*tok.encode(f"Adding.\n{block}\nDone"), tok.end_of_turn_id]
    tools = [{"type": "function", "function": {"name": "add"}}]
    session, _ = session_of(tok, reply)
    before = ask(session, QUESTION, tools=tools, stop="<tool_call>")
    assert before.choices[0].message.model_dump(exclude_none=True) == {
        "role": "assistant",
        "content": "Adding.\n",
    }
    assert before.choices[0].finish_reason == "stop"
    # A stop after the block: the turn ended there, and the block is a call.
    after = ask(session, QUESTION, tools=tools, stop="Done")
    assert after.choices[0].finish_reason == "tool_calls"
    (call,) = after.choices[0].message.tool_calls or []
    assert call.function.arguments == '{"a": 1}'


def test_a_stop_string_past_the_token_limit_is_a_length_cut_and_streams_the_same() -> None:
    tok = BuiltinTokenizer()
    reply = [*tok.encode(SAID), tok.end_of_turn_id]
    session, _ = session_of(tok, reply)
    cut = ask(session, QUESTION, stop="END", max_tokens=5)
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.content == tok.decode(reply[:5])
    stopped = ask(session, QUESTION, stop="END", logprobs=True)
    got = accumulate(stream_completion(stopped, include_usage=True, piece_chars=4))
    assert got["message"] == stopped.choices[0].message.echo()
    assert got["finish_reason"] == "stop" and got["usage"] == stopped.usage.model_dump()
    assert stopped.choices[0].logprobs is not None
    assert got["logprobs"] == [t.model_dump() for t in stopped.choices[0].logprobs.content or []]
