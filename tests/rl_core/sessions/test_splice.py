"""The model's own tokens spliced back: history that re-encodes to other tokens still extends.

The builtin tokenizer merges ``higher`` into one token; a model that samples it one
character at a time writes the same text in other tokens. Expected ids are written
from the tokenizer's format by hand.
"""

from __future__ import annotations

import asyncio
import json

from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.protocol.chat_completions import parse_request
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.render import splice
from rl_core.sessions.session import ChatSession, SessionConfig

TOK = BuiltinTokenizer()
EOT = TOK.end_of_turn_id
SPELLED = [TOK.encode(c)[0] for c in "higher"]  # six tokens; "higher" encodes to one


def user(text: str) -> list[int]:
    return [TOK.token_id("<|user|>"), *TOK.encode(text), EOT]


ASSISTANT = [TOK.token_id("<|assistant|>")]


def ask(session: ChatSession, messages: list[dict[str, str]]) -> str:
    body = {"model": "p", "messages": messages}
    answer = asyncio.run(session.complete(parse_request(json.dumps(body))))
    return answer.choices[0].message.content or ""


def test_a_reply_sampled_in_other_tokens_is_continued_as_sampled() -> None:
    assert TOK.encode("higher") == [TOK.token_id("higher")]
    engine = ScriptedEngine([[*SPELLED, EOT], [*TOK.encode("7"), EOT]], stop_ids=[EOT])
    session = ChatSession(
        "s", engine=engine, tokenizer=TOK, config=SessionConfig(sampling=SamplingParams())
    )
    messages = [{"role": "user", "content": "3"}]
    reply = ask(session, messages)
    assert reply == "higher"
    ask(
        session,
        [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "5"}],
    )

    p0 = user("3") + ASSISTANT
    assert engine.prompts[1] == p0 + SPELLED + [EOT] + user("5") + ASSISTANT
    assert session.ledger.prefix_breaks == 0 and session.spliced == 1
    traj = session.finish(reward=1.0)
    assert traj.tokens == engine.prompts[1] + TOK.encode("7") + [EOT]
    assert traj.info["spliced"] == 1


def test_an_edited_history_is_not_spliced_and_is_a_break() -> None:
    history = user("3") + ASSISTANT + SPELLED + [EOT]
    edited = user("3") + ASSISTANT + TOK.encode("lower") + [EOT] + user("5") + ASSISTANT
    assert splice(edited, history, TOK) is None
    canonical = user("3") + ASSISTANT + TOK.encode("higher") + [EOT] + user("5") + ASSISTANT
    assert splice(canonical, history, TOK) == history + user("5") + ASSISTANT
    # An answer left out (a retry): the text departs where the answer was.
    retried = user("3") + ASSISTANT + TOK.encode("7") + [EOT]
    assert splice(retried, history, TOK) is None
    # Already an extension: unchanged.
    assert splice(history + user("5"), history, TOK) == history + user("5")


def test_a_special_token_sampled_inside_a_reply_is_continued_as_sampled() -> None:
    """The client never saw it (the answer leaves specials out), so its echo cannot hold it."""
    inner = TOK.token_id("<|user|>")
    sampled = [*TOK.encode("ab"), inner, *TOK.encode("c"), EOT]
    history = user("3") + ASSISTANT + sampled
    echoed = user("3") + ASSISTANT + TOK.encode("abc") + [EOT] + user("5") + ASSISTANT
    mask = [0] * len(user("3") + ASSISTANT) + [1] * len(sampled)
    assert splice(echoed, history, TOK, sampled=mask) == history + user("5") + ASSISTANT
    assert splice(echoed, history, TOK) is None  # read as the model wrote it, it departs


def test_answers_spliced_earlier_stay_as_read_in_later_calls() -> None:
    """A session of three calls whose first answer held a special token and was cut at the
    length limit (no end-of-turn: the template closes the turn)."""
    unk = TOK.unk_id
    engine = ScriptedEngine(
        [[*TOK.encode("4"), unk, *TOK.encode("x")], [*SPELLED, EOT], [*TOK.encode("7"), EOT]],
        stop_ids=[EOT],
    )
    session = ChatSession(
        "s",
        engine=engine,
        tokenizer=TOK,
        config=SessionConfig(sampling=SamplingParams(), max_new_tokens=3),
    )
    messages = [{"role": "user", "content": "3"}]
    for number in ("5", "6"):
        reply = ask(session, messages)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": number}]
    ask(session, messages)
    assert session.ledger.prefix_breaks == 0 and session.spliced == 2
    assert engine.prompts[2][: len(engine.prompts[1])] == engine.prompts[1]


def test_an_answer_that_stopped_at_end_of_sequence_is_closed_by_the_template() -> None:
    history = user("3") + ASSISTANT + TOK.encode("4") + [TOK.eos_id]
    echoed = user("3") + ASSISTANT + TOK.encode("4") + [EOT] + user("5") + ASSISTANT
    mask = [0] * len(user("3") + ASSISTANT) + [1, 1]
    assert splice(echoed, history, TOK, sampled=mask) == history + user("5") + ASSISTANT
