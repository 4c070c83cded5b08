"""A client-driven session end to end: requests in, answers out, the recorded trajectory.

The engine is `ScriptedEngine`, which answers with chosen token ids and logprobs and keeps
every prompt it was given (what the model saw); everything else is the real code, with
the builtin tokenizer and with SmolLM2's real tokenizer and chat template. The expected
token ids are written out from each format by hand, not computed by the code under test.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from rl_core.agent.toolcalls import describe_tools
from rl_core.models.tokenizer import BuiltinTokenizer, Tokenizer
from rl_core.protocol.chat_completions import (
    ChatCompletion,
    ChatCompletionError,
    parse_request,
    stream_completion,
)
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.session import ChatSession, SessionConfig
from tests.rl_core.protocol.test_chat_completions_stream import accumulate

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
SYSTEM = "You are a careful calculator agent."
QUESTION = "What is 12 * 7?"
# Odd spacing and key order on purpose: the client must get these bytes back as sampled.
ARGUMENTS = '{"expression":  "12 * 7",\n "precision" : 2}'
CALLING = (
    f'Let me compute.\n<tool_call>{{"name": "calculator", "arguments": {ARGUMENTS}}}</tool_call>'
)
ANSWER = "It is 84."
RUN = SamplingParams(temperature=0.7, top_p=1.0)


def turn(tok: Tokenizer, role: str, text: str) -> list[int]:
    """One whole turn, written from the tokenizer's format (not from render_messages)."""
    if isinstance(tok, BuiltinTokenizer):
        return [tok.token_id(f"<|{role}|>"), *tok.encode(text), tok.end_of_turn_id]
    return tok.encode(f"<|im_start|>{role}\n{text}<|im_end|>\n")


def opening(tok: Tokenizer) -> list[int]:
    if isinstance(tok, BuiltinTokenizer):
        return [tok.token_id("<|assistant|>")]
    return tok.encode("<|im_start|>assistant\n")


def after_turn(tok: Tokenizer) -> list[int]:
    """What a template writes after the end-of-turn token the model sampled."""
    return [] if isinstance(tok, BuiltinTokenizer) else tok.encode("\n")


def sampled(tok: Tokenizer, text: str) -> list[int]:
    return [*tok.encode(text), tok.end_of_turn_id]


def new_session(tok: Tokenizer, *replies: str, **config: Any) -> tuple[ChatSession, ScriptedEngine]:
    engine = ScriptedEngine([sampled(tok, r) for r in replies], stop_ids=[tok.end_of_turn_id])
    session = ChatSession(
        "s-1",
        engine=engine,
        tokenizer=tok,
        config=SessionConfig(
            sampling=RUN, **{"max_new_tokens": 256, "max_context": 4096, **config}
        ),
        clock=lambda: 1_700_000_000.0,
    )
    return session, engine


def ask(session: ChatSession, messages: list[dict[str, Any]], **fields: Any) -> ChatCompletion:
    body = {"model": "my-policy", "messages": messages, "tools": TOOLS, **fields}
    return asyncio.run(session.complete(parse_request(json.dumps(body))))


def opening_messages() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


def tool_loop(session: ChatSession, engine: ScriptedEngine) -> list[ChatCompletion]:
    """What a client's agent loop does: ask, run the tools it is told to, send the results."""
    messages = opening_messages()
    first = ask(session, messages, logprobs=True)
    message = first.choices[0].message.echo()
    results = [
        {"role": "tool", "tool_call_id": call["id"], "content": "84"}
        for call in message["tool_calls"]
    ]
    engine.update_weights(None, 1)  # the policy moves on between the two calls
    second = ask(session, [*messages, message, *results])
    return [first, second]


