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
from rl_core.pipeline.runner import train_to_folder
from rl_core.spec import parse_spec
from sdk.cli import _session_gateway
from sdk.errors import RlaasError
from sdk.sessions import SessionGateway
from sdk.verifiers_driver import Played, drive, load

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
    played: list[Played] = []
    errors: list[BaseException] = []
    env = say_env()  # verifiers sets signal handlers as an environment is made: main thread

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
