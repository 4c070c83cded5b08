"""A verifiers environment, unchanged, trains a ``sessions`` run through `sdk.verifiers_driver`.

The environment is verifiers' own ``SingleTurnEnv`` over an in-memory dataset with a
``Rubric``; the run is `rlaas train`'s path (`train_to_folder` with the CLI's gateway)
on the tiny model. The model's output is random, so the rubric scores something every
answer has (its length), and what is checked is that the reward each stored trajectory
trained on is the rubric's score of the text the model wrote in it.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import verifiers as vf
from datasets import Dataset

from rl_core.models.tokenizer import _SPECIALS as SPECIALS
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.pipeline import build
from rl_core.pipeline.runner import train_to_folder
from rl_core.spec import parse_spec
from sdk.cli import _session_gateway
from sdk.errors import RlaasError
from sdk.sessions import SessionGateway
from sdk.verifiers_driver import Played, drive, load
from tests.worker.test_gateway import CALLING
from tests.worker.test_sessions_run import ToolCallingPolicy

GROUP = 2
SPEC = {
    "name": "verifiers-run",
    "model": {"source": "builtin:tiny"},
    "environment": {"name": "sessions"},
    "agent": {"max_new_tokens": 8, "max_context": 96},
    "rollout": {"group_size": GROUP, "concurrency": 4},
    "algorithm": {"batch_groups": 2},
    "staleness": {"mode": "async", "max_staleness": 1},
    "train": {"steps": 2, "seed": 0},
}


def length_score(completion: Any, **kwargs: Any) -> float:
    """The rubric's reward: the answer's length in characters, over 10."""
    return len(completion[-1]["content"] or "") / 10


def say_env() -> Any:
    rows = [{"question": f"Say {n}.", "answer": str(n)} for n in range(3)]
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[length_score], weights=[1.0])
    )


def train_while_driving(spec: Any, out: Path, env: Any) -> list[Played]:
    """Train ``spec`` for its 2 steps while `drive` plays ``env`` against it from a thread."""
    played: list[Played] = []
    errors: list[BaseException] = []

    def driver() -> None:
        try:
            gateway = SessionGateway.from_folder(out, wait_s=300)
            played.extend(asyncio.run(drive(gateway, env, group_size=GROUP, concurrency=4)))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=driver)
    thread.start()
    try:
        result = train_to_folder(spec, out, gateway=_session_gateway(out, "127.0.0.1", 0))
    finally:
        thread.join(120)
    assert not errors, errors[0]
    assert result.steps_completed == 2
    return played


def test_load_takes_module_func_and_refuses_what_is_not_an_environment() -> None:
    assert isinstance(load(f"{__name__}:say_env"), vf.SingleTurnEnv)
    with pytest.raises(RlaasError, match=r"not a vf\.Environment"):
        load(f"{__name__}:GROUP")
    with pytest.raises(RlaasError, match="cannot load nothing"):
        load(f"{__name__}:nothing")


@pytest.mark.timeout(600)
def test_a_verifiers_environment_trains_a_sessions_run(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    out = tmp_path / "run"
    env = say_env()  # verifiers sets signal handlers as an environment is made: main thread
    played = train_while_driving(spec, out, env)
    ended = [p for p in played if p.reward is not None]
    assert len(ended) >= 2 * 2 * GROUP  # two steps of two groups, at least
    # Rollouts still waiting for the model when the run ended are cancelled, none other.
    assert all("cancelled" in (p.error or "") for p in played if p.reward is None)

    rewards = {p.session_id: p.reward for p in ended}
    records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    stored = [r for r in records if r["end_state"] == "done"]
    assert stored
    for record in stored:
        written = "".join(s["text"] for s in record["segments"] if s["trained"])
        # What the client read: the model's text without the tokenizer's special tokens.
        answer = re.sub("|".join(map(re.escape, SPECIALS)), "", written)
        # The reward the trainer got is the rubric's score of what the model wrote.
        assert record["reward"] == pytest.approx(len(answer) / 10), json.dumps(record)
        assert record["reward"] in set(rewards.values())
        assert record["segments"][0]["text"].find("Say ") >= 0  # the dataset's prompt


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def answered_seven(completion: Any, **kwargs: Any) -> float:
    return 1.0 if (completion[-1]["content"] or "").strip() == "7" else 0.25


class GrammarTakingPolicy(ToolCallingPolicy):
    """The tool-calling scripted policy, taking (and recording) the grammars a session
    passes for verifiers' strict tools; its scripted call is one the grammar accepts."""

    def __init__(self, tok: BuiltinTokenizer) -> None:
        super().__init__(tok)
        self.grammars: list[Any] = []

    async def generate(  # type: ignore[override]
        self, prompts: Any, *, grammars: Any = None, top_logprobs: int = 0, **options: Any
    ) -> Any:
        self.grammars.append(grammars)
        return await super().generate(prompts, **options)


@pytest.mark.timeout(600)
def test_a_verifiers_tool_env_plays_its_multi_turn_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A random-init model never writes a tool call: the policy here is scripted (a call
    # to add, then "7" once the tool has spoken); the trainer and gateway are real.
    policy = GrammarTakingPolicy(BuiltinTokenizer())
    monkeypatch.setattr(build, "build_engine", lambda *args, **kwargs: policy)
    rows = [{"question": "What is 3 + 4?", "answer": "7"}]
    env = vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[add],
        rubric=vf.Rubric(funcs=[answered_seven], weights=[1.0]),
        max_turns=3,
    )
    spec = parse_spec({**SPEC, "agent": {"max_new_tokens": 64, "max_context": 1024}})
    out = tmp_path / "run"
    played = train_while_driving(spec, out, env)
    ended = [p for p in played if p.reward is not None]
    assert ended and all(p.reward == 1.0 for p in ended), played[:3]
    # verifiers' tools are strict: the session sampled them under a grammar.
    assert any(g is not None for call in policy.grammars for g in (call or []))
    records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    stored = [r for r in records if r["end_state"] == "done"]
    assert stored
    for record in stored:
        # Two calls: the model's tool call (kept token-exact), the tool's answer, then 7.
        trained = [s["text"] for s in record["segments"] if s["trained"]]
        assert trained[0].startswith(CALLING) and trained[-1].startswith("7")
        assert record["reward"] == 1.0 and record["turns"] == 2
