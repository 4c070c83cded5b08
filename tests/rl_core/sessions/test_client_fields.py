"""What a framework asks of a call reaches the engine, and the trajectory records it.

`ScriptedEngine` keeps each call's sampler, grammars and ``top_logprobs``, and serves
alternatives per token; the session, the grammar and the answer are the real code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from rl_core.errors import RolloutError
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline.build import build_sessions
from rl_core.protocol.chat_completions import (
    ChatCompletion,
    ChatCompletionError,
    parse_request,
    stream_completion,
)
from rl_core.rollout.base import Completion, Grammar, SamplingParams, refuse_unserved
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.grammar import output_grammar
from rl_core.sessions.sampling import ClientSampling
from rl_core.sessions.session import ChatSession, SessionConfig
from rl_core.spec import JobSpec
from tests.rl_core.protocol.test_chat_completions_stream import accumulate

TOK = BuiltinTokenizer()
RUN = SamplingParams(temperature=0.7, top_p=1.0)
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
ADD = {"type": "function", "function": {"name": "add", "strict": True, "parameters": SCHEMA}}
ARGUMENTS = '{"a": 3,  "b":4}'
CALL = f'<tool_call>{{"name": "add", "arguments": {ARGUMENTS}}}</tool_call>'
USER = [{"role": "user", "content": "What is 3 + 4?"}]


def new_session(
    *replies: str, client_sampling: ClientSampling | None = None, engine: Any = None
) -> tuple[ChatSession, ScriptedEngine]:
    scripted = ScriptedEngine(
        [[*TOK.encode(r), TOK.end_of_turn_id] for r in replies], stop_ids=[TOK.end_of_turn_id]
    )
    config = SessionConfig(sampling=RUN, client_sampling=client_sampling or ClientSampling())
    session = ChatSession("s", engine=engine or scripted, tokenizer=TOK, config=config)
    return session, scripted


def ask(session: ChatSession, **fields: Any) -> ChatCompletion:
    body = {"model": "policy", "messages": USER, **fields}
    return asyncio.run(session.complete(parse_request(json.dumps(body))))


def refused(session: ChatSession, **fields: Any) -> ChatCompletionError:
    with pytest.raises(ChatCompletionError) as caught:
        ask(session, **fields)
    return caught.value


def test_a_strict_forced_call_is_sampled_under_its_grammar_and_read_as_sampled() -> None:
    session, engine = new_session(CALL)
    fields = {"tools": [ADD], "tool_choice": "required", "parallel_tool_calls": False}
    answer = ask(session, **fields)

    (call,) = engine.calls
    expected = output_grammar(parse_request({"model": "m", "messages": USER, **fields}))
    assert call["grammars"] == [expected] and isinstance(expected, Grammar)
    assert "%json " + json.dumps(SCHEMA) in expected.lark
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (tool_call,) = choice.message.tool_calls or []
    assert (tool_call.function.name, tool_call.function.arguments) == ("add", ARGUMENTS)

    trajectory = session.finish(reward=1.0)
    assert trajectory.info["constrained"] == 1 and session.ledger.calls[0].constrained
    # The grammar changes the distribution, not what is recorded: the sampled tokens.
    assert trajectory.samples[0].tokens[-len(TOK.encode(CALL)) - 1 :] == [
        *TOK.encode(CALL),
        TOK.end_of_turn_id,
    ]


def test_a_json_answer_is_the_content() -> None:
    session, engine = new_session('{"sum": 7}')
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}}
    answer = ask(session, response_format=fmt)
    assert engine.calls[0]["grammars"] is not None
    assert answer.choices[0].message.content == '{"sum": 7}'
    assert answer.choices[0].finish_reason == "stop"
    ask(session)  # a free call after it: no grammar
    assert engine.calls[1]["grammars"] is None


def test_the_clients_sampler_is_used_and_recorded() -> None:
    session, engine = new_session("Seven.", "7", "7")
    ask(session, temperature=0)  # LangGraph's temperature=0: greedy
    ask(session, temperature=1.2, top_p=0.9, frequency_penalty=0.5, presence_penalty=0.25)
    ask(session)
    used = [call["sampling"] for call in engine.calls]
    assert used == [
        SamplingParams(temperature=0.0, top_p=1.0),
        SamplingParams(temperature=1.2, top_p=0.9, frequency_penalty=0.5, presence_penalty=0.25),
        RUN,
    ]
    trajectory = session.finish(reward=1.0)
    assert trajectory.sampling == {"temperature": 0.7, "top_p": 1.0, "top_k": 0}  # the run's
    assert [c["call"] for c in trajectory.info["call_samplers"]] == [0, 1]
    assert trajectory.info["call_samplers"][1]["frequency_penalty"] == 0.5
    assert session.ledger.calls[2].sampling is None  # the run's own


def test_top_p_zero_is_greedy() -> None:
    session, engine = new_session("7")
    ask(session, top_p=0)
    assert engine.calls[0]["sampling"] == SamplingParams(temperature=0.0, top_p=1.0)


def test_sampling_outside_the_runs_bounds_is_refused_naming_every_field() -> None:
    bounds = ClientSampling(min_temperature=0.3, max_temperature=1.0, max_penalty=1.0)
    session, engine = new_session("7", client_sampling=bounds)
    error = refused(session, temperature=1.5, frequency_penalty=1.5, presence_penalty=0.5)
    assert (error.param, error.code, error.status) == ("temperature", "unsupported_value", 400)
    assert error.message.startswith("This request has 2 problems")
    assert "'frequency_penalty'" in error.message and "presence_penalty" not in error.message
    assert "rollout.client_sampling.max_penalty" in error.message
    assert refused(session, temperature=0).param == "temperature"
    assert engine.calls == [] and session.ledger.calls == []


def test_a_pinned_run_refuses_another_sampler_naming_the_spec_field() -> None:
    session, engine = new_session("7", "7", client_sampling=ClientSampling(mode="pin"))
    error = refused(session, temperature=0, top_p=0.5)
    assert error.param == "temperature" and "'top_p'" in error.message
    assert "rollout.client_sampling.mode" in error.message
    ask(session, temperature=0.7, top_p=1, frequency_penalty=0, top_k=-1)  # the run's own
    assert engine.calls[0]["sampling"] == RUN


def test_top_logprobs_list_the_alternatives_as_openai_does() -> None:
    session, engine = new_session("ab")
    answer = ask(session, logprobs=True, top_logprobs=2)
    assert engine.calls[0]["top_logprobs"] == 2
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    first = logprobs.content[0]
    other = TOK.decode([0], skip_special=False)
    assert [(t.token, t.logprob, t.bytes) for t in first.top_logprobs] == [
        ("a", -0.1, [97]),
        (other, -1.1, list(other.encode())),
    ]
    # Streamed, the finish chunk carries them.
    events = stream_completion(answer)
    finish = json.loads(events[-2].removeprefix("data: "))["choices"][0]
    assert finish["logprobs"]["content"][0]["top_logprobs"][0]["token"] == "a"
    assert accumulate(events)["message"]["content"] == "ab"
    # Without logprobs: true, none are asked of the engine.
    ask(session, top_logprobs=2)
    assert engine.calls[1]["top_logprobs"] == 0


def test_echoed_reasoning_and_names_do_not_change_the_prompt() -> None:
    session, engine = new_session("Seven.", "Done.", "Done.")
    answer = ask(session)
    echo = answer.choices[0].message.echo()
    follow = {"role": "user", "content": "Thanks"}
    ask(session, messages=[*USER, echo, follow])
    decorated = {**echo, "reasoning_content": "I added.", "refusal": None, "annotations": []}
    ask(session, messages=[{**USER[0], "name": "alice"}, decorated, follow])
    assert engine.prompts[2] == engine.prompts[1]


class Unserving:
    """An engine that serves no grammar, alternatives or penalties (as refuse_unserved)."""

    def __init__(self, inner: ScriptedEngine) -> None:
        self.inner = inner

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        refuse_unserved("test", sampling, grammars, top_logprobs)
        return await self.inner.generate(
            prompts, max_new_tokens=max_new_tokens, sampling=sampling, seeds=seeds
        )

    def update_weights(self, params: Any, version: int) -> None:
        raise RolloutError("not here")


def test_what_the_engine_does_not_serve_is_a_400_with_its_reason() -> None:
    scripted = ScriptedEngine([[TOK.end_of_turn_id]], stop_ids=[TOK.end_of_turn_id])
    session, _ = new_session(engine=Unserving(scripted))
    error = refused(session, tools=[ADD], tool_choice="required")
    assert (error.status, error.code) == (400, "unsupported_value")
    assert "the test engine does not serve grammars" in error.message
    ask(session)  # what it serves is served
    assert session.ledger.calls and len(session.ledger.calls) == 1


def test_the_spec_sets_the_bounds_of_a_sessions_run() -> None:
    spec = JobSpec.model_validate(
        {
            "environment": {"name": "sessions"},
            "rollout": {"client_sampling": {"mode": "pin", "max_temperature": 1.0}},
        }
    )
    scripted = ScriptedEngine([[TOK.end_of_turn_id]], stop_ids=[TOK.end_of_turn_id])
    broker = build_sessions(spec, scripted, TOK)
    assert broker.config.client_sampling == ClientSampling(mode="pin", max_temperature=1.0)
    assert (
        JobSpec.model_validate({"environment": {"name": "sessions"}}).rollout.client_sampling.mode
        == "allow"
    )
    with pytest.raises(ValidationError, match="min_temperature"):
        JobSpec.model_validate(
            {
                "environment": {"name": "sessions"},
                "rollout": {"client_sampling": {"min_temperature": 1.5, "max_temperature": 1.0}},
            }
        )
