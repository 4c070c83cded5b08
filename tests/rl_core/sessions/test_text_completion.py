"""Legacy text completions in a session: the client's text as the prompt, the same ledger.

The engine is `ScriptedEngine` (chosen token ids). Expected ids are written from each
tokenizer's encoding of the texts, the token boundaries relied on checked first.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from rl_core.models.tokenizer import BuiltinTokenizer, Tokenizer
from rl_core.protocol.chat_completions import ChatCompletionError, parse_request
from rl_core.protocol.completions import TextCompletion, parse_completion_request
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.sampling import ClientSampling
from rl_core.sessions.session import ChatSession, SessionConfig

TOK = BuiltinTokenizer()
EOT = TOK.end_of_turn_id
QUESTION = "Question: 12*7?\nThought:"
THOUGHT = " multiply\nAction: calc 12*7\n"
STOP = "Observation:"


def session_of(tok: Tokenizer, *replies: list[int], **config: Any) -> tuple[ChatSession, Any]:
    engine = ScriptedEngine(replies, stop_ids=[tok.end_of_turn_id])
    config = {"max_new_tokens": 256, **config}
    session = ChatSession(
        "s",
        engine=engine,
        tokenizer=tok,
        config=SessionConfig(sampling=SamplingParams(temperature=0.7), **config),
        clock=lambda: 1_700_000_000.0,
    )
    return session, engine


def complete(session: ChatSession, prompt: Any, **fields: Any) -> TextCompletion:
    body = {"model": "policy", "prompt": prompt, **fields}
    return asyncio.run(session.complete_text(parse_completion_request(json.dumps(body))))


def test_a_text_prompt_is_encoded_as_is_and_its_continuation_joins_the_sample() -> None:
    kept = TOK.encode(THOUGHT + STOP)
    reply = [*kept, *TOK.encode(" 84\nAction: done"), EOT]
    final = [*TOK.encode(" It is 84."), EOT]
    session, engine = session_of(TOK, reply, final)

    first = complete(session, [QUESTION], stop=STOP, max_tokens=64, logprobs=0)
    p0 = TOK.encode(QUESTION)
    assert engine.prompts[0] == p0  # no chat template: no role markers, no turn
    assert first.model_dump()["object"] == "text_completion" and first.id == "cmpl-s-0"
    (choice,) = first.choices
    assert (choice.text, choice.finish_reason) == (THOUGHT, "stop")
    assert first.usage.model_dump() == {
        "prompt_tokens": len(p0),
        "completion_tokens": len(kept),
        "total_tokens": len(p0) + len(kept),
    }
    assert choice.logprobs is not None
    assert "".join(choice.logprobs.tokens) == THOUGHT + STOP
    assert choice.logprobs.token_logprobs == [-0.1] * len(kept)
    assert choice.logprobs.top_logprobs[0] == {choice.logprobs.tokens[0]: -0.1}
    assert choice.logprobs.text_offset[:2] == [len(QUESTION), len(QUESTION) + 1]

    # The client's own loop: what it read, the stop string and the observation after.
    observation = " 84\nThought:"
    following = QUESTION + choice.text + STOP + observation
    assert TOK.encode(following) == p0 + kept + TOK.encode(observation)
    second = complete(session, following)
    assert second.choices[0].text == " It is 84." and second.id == "cmpl-s-1"
    assert session.ledger.prefix_breaks == 0
    traj = session.finish(reward=1.0)
    (sample,) = traj.samples
    assert sample.tokens == TOK.encode(following) + final
    n1 = len(TOK.encode(following))
    model = [i for i, m in enumerate(sample.loss_mask) if m]
    assert model == [*range(len(p0), len(p0) + len(kept)), *range(n1, n1 + len(final))]


def test_chat_and_text_calls_share_one_ledger(chat_tokenizer: Tokenizer) -> None:
    """A text prompt that spells the chat call's tokens out continues them; one that does
    not is a counted prefix break."""
    tok = chat_tokenizer
    hello = [*tok.encode("Hello."), tok.end_of_turn_id]
    session, engine = session_of(tok, hello, [*tok.encode(" Fine."), tok.end_of_turn_id])
    body = {"model": "p", "messages": [{"role": "user", "content": "Hi"}]}
    asyncio.run(session.complete(parse_request(body)))
    history = engine.prompts[0] + hello
    written = tok.decode(history, skip_special=False) + "\nHow are you?"

    complete(session, written)
    assert engine.prompts[1][: len(history)] == history
    assert session.ledger.prefix_breaks == 0 and len(session.ledger.samples) == 1

    complete(session, "Something else entirely.")
    (departure,) = session.ledger.breaks
    assert departure.call == 2 and departure.where == "history"
    assert engine.prompts[2] == tok.encode("Something else entirely.")


def test_openais_default_limit_and_the_clients_sampler() -> None:
    session, engine = session_of(
        TOK, [*TOK.encode("x" * 40), EOT], client_sampling=ClientSampling(max_temperature=1.0)
    )
    answer = complete(session, "Count:")
    assert answer.choices[0].finish_reason == "length"  # 16 tokens, OpenAI's default
    assert answer.choices[0].text == "x" * 16 and answer.choices[0].logprobs is None
    with pytest.raises(ChatCompletionError) as caught:
        complete(session, "Count:", temperature=1.5)
    assert (caught.value.param, caught.value.code) == ("temperature", "unsupported_value")
    assert "rollout.client_sampling" in caught.value.message
    assert len(engine.prompts) == 1  # refused before the engine
    complete(session, "Count:", temperature=0.2, frequency_penalty=0.5, max_tokens=3)
    assert engine.calls[-1]["sampling"] == SamplingParams(temperature=0.2, frequency_penalty=0.5)
    assert len(session.ledger.calls) == 2 and session.ledger.calls[1].sampling is not None


def test_logprobs_list_the_most_likely_tokens_and_the_sampled_one() -> None:
    reply = [*TOK.encode("ab"), EOT]
    session, engine = session_of(TOK, reply)
    answer = complete(session, "Go:", logprobs=2)
    assert engine.calls[0]["top_logprobs"] == 2
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens == ["a", "b"]
    # The fake's alternatives for each token: itself, then id 0 (the engine's order).
    other = TOK.decode([0], skip_special=False)
    assert logprobs.top_logprobs == [{"a": -0.1, other: -1.1}, {"b": -0.1, other: -1.1}]


def test_a_text_prompt_over_the_context_names_the_prompt() -> None:
    session, engine = session_of(TOK, [EOT], max_context=8)
    with pytest.raises(ChatCompletionError) as caught:
        complete(session, "far too long a prompt")
    assert (caught.value.param, caught.value.code) == ("prompt", "context_length_exceeded")
    assert engine.prompts == [] and session.ledger.calls == []