def test_a_tool_calling_conversation_is_recorded_token_exact(chat_tokenizer: Tokenizer) -> None:
    tok = chat_tokenizer
    session, engine = new_session(tok, CALLING, ANSWER)
    first, second = tool_loop(session, engine)

    # The answers, as the client saw them.
    (choice,) = first.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me compute."
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_0_0",
        "calculator",
        ARGUMENTS,
    )
    assert second.choices[0].message.model_dump(mode="json") == {
        "role": "assistant",
        "content": ANSWER,
    }
    assert second.choices[0].finish_reason == "stop"
    assert (first.id, second.id, first.model, first.created) == (
        "chatcmpl-s-1-0",
        "chatcmpl-s-1-1",
        "my-policy",
        1_700_000_000,
    )

    # What the model saw, written out by hand: the tools in the system turn, and after the
    # first answer exactly what the template renders around the tool result.
    system = f"{SYSTEM}\n\n{describe_tools(TOOLS)}"
    c0, c1 = sampled(tok, CALLING), sampled(tok, ANSWER)
    p0 = turn(tok, "system", system) + turn(tok, "user", QUESTION) + opening(tok)
    observation = after_turn(tok) + turn(tok, "tool", "84") + opening(tok)
    assert engine.prompts == [p0, p0 + c0 + observation]
    assert first.usage.prompt_tokens == len(p0) and first.usage.completion_tokens == len(c0)

    traj = session.finish(reward=1.0)
    assert len(traj.samples) == 1 and traj.info["prefix_breaks"] == 0
    assert traj.tokens == p0 + c0 + observation + c1
    n0, n1 = len(p0), len(p0) + len(c0) + len(observation)
    model_positions = [*range(n0, n0 + len(c0)), *range(n1, n1 + len(c1))]
    assert [i for i, m in enumerate(traj.loss_mask) if m] == model_positions
    assert [traj.tokens[i] for i in model_positions] == c0 + c1
    assert traj.logprobs == (
        [0.0] * n0 + [-0.1] * len(c0) + [0.0] * len(observation) + [-0.2] * len(c1)
    )
    assert traj.samples[0].turns == (
        [-1] * n0 + [0] * len(c0) + [-1] * len(observation) + [1] * len(c1)
    )
    assert traj.turns == 2 and traj.turn_versions == [0, 1] and traj.policy_version == 0
    assert traj.reward == 1.0 and traj.turn_rewards == [0.0, 1.0]
    assert traj.end_state == "done" and traj.episode_id == "s-1"
    assert traj.sampling == {"temperature": 0.7, "top_p": 1.0, "top_k": 0}

    # logprobs: one per token of the text, the end-of-turn token left out.
    assert first.choices[0].logprobs is not None
    content = first.choices[0].logprobs.content or []
    assert [t.logprob for t in content] == [-0.1] * (len(c0) - 1)
    assert "".join(t.token for t in content) == CALLING


def test_tool_call_arguments_round_trip_byte_exact(smollm2_chat: Tokenizer) -> None:
    """What the model wrote inside the call comes back as is, non-ASCII and spacing included;
    echoed back, it renders to the very tokens the model sampled."""
    tok = smollm2_chat
    arguments = '{"expression":"(1+2)*3",  "note": "café ✓ — 日本", "n": [1, 2.50, null]}'
    calling = f'<tool_call>\n{{"arguments": {arguments}, "name": "calculator"}}\n</tool_call>'
    session, engine = new_session(tok, calling, ANSWER, ANSWER, ANSWER)
    first = ask(session, opening_messages())
    message = first.choices[0].message
    assert message.content is None and message.tool_calls is not None
    assert message.tool_calls[0].function.arguments == arguments
    assert json.loads(message.tool_calls[0].function.arguments)["note"] == "café ✓ — 日本"

    echo = message.echo()
    result = {"role": "tool", "tool_call_id": "call_0_0", "content": "9"}
    ask(session, [*opening_messages(), echo, result])
    c0 = sampled(tok, calling)
    p0, p1 = engine.prompts[0], engine.prompts[1]
    assert p1[len(p0) : len(p0) + len(c0)] == c0
    assert session.ledger.prefix_breaks == 0

    # LangChain echoes the arguments re-serialised (json.dumps of the parsed object): the
    # same call by its id, name and JSON value, so it is still rendered from the sampled
    # text. Sent again after the answer that followed it, it is a retry: a `reply` break
    # whose prompt is exactly the second call's, token for token.
    reserialised = json.loads(json.dumps(echo))
    reserialised["tool_calls"][0]["function"]["arguments"] = json.dumps(json.loads(arguments))
    ask(session, [*opening_messages(), reserialised, result])
    assert engine.prompts[2] == p1
    (retry,) = session.ledger.breaks
    assert retry.call == 2 and retry.where == "reply"

    # Arguments edited to another value are the client's message, rendered canonically:
    # the history departs inside the first answer.
    edited = json.loads(json.dumps(echo))
    edited["tool_calls"][0]["function"]["arguments"] = '{"expression": "(1+2)*4"}'
    ask(session, [*opening_messages(), edited, result])
    departure = session.ledger.breaks[-1]
    assert departure.call == 3 and departure.where == "history"
    assert len(p0) <= departure.at < len(p0) + len(c0)


