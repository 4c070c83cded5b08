"""Through sessions, from random init, the tiny model learns the demo game a client plays.

The run is ``examples/tiny-game.yaml`` with ``environment: sessions``: the game is no
longer the worker's; a client plays it. The client is ``examples/guess_number_agent.py``
in a process of its own, as a user's would be: agents written against the official
``openai`` package (not our SDK) at each session's URL, sessions opened and ended with
plain HTTP, every other answer streamed, the game's rules and rewards driven from the
client's side. 128 agents play at once, the 16 sessions of a game under one group name.

The bars are the built-in learning test's (tests/rl_core/pipeline/test_learning.py),
computed from the game, not guessed: the last 10 steps average at least 3x the first
10, at least 0.8 of the optimal policy's expected reward, and more than a uniform
random guess each turn. As there, the game is too small to tell reading the hints
from a blind sweep; what this proves is that the client-driven path trains: a model
that starts by emitting random tokens learns, from calls it never saw but through the
sessions' record of them, to answer with numbers and to stop guessing at random.
The run stops once the bars have held for five steps in a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rl_core.envs.guess_number import GuessNumberConfig
from rl_core.host.control import RunControl
from rl_core.pipeline.runner import train
from rl_core.spec import load_spec
from tests.demo_game_bars import DemoGameBars, StopWhenProven
from worker.gateway import serve_gateway

EXAMPLES = Path(__file__).parents[2] / "examples"
EXAMPLE, AGENT = EXAMPLES / "tiny-game.yaml", EXAMPLES / "guess_number_agent.py"
TOKEN = "the-learning-test-gateway-token"


@pytest.mark.minutes(5)
@pytest.mark.timeout(1500)
def test_the_tiny_model_learns_the_demo_game_played_by_an_openai_client(tmp_path: Path) -> None:
    example = load_spec(EXAMPLE)
    game = GuessNumberConfig.from_mapping(example.environment.config)
    spec = example.model_copy(
        update={
            "name": "tiny-game-sessions",
            "environment": example.environment.model_copy(
                update={"name": "sessions", "config": {}}
            ),
        }
    )

    bars = DemoGameBars(game)
    control = RunControl()

    client_log = tmp_path / "client.log"
    exits: list[int | None] = []

    @contextlib.asynccontextmanager
    async def gateway(broker: Any) -> AsyncIterator[str]:
        async with serve_gateway(broker, token=TOKEN) as url:
            command = [sys.executable, str(AGENT), "--url", url, "--token", TOKEN]
            with client_log.open("wb") as log:
                client = await asyncio.create_subprocess_exec(
                    *command, cwd=EXAMPLES.parent, stdout=log, stderr=subprocess.STDOUT
                )
            try:
                yield url
            finally:
                exits.append(client.returncode)  # None: still playing, as it should be
                client.terminate()
                await asyncio.wait_for(client.wait(), 30)

    files = StopWhenProven(tmp_path, bars, control)
    try:
        result = train(spec, sink=files, control=control, artifacts_dir=tmp_path, gateway=gateway)
    finally:
        files.close()
    assert exits == [None], f"the client stopped early:\n{client_log.read_text()[-3000:]}"

    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows]
    print(bars.report(rewards))
    assert bars.proven_at(rewards) is not None, f"bars not met in {spec.train.steps} steps"
    assert result.steps_completed <= spec.train.steps

    # What was trained came from the sessions, unbroken and within the staleness bound.
    assert sum(r["sessions/prefix_breaks"] for r in rows) == 0
    assert max(r["staleness/max"] for r in rows) <= spec.staleness.max_staleness
    records = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    late = [r for r in records if r["step"] > len(rows) - 10 and r["end_state"] == "done"]
    assert late and all(r["info"]["session_id"] == r["episode_id"] for r in late)
    solved = [r for r in late if r["reward"] >= 0.5]
    # The trained tokens are the model's answers: a solved game's last one holds a number
    # and ends with the token that ended the turn (<|end|> or <eos>), and most lead with a
    # number. Not all are bare: the game counts any answer holding the number and only the
    # format bonus asks for bare ones (a run that met the bars had 16 of 33 bare, "2g").
    last = [[s["text"] for s in r["segments"] if s["trained"]][-1] for r in solved]
    assert solved and all(re.search(r"\d.*(<\|end\|>|<eos>)$", a, re.S) for a in last), last[:20]
    leading = [a for a in last if re.match(r"\d", a)]
    assert len(leading) >= len(solved) / 2, last[:20]