def test_an_edited_earlier_message_is_a_counted_prefix_break(chat_tokenizer: Tokenizer) -> None:
    tok = chat_tokenizer
    session, engine = new_session(tok, CALLING, ANSWER)
    first = ask(session, opening_messages())
    edited = opening_messages()
    edited[1]["content"] = "What is 12 * 8?"  # the client rewrote its question
    echo = first.choices[0].message.echo()
    result = {"role": "tool", "tool_call_id": "call_0_0", "content": "96"}
    ask(session, [*edited, echo, result])

    (departure,) = session.ledger.breaks
    assert departure.call == 1 and departure.where == "history"
    assert departure.at < len(engine.prompts[0])
    traj = session.finish(reward=0.5)
    assert traj.info["prefix_breaks"] == 1 and len(traj.samples) == 2
    c0, c1 = sampled(tok, CALLING), sampled(tok, ANSWER)
    old, new = traj.samples
    # Each sample is exactly one call's context and answer: nothing was re-tokenised.
    assert old.tokens == engine.prompts[0] + c0
    assert new.tokens == engine.prompts[1] + c1
    assert [t for t, m in zip(old.tokens, old.loss_mask, strict=True) if m] == c0
    assert [t for t, m in zip(new.tokens, new.loss_mask, strict=True) if m] == c1
    assert set(old.turns) == {-1, 0} and set(new.turns) == {-1, 1}
    assert traj.turn_versions == [0, 0] and traj.turn_rewards == [0.0, 0.5]


def test_a_streamed_answer_reassembles_to_the_same_message(chat_tokenizer: Tokenizer) -> None:
    session, engine = new_session(chat_tokenizer, CALLING, ANSWER)
    for answer in tool_loop(session, engine):
        events = stream_completion(answer, include_usage=True, piece_chars=3)
        got = accumulate(events)
        assert got["message"] == answer.choices[0].message.echo()
        assert got["finish_reason"] == answer.choices[0].finish_reason
        assert got["usage"] == answer.usage.model_dump()
        if answer.choices[0].logprobs is not None:
            assert got["logprobs"] == [
                t.model_dump() for t in answer.choices[0].logprobs.content or []
            ]


def test_a_cut_off_turn_is_text_and_the_next_call_still_extends() -> None:
    tok = BuiltinTokenizer()
    session, engine = new_session(tok, CALLING, ANSWER)
    cut = len(tok.encode(CALLING)) - 3  # inside the closing tag
    first = ask(session, opening_messages(), max_tokens=cut)
    (choice,) = first.choices
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content == tok.decode(tok.encode(CALLING)[:cut])
    messages = [*opening_messages(), choice.message.echo(), {"role": "user", "content": "Go on"}]
    ask(session, messages)
    assert session.ledger.prefix_breaks == 0
    (sample,) = session.ledger.samples
    start = len(engine.prompts[0]) + cut
    # The end-of-turn token the model never wrote is the template's: an observation.
    assert sample.tokens[start] == tok.end_of_turn_id and sample.loss_mask[start] == 0


def test_tool_choice_none_keeps_the_context_and_answers_in_text() -> None:
    tok = BuiltinTokenizer()
    auto, auto_engine = new_session(tok, CALLING)
    none, none_engine = new_session(tok, CALLING)
    ask(auto, opening_messages())
    answer = ask(none, opening_messages(), tool_choice="none")
    assert none_engine.prompts == auto_engine.prompts  # the tools are described either way
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content == CALLING
    assert answer.choices[0].message.tool_calls is None


def test_a_client_written_assistant_message_is_rendered_canonically() -> None:
    tok = BuiltinTokenizer()
    session, engine = new_session(tok, ANSWER)
    history = {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "mine",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "mine", "content": "2"}
    ask(session, [*opening_messages(), history, result])
    written = (
        'Checking.<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    )
    assert tok.decode(engine.prompts[0]).endswith(written + "2")


def test_context_limit_and_a_finished_session() -> None:
    tok = BuiltinTokenizer()
    session, engine = new_session(tok, ANSWER, max_context=64)
    with pytest.raises(ChatCompletionError) as caught:
        ask(session, opening_messages())  # the tool description alone is longer
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    asyncio.run(session.complete(parse_request(body)))
    assert engine.prompts and len(engine.prompts[0]) < 64
    session.finish(reward=0.0)
    with pytest.raises(ChatCompletionError) as caught:
        asyncio.run(session.complete(parse_request(body)))
    assert caught.value.status == 409 and caught.value.code == "session_finished"
